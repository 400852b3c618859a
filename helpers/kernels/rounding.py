"""Triton helpers that round as PyTorch's kernels round, shared by the nf4 kernels and SwiGLU.

bf16 is rounded by integer arithmetic, so that the interpreter (whose fp32 -> bf16 conversion truncates)
rounds as the GPU does.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernels below)


@triton.jit
def round_to_bf16(v):
    """fp32 -> the nearest bf16 value (ties to even), as fp32: integer arithmetic, so the interpreter
    (whose bf16 conversion truncates) rounds as the GPU does. For finite values."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def silu_mul(g, u):
    """``F.silu(g) * u`` in u's dtype as PyTorch rounds it: silu in fp32, rounded to the dtype, times u,
    rounded (bf16 by integer arithmetic, so the interpreter rounds as the GPU does)."""
    gf = g.to(tl.float32)
    s = gf / (1.0 + tl.exp(-gf))
    if u.dtype == tl.bfloat16:
        out = round_to_bf16(round_to_bf16(s) * u.to(tl.float32))
    elif u.dtype == tl.float16:
        out = s.to(tl.float16).to(tl.float32) * u.to(tl.float32)
    else:
        out = s * u
    return out.to(u.dtype)
