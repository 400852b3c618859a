"""Attention of one decode step's queries over the KV cache, reading only the positions written so far.

At batch 1 a decode step's attention is a matrix-vector product per head: one query row against the
cache's keys, a softmax, and a weighted sum of its values. ``scaled_dot_product_attention`` with a
mask reads the whole preallocated cache (``max_len`` positions) and hides the masked part; a CUDA
graph fixes its shapes, so it cannot be told how many positions are live. This kernel reads the step's
position from the device and stops there, so a step reads ``pos + 1`` positions of K and V, whatever
``max_len`` is.

Split-K ("flash-decoding"): program ``(b, g, s)`` takes the ``GROUP`` query heads that share key/value
head ``g`` of sequence ``b`` and the ``s``-th of ``SPLITS`` equal slices of the cache, walks its live
positions in blocks of ``BLOCK_T`` with an online softmax (fp32 running maximum, sum and weighted
values), and writes its partial result. The last of a head's slices to finish (a ticket counter,
taken atomically) merges the partials in slice order, so the result does not depend on the order the
slices ran in, and one kernel launch does the whole step. Slices wholly past ``pos`` write an empty
partial.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernels below)

BLOCK_T = 64  # cache positions per loop step for one query head per key/value head (fewer for more)
MAX_SPLITS = 16


@triton.jit
def _merge_slices(PART_O, PART_ML, out, first, rd, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                  SPLITS: tl.constexpr):
    """Merge the SPLITS partial (m, l, acc) of one head group, rows ``first + i * GROUP``, in slice order."""
    m = tl.full([GROUP], float("-inf"), tl.float32)
    for i in tl.static_range(SPLITS):
        m = tl.maximum(m, tl.load(PART_ML + (first + i * GROUP) * 2, cache_modifier=".cg"))
    l = tl.zeros([GROUP], tl.float32)
    acc = tl.zeros([GROUP, HEAD_DIM], tl.float32)
    for i in tl.static_range(SPLITS):
        row = first + i * GROUP
        w = tl.exp(tl.load(PART_ML + row * 2, cache_modifier=".cg") - m)  # an empty slice weighs 0
        l += w * tl.load(PART_ML + row * 2 + 1, cache_modifier=".cg")
        acc += w[:, None] * tl.load(PART_O + row[:, None] * HEAD_DIM + rd[None, :], cache_modifier=".cg")
    tl.store(out, (acc / l[:, None]).to(out.dtype.element_ty))


@triton.jit
def _decode_attention_kernel(Q, KC, VC, POS, PART_O, PART_ML, TICKETS, OUT, HKV, MAX_LEN, SLICE, scale,
                             GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
                             SPLITS: tl.constexpr):
    bg = tl.program_id(0)              # sequence b, key/value head g: bg = b * HKV + g
    s = tl.program_id(1)
    rq = tl.arange(0, GROUP)
    rd = tl.arange(0, HEAD_DIM)
    rt = tl.arange(0, BLOCK_T)
    q = tl.load(Q + (bg * GROUP + rq)[:, None] * HEAD_DIM + rd[None, :]).to(tl.float32) * scale  # [GROUP, D]
    live = tl.load(POS) + 1            # positions 0 ... pos hold keys and values
    start = s * SLICE
    end = tl.minimum(start + SLICE, live)
    cache = (bg * MAX_LEN).to(tl.int64) * HEAD_DIM
    m = tl.full([GROUP], float("-inf"), tl.float32)
    l = tl.zeros([GROUP], tl.float32)
    acc = tl.zeros([GROUP, HEAD_DIM], tl.float32)
    for t0 in range(start, end, BLOCK_T):
        t = t0 + rt
        t_ok = t < end
        offs = cache + t.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :]
        k = tl.load(KC + offs, mask=t_ok[:, None], other=0.0).to(tl.float32)             # [BLOCK_T, D]
        v = tl.load(VC + offs, mask=t_ok[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)                            # [GROUP, BLOCK_T]
        scores = tl.where(t_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = OUT + (bg * GROUP + rq)[:, None] * HEAD_DIM + rd[None, :]
    if SPLITS == 1:  # slice 0 holds position 0, so l > 0
        tl.store(out, (acc / l[:, None]).to(OUT.dtype.element_ty))
    else:
        first = bg * SPLITS * GROUP + rq   # row of partials of slice s: first + s * GROUP
        tl.store(PART_O + (first + s * GROUP)[:, None] * HEAD_DIM + rd[None, :], acc)
        tl.store(PART_ML + (first + s * GROUP) * 2, m)
        tl.store(PART_ML + (first + s * GROUP) * 2 + 1, l)
        tl.debug_barrier()  # every thread's partials are written before the ticket (a release) is taken
        if tl.atomic_add(TICKETS + bg, 1) == SPLITS - 1:  # the last slice of (b, g): merge all, in slice order
            _merge_slices(PART_O, PART_ML, out, first, rd, GROUP, HEAD_DIM, SPLITS)
            tl.store(TICKETS + bg, 0)  # ready for the next call


_TICKETS: dict[torch.device, list[torch.Tensor]] = {}


def _tickets(device: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 counter per (sequence, key/value head), kept between calls: each call leaves its
    counters at zero, so none needs a fill kernel (or a node in a CUDA graph) of its own. A buffer is
    never freed (a captured CUDA graph keeps its address); a wider call gets a new one."""
    buffers = _TICKETS.setdefault(device, [])
    if not buffers or buffers[-1].numel() < n:
        buffers.append(torch.zeros(max(n, 64), dtype=torch.int32, device=device))
    return buffers[-1]


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                     splits: int | None = None) -> torch.Tensor:
    """Causal attention of one step's queries, (B, H, 1, D), over cache positions 0 ... ``pos`` of
    ``k_cache`` and ``v_cache``, (B, H_kv, max_len, D); H a multiple of H_kv (grouped-query attention),
    scaled by 1/sqrt(D), accumulated in fp32; returns (B, H, 1, D) in q's dtype. ``pos``: a one-element
    int64 tensor on the device below max_len (not read on the host: the caller keeps it in range, as
    ``Decoder`` does). ``splits``: at most this many slices of the cache, run by separate programs (default:
    one loop step each, at most ``MAX_SPLITS``). Calls on one device, and replays of CUDA graphs holding
    them, must not overlap in time (one stream, as in a decoder): the slices' ticket counters are shared."""
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be (B, H_kv, max_len, D), got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    b, hkv, max_len, d = k_cache.shape
    if d & (d - 1) or d < 16:
        raise ValueError(f"head size D = {d} must be a power of two >= 16 (64 and 128 are Llama's)")
    if q.dim() != 4 or q.shape[0] != b or q.shape[2] != 1 or q.shape[3] != d or q.shape[1] % max(hkv, 1):
        raise ValueError(f"q must be (B={b}, H, 1, D={d}) with H a multiple of H_kv = {hkv}, got {tuple(q.shape)}")
    group = q.shape[1] // hkv
    if group & (group - 1):
        raise ValueError(f"H / H_kv = {group} query heads per key/value head must be a power of two")
    if pos.numel() != 1 or pos.dtype != torch.long:
        raise ValueError(f"pos must be a one-element int64 tensor, got {pos.dtype} of {pos.numel()} elements")
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "pos": pos}
    if len({t.device for t in tensors.values()}) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted({str(t.device) for t in tensors.values()})}")
    if len({q.dtype, k_cache.dtype, v_cache.dtype}) > 1:
        raise TypeError(f"q and the caches must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    block_t = max(16, BLOCK_T // group)  # the [GROUP, BLOCK_T, D] products stay the same size
    if splits is None:  # H200, 32 heads of 128: one block a slice was fastest (272 to 4112 positions)
        splits = min(MAX_SPLITS, triton.cdiv(max_len, block_t))
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    out = torch.empty_like(q)
    if q.numel() == 0:
        return out
    slice_len = triton.cdiv(triton.cdiv(max_len, splits), block_t) * block_t
    splits = triton.cdiv(max_len, slice_len)  # no slice wholly past max_len
    part_o = torch.empty(b * hkv * splits * group, d, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(b * hkv * splits * group, 2, dtype=torch.float32, device=q.device)
    _decode_attention_kernel[(b * hkv, splits)](q, k_cache, v_cache, pos, part_o, part_ml,
                                                 _tickets(q.device, b * hkv), out, hkv, max_len, slice_len,
                                                 1.0 / math.sqrt(d), GROUP=group, HEAD_DIM=d, BLOCK_T=block_t,
                                                 SPLITS=splits, num_warps=4)
    return out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """Softmax attention of q (B, H, 1, D) over k, v (B, H_kv, L, D) in float64, ``chunk`` requests at a time."""
    group = q.shape[1] // k.shape[1]
    out = []
    for i in range(0, q.shape[0], chunk):
        qc, kc, vc = (t[i:i + chunk].double() for t in (q, k, v))
        kc, vc = kc.repeat_interleave(group, 1), vc.repeat_interleave(group, 1)
        out.append(torch.softmax(qc @ kc.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ vc)
    return torch.cat(out)
