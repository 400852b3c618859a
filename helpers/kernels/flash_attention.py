"""FlashAttention (forward and backward) in Triton.

Layout as in ``F.scaled_dot_product_attention``: q is (B, H, S_q, D), k and v are (B, H_kv, S_k, D)
with H a multiple of H_kv (grouped-query attention when H_kv < H). D is 64 or 128. fp16 and bf16
(and fp32, for the CPU interpreter) inputs; all arithmetic is fp32 except the matrix products, whose
operands are the input dtype.

Causal masking is aligned to the bottom-right corner, as in FlashAttention-2: query i sees keys
j <= i + S_k - S_q (the convention a decoder with a KV cache needs; it equals SDPA's top-left
convention when S_q == S_k). Causal attention needs S_q <= S_k, so that every query sees a key.

The forward pass never stores the S_q x S_k matrix: each program holds one tile of queries in
registers, streams tiles of K and V through shared memory, and keeps a running max and sum (online
softmax). It saves the log-sum-exp of each row (base 2), from which the backward pass recomputes
the probabilities tile by tile.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..device import INTERPRET
from . import check_triton_device
from .fit import prune_to_fit

LOG2E = 1.4426950408889634
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _configs(configs: list[triton.Config], interpreted: triton.Config) -> list[triton.Config]:
    """Autotune over ``configs`` on a GPU; the interpreter has no timer, so it gets one config."""
    return [interpreted] if INTERPRET else configs


# Forward: tiles of 128 queries let the tensor cores work on 128-row products (Hopper's wgmma with
# 8 warps); the K/V tile and the pipeline depth trade shared memory for latency hiding.
FWD_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
               for bm, bn, w, s in [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2),
                                    (64, 64, 4, 3)]]
BWD_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
               for bm, bn, w, s in [(64, 64, 4, 2), (64, 128, 8, 2), (32, 128, 4, 2), (128, 64, 8, 2)]]
# Fallbacks, for a card on which none of the tuned configs fits its shared memory (a T4's 64 KB a block, at
# D = 128): smaller tiles, fewer stages. Tried only there, so the cards the lists were tuned on keep them.
FWD_FALLBACKS = [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)]
BWD_FALLBACKS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=4, num_stages=1)
                 for bm, bn in [(32, 64), (32, 32)]]
_FWD_CONFIGS = _configs(FWD_CONFIGS, triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}))
_BWD_CONFIGS = _configs(BWD_CONFIGS, triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}))


@triton.jit
def _fwd_tile_loop(acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, lo, hi,
                   SQ, SK, qk_scale, CAUSAL: tl.constexpr, MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stream K/V tiles [lo, hi) past one query tile; MASKED tiles apply the bounds and causal masks."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASKED:
            k = tl.load(k_ptrs + start_n * stride_kn, mask=cols[None, :] < SK, other=0.0)
        else:
            k = tl.load(k_ptrs + start_n * stride_kn)
        s = tl.dot(q, k) * qk_scale
        if MASKED:
            keep = cols[None, :] < SK
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + (SK - SQ))
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs + start_n * stride_vn, mask=cols[:, None] < SK, other=0.0)
        else:
            v = tl.load(v_ptrs + start_n * stride_vn)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.autotune(configs=_FWD_CONFIGS, key=["SQ_BUCKET", "SK_BUCKET", "HEAD_DIM", "CAUSAL"])
@triton.jit
def _fwd_kernel(Q, K, V, O, LSE,
                stride_qb, stride_qh, stride_qm, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                stride_ob, stride_oh, stride_om, stride_od,
                H, GROUP, SQ, SK, qk_scale, SQ_BUCKET, SK_BUCKET,
                CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B*H*S*D may pass 2**31
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    k_ptrs = K + b * stride_kb + hk * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    q = tl.load(q_ptrs, mask=offs_m[:, None] < SQ, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # Keys every row of this tile may see need no mask; the rest (the causal diagonal, the ragged
    # end of K) go through the masked loop.
    if CAUSAL:
        hi = tl.minimum(SK, (start_m + 1) * BLOCK_M + SK - SQ)
        full = tl.minimum(SK, start_m * BLOCK_M + SK - SQ + 1)
    else:
        hi = SK
        full = SK
    full = (full // BLOCK_N) * BLOCK_N
    acc, m_i, l_i = _fwd_tile_loop(acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                                   0, full, SQ, SK, qk_scale, CAUSAL, False, BLOCK_N)
    acc, m_i, l_i = _fwd_tile_loop(acc, m_i, l_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                                   full, hi, SQ, SK, qk_scale, CAUSAL, True, BLOCK_N)
    acc = acc / l_i[:, None]
    row_ok = offs_m < SQ
    tl.store(LSE + bh * SQ + offs_m, m_i + tl.math.log2(l_i), mask=row_ok)
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _bwd_delta_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_om, stride_od,
                      stride_db, stride_dh, stride_dm, stride_dd, H, SQ,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta_i = sum_d dO_id * O_id: the row term of the softmax gradient."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B*H*S*D may pass 2**31
    b = bh // H
    h = bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < SQ
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=rows, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                 mask=rows, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * SQ + offs_m, tl.sum(o * do, 1), mask=offs_m < SQ)


@triton.autotune(configs=_BWD_CONFIGS, key=["SQ_BUCKET", "SK_BUCKET", "HEAD_DIM", "CAUSAL"])
@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                     stride_qb, stride_qh, stride_qm, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_db, stride_dh, stride_dm, stride_dd,
                     H, HKV, GROUP, SQ, SK, qk_scale, sm_scale, SQ_BUCKET, SK_BUCKET,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One tile of keys of one K/V head: dK and dV summed over every query tile and every query head
    of its group (no atomics, so the result is deterministic)."""
    start_n = tl.program_id(0)
    bhk = tl.program_id(1).to(tl.int64)
    b = bhk // HKV
    hk = bhk % HKV
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < SK
    k = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=col_ok[:, None], other=0.0)
    v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    # Causal: queries before start_n * BLOCK_N - (SK - SQ) see none of these keys.
    lo = 0
    if CAUSAL:
        lo = tl.maximum(0, start_n * BLOCK_N - (SK - SQ))
        lo = (lo // BLOCK_M) * BLOCK_M
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_db + h * stride_dh
        for start_m in range(lo, SQ, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < SQ
            qT = tl.load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd,
                         mask=row_ok[None, :], other=0.0)
            lse = tl.load(LSE + bh * SQ + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + bh * SQ + offs_m, mask=row_ok, other=0.0)
            pT = tl.math.exp2(tl.dot(k, qT) * qk_scale - lse[None, :])
            keep = row_ok[None, :] & col_ok[:, None]
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :] + (SK - SQ))
            pT = tl.where(keep, pT, 0.0)
            do = tl.load(do_base + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                         mask=row_ok[:, None], other=0.0)
            dv += tl.dot(pT.to(do.dtype), do)
            dpT = tl.dot(v, tl.trans(do))
            dsT = pT * (dpT - delta[None, :])
            dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT))
    dk *= sm_scale
    out = offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    tl.store(DK + b * stride_kb + hk * stride_kh + out, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    out = offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    tl.store(DV + b * stride_vb + hk * stride_vh + out, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.autotune(configs=_BWD_CONFIGS, key=["SQ_BUCKET", "SK_BUCKET", "HEAD_DIM", "CAUSAL"])
@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_db, stride_dh, stride_dm, stride_dd,
                   H, GROUP, SQ, SK, qk_scale, sm_scale, SQ_BUCKET, SK_BUCKET,
                   CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One tile of queries: dQ over every key tile it attends to."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B*H*S*D may pass 2**31
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < SQ
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                 mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + bh * SQ + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * SQ + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    hi = SK
    if CAUSAL:
        hi = tl.minimum(SK, (start_m + 1) * BLOCK_M + SK - SQ)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        col_ok = offs_n < SK
        kT = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd, mask=col_ok[None, :],
                     other=0.0)
        vT = tl.load(v_base + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd, mask=col_ok[None, :],
                     other=0.0)
        p = tl.math.exp2(tl.dot(q, kT) * qk_scale - lse[:, None])
        keep = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + (SK - SQ))
        p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vT)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kT.dtype), tl.trans(kT))
    dq *= sm_scale
    tl.store(DQ + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


prune_to_fit(_fwd_kernel, "flash_attention forward", FWD_FALLBACKS)
prune_to_fit(_bwd_dkdv_kernel, "flash_attention backward (dK, dV)", BWD_FALLBACKS)
prune_to_fit(_bwd_dq_kernel, "flash_attention backward (dQ)", BWD_FALLBACKS)


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    check_triton_device(q.device, "q, k, v")
    if q.device.type == "cuda" and q.dtype == torch.float32:
        raise TypeError("float32 attention is for the CPU interpreter; on the GPU use float16 or bfloat16")
    (b, h, sq, d), (bk, hkv, sk, dk) = q.shape, k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if bk != b:
        raise ValueError(f"batch sizes differ: q has {b}, k/v have {bk}")
    if dk != d:
        raise ValueError(f"head_dim differs: q has {d}, k/v have {dk}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported; supported: {SUPPORTED_HEAD_DIMS}")
    if hkv == 0 or h % hkv:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({hkv})")
    if causal and sq > sk:
        raise ValueError(f"causal attention needs S_q <= S_k (got {sq} > {sk}): the first queries would see no key")
    if sk == 0 and sq > 0:
        raise ValueError("k and v have no keys (S_k == 0): softmax over nothing is undefined")


def tuning_bucket(length: int) -> int:
    """The sequence length the autotuner keys on: the next power of two, so that a training run whose
    batches are padded to ever new widths tunes once per bucket, not once per width."""
    return triton.next_power_of_2(length)


def _buckets(sq: int, sk: int) -> tuple[int, int]:
    return tuning_bucket(sq), tuning_bucket(sk)


def _stride4(t: torch.Tensor) -> tuple[int, int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


class FlashAttentionFunction(torch.autograd.Function):
    """autograd wrapper: forward saves q, k, v, o and the row log-sum-exp; backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float):
        b, h, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        o = torch.empty_like(q)
        lse = torch.empty((b, h, sq), device=q.device, dtype=torch.float32)
        if o.numel():
            grid = lambda meta: (triton.cdiv(sq, meta["BLOCK_M"]), b * h)  # noqa: E731
            _fwd_kernel[grid](q, k, v, o, lse, *_stride4(q), *_stride4(k), *_stride4(v), *_stride4(o),
                              h, h // hkv, sq, sk, scale * LOG2E, *_buckets(sq, sk), CAUSAL=causal, HEAD_DIM=d)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        b, h, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        do = do if do.stride(-1) == 1 else do.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if q.numel() == 0 or k.numel() == 0:
            return dq.zero_(), dk.zero_(), dv.zero_(), None, None
        delta = torch.empty_like(lse)
        _bwd_delta_kernel[(triton.cdiv(sq, 64), b * h)](o, do, delta, *_stride4(o), *_stride4(do), h, sq,
                                                       HEAD_DIM=d, BLOCK_M=64)
        common = dict(CAUSAL=ctx.causal, HEAD_DIM=d)
        scales = (ctx.scale * LOG2E, ctx.scale)
        _bwd_dkdv_kernel[lambda meta: (triton.cdiv(sk, meta["BLOCK_N"]), b * hkv)](
            q, k, v, do, lse, delta, dk, dv, *_stride4(q), *_stride4(k), *_stride4(v), *_stride4(do),
            h, hkv, h // hkv, sq, sk, *scales, *_buckets(sq, sk), **common)
        _bwd_dq_kernel[lambda meta: (triton.cdiv(sq, meta["BLOCK_M"]), b * h)](
            q, k, v, do, lse, delta, dq, *_stride4(q), *_stride4(k), *_stride4(v), *_stride4(do),
            h, h // hkv, sq, sk, *scales, *_buckets(sq, sk), **common)
        return dq, dk, dv, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v without materialising the attention matrix.

    q: (B, H, S_q, D); k, v: (B, H_kv, S_k, D), H % H_kv == 0; D in (64, 128); scale defaults to
    1/sqrt(D). Differentiable in q, k and v.
    """
    _check_inputs(q, k, v, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v = (t if is_dense(t) else t.contiguous() for t in (q, k, v))
    return FlashAttentionFunction.apply(q, k, v, bool(causal), scale)


def is_dense(t: torch.Tensor) -> bool:
    """True if ``t`` fills its storage without gaps or overlaps (any order of dimensions), so that
    ``torch.empty_like(t)`` has ``t``'s strides: the backward writes dQ, dK, dV with those strides.
    A slice of a packed QKV tensor is not dense."""
    expected = 1
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        scale: float | None = None) -> torch.Tensor:
    """Standard attention, materialising the S_q x S_k matrix (the naive baseline and the reference).

    Same conventions as :func:`flash_attention` (GQA by repeating K/V heads, bottom-right causal mask);
    computes in the inputs' dtype, so pass float64 tensors for a reference.
    """
    _check_inputs_shapes_only(q, k, v, causal)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q * scale) @ k.transpose(-1, -2)  # scale the S x D queries, not the S x S scores
    if causal:  # in place: standard attention's three passes over the scores, not four
        sq, sk = q.shape[-2], k.shape[-2]
        hidden = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu_(diagonal=sk - sq + 1)
        s.masked_fill_(hidden, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _check_inputs_shapes_only(q, k, v, causal) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit (B, H, S, D)")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError("causal attention needs S_q <= S_k")
