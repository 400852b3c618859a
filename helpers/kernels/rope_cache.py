"""Rotary embedding of one decode step's q and k, and the write of k and v into the KV cache, in one kernel.

In PyTorch this is a dozen tiny kernels per layer and token (two table lookups, the half-rotation of
q and of k with its concatenation, multiplies and adds, two cache writes), each moving a few hundred
bytes: at batch 1 their launch and ramp-up, not their bytes, cost the time. One program per
(sequence, head) does all of it: reads that head's q (or k and v) and the step's cos/sin row, writes
the rotated q, or the rotated k and the v into the cache at the step's position, which it reads from
the device (so the kernel can be replayed in a CUDA graph).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernel below)


@triton.jit
def _rope_cache_kernel(Q, K, V, COS, SIN, POS, QOUT, KC, VC, H, HKV, MAX_LEN,
                       HEAD_DIM: tl.constexpr, HALF: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // (H + HKV)
    j = pid % (H + HKV)
    pos = tl.load(POS)
    d = tl.arange(0, HALF)
    row = pos * HEAD_DIM
    cos1, cos2 = tl.load(COS + row + d).to(tl.float32), tl.load(COS + row + HALF + d).to(tl.float32)
    sin1, sin2 = tl.load(SIN + row + d).to(tl.float32), tl.load(SIN + row + HALF + d).to(tl.float32)
    if j < H:  # a query head: rotate into QOUT
        src = Q + (b * H + j) * HEAD_DIM
        dst = QOUT + (b * H + j) * HEAD_DIM
    else:  # a key/value head: rotate k into the cache, copy v beside it
        h = j - H
        src = K + (b * HKV + h) * HEAD_DIM
        dst = KC + ((b * HKV + h) * MAX_LEN + pos) * HEAD_DIM
        v_off = (b * HKV + h) * HEAD_DIM
        c_off = ((b * HKV + h) * MAX_LEN + pos) * HEAD_DIM
        tl.store(VC + c_off + d, tl.load(V + v_off + d))
        tl.store(VC + c_off + HALF + d, tl.load(V + v_off + HALF + d))
    x1 = tl.load(src + d).to(tl.float32)
    x2 = tl.load(src + HALF + d).to(tl.float32)
    out_ty = dst.dtype.element_ty
    tl.store(dst + d, (x1 * cos1 - x2 * sin1).to(out_ty))  # x * cos + rotate_half(x) * sin
    tl.store(dst + HALF + d, (x2 * cos2 + x1 * sin2).to(out_ty))


def rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """One decode step: returns rotated q, (B, H, 1, D), and writes rotated k and v into the caches at ``pos``.

    q: (B, 1, H * D); k, v: (B, 1, H_kv * D), the projections' outputs; cos, sin: (max_len, D) tables;
    pos: a one-element int64 tensor on the device, below max_len (it stays on the device, so it is not
    checked here: the caller keeps it in range, as ``Decoder`` does); k_cache, v_cache: (B, H_kv,
    max_len, D). All contiguous, one dtype for the activations and the caches, one device.
    """
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be (B, H_kv, max_len, D), got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    b, hkv, max_len, d = k_cache.shape
    if d % 2 or d & (d - 1):
        raise ValueError(f"head size D = {d} must be a power of two (64 and 128 are Llama's)")
    if q.dim() != 3 or q.shape[0] != b or q.shape[1] != 1 or q.shape[2] % d:
        raise ValueError(f"q must be (B={b}, 1, H * {d}), got {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if tuple(t.shape) != (b, 1, hkv * d):
            raise ValueError(f"{name} must be (B={b}, 1, H_kv * D = {hkv * d}), got {tuple(t.shape)}")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape != (max_len, d):
        raise ValueError(f"cos and sin must be ({max_len}, {d}) tables, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if pos.numel() != 1 or pos.dtype != torch.long:
        raise ValueError(f"pos must be a one-element int64 tensor, got {pos.dtype} of {pos.numel()} elements")
    tensors = {"q": q, "k": k, "v": v, "cos": cos, "sin": sin, "pos": pos, "k_cache": k_cache, "v_cache": v_cache}
    if len({t.device for t in tensors.values()}) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted({str(t.device) for t in tensors.values()})}")
    if len({q.dtype, k.dtype, v.dtype, k_cache.dtype, v_cache.dtype}) > 1:
        raise TypeError("q, k, v and the caches must share one dtype, got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    h = q.shape[2] // d
    q_out = torch.empty(b, h, 1, d, dtype=q.dtype, device=q.device)
    if b:
        _rope_cache_kernel[(b * (h + hkv),)](q, k, v, cos, sin, pos, q_out, k_cache, v_cache, h, hkv, max_len,
                                              HEAD_DIM=d, HALF=d // 2)
    return q_out
