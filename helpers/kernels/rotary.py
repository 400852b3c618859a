"""Rotary position embedding of q and k for training: forward and backward, one pass each.

Llama's ``apply_rotary_pos_emb`` computes ``x * cos + rotate_half(x) * sin`` for q and for k, where
``rotate_half`` slices x in two halves, negates one and concatenates them: in PyTorch about five
kernels a tensor forward, more backward, each reading and writing the whole of q or k. Here one
program per (sequence, position) reads that row's cos and sin once and rotates every head of it:
one read and one write of q (and of k), forward and backward alike.

With x = (x1, x2) its two halves and (c1, c2), (s1, s2) those of cos and sin:
``y1 = x1 c1 - x2 s1``, ``y2 = x2 c2 + x1 s2``; backward, the transpose of that map:
``dx1 = dy1 c1 + dy2 s2``, ``dx2 = dy2 c2 - dy1 s1``. Computed in fp32; the result has the dtype
PyTorch's expression gives (q's and cos's promoted).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernel below)
from . import check_triton_device

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rotary_kernel(X, COS, SIN, Y, H, S, stride_xb, stride_xh, stride_xs, stride_yb, stride_yh, stride_ys,
                   stride_cb, stride_cs,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr, BACKWARD: tl.constexpr):
    """Program (b * S + s) rotates the H heads of x[b, :, s] (strides in elements, the last dim contiguous)."""
    pid = tl.program_id(0)
    b = pid // S
    s = pid % S
    d = tl.arange(0, HALF)
    b, s = b.to(tl.int64), s.to(tl.int64)
    cs = b * stride_cb + s * stride_cs
    c1 = tl.load(COS + cs + d).to(tl.float32)[None, :]
    c2 = tl.load(COS + cs + HALF + d).to(tl.float32)[None, :]
    s1 = tl.load(SIN + cs + d).to(tl.float32)[None, :]
    s2 = tl.load(SIN + cs + HALF + d).to(tl.float32)[None, :]
    x_row = X + b * stride_xb + s * stride_xs
    y_row = Y + b * stride_yb + s * stride_ys
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        ok = (h < H)[:, None]
        x = x_row + h.to(tl.int64)[:, None] * stride_xh + d[None, :]
        y = y_row + h.to(tl.int64)[:, None] * stride_yh + d[None, :]
        x1 = tl.load(x, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(x + HALF, mask=ok, other=0.0).to(tl.float32)
        if BACKWARD:
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        tl.store(y, y1.to(Y.dtype.element_ty), mask=ok)
        tl.store(y + HALF, y2.to(Y.dtype.element_ty), mask=ok)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, backward: bool) -> torch.Tensor:
    b, h, s, d = x.shape
    y = torch.empty((b, s, h, d), dtype=dtype, device=x.device).transpose(1, 2)  # transformers' layout of q, k
    if x.numel():
        _rotary_kernel[(b * s,)](x, cos, sin, y, h, s, x.stride(0), x.stride(1), x.stride(2),
                                 y.stride(0), y.stride(1), y.stride(2), cos.stride(0), cos.stride(1),
                                 HALF=d // 2, BLOCK_H=min(triton.next_power_of_2(h), max(1, 4096 // d)),
                                 BACKWARD=backward, num_warps=4)
    return y


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be one of {DTYPES}, got {t.dtype}")
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got strides {t.stride()}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q and k must be (B, H, S, D), got {tuple(q.shape)} and {tuple(k.shape)}")
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"k {tuple(k.shape)} must share q's batch, length and head size {(b, s, d)}")
    if d & (d - 1) or d < 2:
        raise ValueError(f"head size D = {d} must be a power of two (64 and 128 are Llama's)")
    if cos.shape != sin.shape or cos.dim() != 3 or cos.shape[1:] != (s, d) or cos.shape[0] not in (1, b):
        raise ValueError(f"cos and sin must both be (B or 1, S, D) = ({b}, {s}, {d}), got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")
    if cos.stride() != sin.stride() or cos.dtype != sin.dtype:
        raise ValueError("cos and sin must share one dtype and one layout")
    if len({t.device for t in (q, k, cos, sin)}) > 1:
        devices = sorted({str(t.device) for t in (q, k, cos, sin)})
        raise ValueError(f"q, k, cos and sin must be on one device, got {devices}")
    check_triton_device(q.device, "q")


class RotaryFunction(torch.autograd.Function):
    """(q, k, cos, sin) -> rotated (q, k); cos and sin get no gradient (they come from positions)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        cos = cos.expand(q.shape[0], -1, -1) if cos.shape[0] == 1 else cos  # a batch stride of 0
        sin = sin.expand(q.shape[0], -1, -1) if sin.shape[0] == 1 else sin
        ctx.save_for_backward(cos, sin)
        ctx.dtypes = q.dtype, k.dtype
        return (_rotate(q, cos, sin, torch.promote_types(q.dtype, cos.dtype), False),
                _rotate(k, cos, sin, torch.promote_types(k.dtype, cos.dtype), False))

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        grads = [None if g is None else _rotate(g if g.stride(-1) == 1 else g.contiguous(), cos, sin, dtype, True)
                 for g, dtype in zip((dq, dk), ctx.dtypes)]
        return grads[0], grads[1], None, None


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rotary_pos_emb(q, k, cos, sin)`` of transformers' Llama, differentiable in q and k:
    q (B, H, S, D) and k (B, H_kv, S, D), any strides with the last dimension contiguous; cos and sin
    (B or 1, S, D). Returns the rotated q and k in transformers' layout, (B, H, S, D) views of
    (B, S, H, D) storage."""
    _check(q, k, cos, sin)
    return RotaryFunction.apply(q, k, cos, sin)
