"""``silu(gate) * up``, Llama's MLP activation, for training: forward and backward, one pass each.

PyTorch runs it as two kernels forward (silu, multiply) and about four backward, and keeps
``silu(gate)`` for the backward pass; here the forward reads gate and up once and writes the product,
and the backward reads gate, up and the incoming gradient once and writes both gradients, recomputing
the sigmoid instead of storing it. In fp32 registers; the results have the inputs' dtype.

With s = sigmoid(g): ``y = g s u``; ``dg = dy u s (1 + g (1 - s))``, ``du = dy g s``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernels below)
from . import check_triton_device
from .rounding import silu_mul

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK = 1024


@triton.jit
def _swiglu_fwd_kernel(G, U, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    y = silu_mul(tl.load(G + offs, mask=ok, other=0.0), tl.load(U + offs, mask=ok, other=0.0))
    tl.store(Y + offs, y, mask=ok)


@triton.jit
def _swiglu_bwd_kernel(G, U, DY, DG, DU, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-g))
    tl.store(DG + offs, (dy * u * s * (1.0 + g * (1.0 - s))).to(DG.dtype.element_ty), mask=ok)
    tl.store(DU + offs, (dy * g * s).to(DU.dtype.element_ty), mask=ok)


class SwiGLUFunction(torch.autograd.Function):
    """(gate, up) -> silu(gate) * up, both contiguous, one shape and dtype."""

    @staticmethod
    def forward(ctx, gate, up):
        y = torch.empty_like(gate)
        if gate.numel():
            _swiglu_fwd_kernel[(triton.cdiv(gate.numel(), BLOCK),)](gate, up, y, gate.numel(), BLOCK=BLOCK)
        ctx.save_for_backward(gate, up)
        return y

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dy = dy.contiguous()
        dg, du = torch.empty_like(gate), torch.empty_like(up)
        if gate.numel():
            _swiglu_bwd_kernel[(triton.cdiv(gate.numel(), BLOCK),)](gate, up, dy, dg, du, gate.numel(), BLOCK=BLOCK)
        return dg, du


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` (rounded as PyTorch rounds it), differentiable in both; one shape, dtype and
    device. Non-contiguous inputs are made contiguous."""
    for name, t in (("gate", gate), ("up", up)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have one shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    if gate.dtype != up.dtype or gate.dtype not in DTYPES:
        raise TypeError(f"gate and up must share one dtype of {DTYPES}, got {gate.dtype} and {up.dtype}")
    if gate.device != up.device:
        raise ValueError(f"gate is on {gate.device} but up is on {up.device}; they must be on one device")
    check_triton_device(gate.device, "gate")
    return SwiGLUFunction.apply(gate.contiguous(), up.contiguous())
