"""The fused ``LayerNorm(GELU(x + bias)) * weight + ln_bias`` forward built up one change at a time (notebook 04's
ladder), before the tuned kernel of :mod:`helpers.kernels.fused_bias_gelu_layernorm`.

- :func:`simple_forward`, rung 1: :func:`simple_kernel`, one row per program, exact GELU through the library
  ``tl.erf``, the row's statistics in fp32. With ``gelu="auto"`` (rung 2) the same kernel computes GELU in the
  tuned kernel's cheaper exact form (``erf_fp32`` for fp32 storage, ``erf_exp2`` for 16-bit storage).
- :func:`rows_forward`, rung 3: :func:`rows_kernel`, several rows per program (a ``[ROWS, BLOCK_N]`` tile).

Both hold a whole row in one block, so rows are at most ``MAX_N`` wide; the tuned kernel walks wider rows in
chunks. They write ``y`` only (no statistics for a backward).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernels below)
from .. import fused_bias_gelu_layernorm as _tuned
from ..gelu import FAST_ASM, GELU_ERF, gelu, gelu_mode
from ..rowwise import MAX_BLOCK_FWD

MAX_N = MAX_BLOCK_FWD  # widest row one block holds (as in the tuned kernel)
_FAST = tl.constexpr(FAST_ASM)  # the tuned kernel's single-instruction exp2 / reciprocal on a GPU


@triton.jit
def simple_kernel(X, B, W, LB, Y, N, eps, BLOCK_N: tl.constexpr, GELU: tl.constexpr):
    """Row ``tl.program_id(0)`` of y = LayerNorm(GELU(x + bias)) * weight + ln_bias, computed in fp32."""
    row = tl.program_id(0)                        # one program per row
    cols = tl.arange(0, BLOCK_N)                  # BLOCK_N >= N: the whole row in one block
    mask = cols < N                               # lanes past the end of the row do nothing
    offs = row.to(tl.int64) * N + cols            # int64: M * N may pass 2**31
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    lb = tl.load(LB + cols, mask=mask, other=0.0).to(tl.float32)
    v = x + b
    if GELU == GELU_ERF:  # exact GELU, v * Phi(v), with the library erf
        g = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    else:                 # rung 2: the same function in fewer instructions (the tuned kernel's forms)
        g = gelu(v, GELU, _FAST)
    mean = tl.sum(g, axis=0) / N                  # masked lanes hold GELU(0) = 0
    d = tl.where(mask, g - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=0) / N + eps)
    y = d * rstd * w + lb
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def rows_kernel(X, B, W, LB, Y, M, N, eps, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, GELU: tl.constexpr):
    """The same for ROWS rows per program: a [ROWS, BLOCK_N] tile, the row sums along axis 1."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows < M)[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    lb = tl.load(LB + cols, mask=col_ok, other=0.0).to(tl.float32)
    g = gelu(x + b[None, :], GELU, _FAST)
    mean = tl.sum(g, axis=1) / N
    d = tl.where(mask, g - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=1) / N + eps)
    y = d * rstd[:, None] * w[None, :] + lb[None, :]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor, ln_bias: torch.Tensor, eps: float,
           num_warps: int) -> tuple[int, int]:
    """(rows, N) of valid inputs; a clear error for anything the kernels cannot take."""
    for name, t in (("weight", weight), ("ln_bias", ln_bias)):
        if t is None:
            raise TypeError(f"{name} must be a tensor of shape (N,); the ladder's kernels always apply the affine "
                            "LayerNorm (the tuned kernel makes it optional)")
    n = _tuned._check(x, bias, weight, ln_bias)  # type, dtype, contiguity, device, shapes
    if n > MAX_N:
        raise ValueError(f"N = {n} is wider than one block holds (N <= {MAX_N}); the tuned kernel "
                         "(fused_bias_gelu_layernorm) walks wider rows in chunks")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if num_warps < 1 or num_warps & (num_warps - 1):
        raise ValueError(f"num_warps must be a power of two, got {num_warps}")
    return x.numel() // max(n, 1), n


def _gelu_mode(gelu: str, dtype: torch.dtype) -> int:
    if gelu not in ("erf", "auto"):
        raise ValueError(f"gelu must be 'erf' (the library erf) or 'auto' (the tuned kernel's form), got {gelu!r}")
    return gelu_mode(gelu, dtype)


def simple_forward(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor, ln_bias: torch.Tensor,
                   eps: float = 1e-5, gelu: str = "erf", num_warps: int = 4) -> torch.Tensor:
    """Rungs 1 and 2: :func:`simple_kernel` over ``x`` (``(..., N)``, contiguous, fp32/fp16/bf16, N <= MAX_N),
    one program per row. ``gelu="erf"``: the library erf; ``"auto"``: the tuned kernel's exact form."""
    m, n = _check(x, bias, weight, ln_bias, eps, num_warps)
    mode = _gelu_mode(gelu, x.dtype)
    y = torch.empty_like(x)
    if m:
        simple_kernel[(m,)](x, bias, weight, ln_bias, y, n, eps, BLOCK_N=triton.next_power_of_2(n), GELU=mode,
                            num_warps=num_warps)
    return y


def rows_forward(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor, ln_bias: torch.Tensor,
                 eps: float = 1e-5, gelu: str = "auto", rows: int = 2, num_warps: int = 4) -> torch.Tensor:
    """Rung 3: :func:`rows_kernel`, ``rows`` rows per program (a power of two); inputs as :func:`simple_forward`."""
    m, n = _check(x, bias, weight, ln_bias, eps, num_warps)
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"rows must be a power of two, got {rows}")
    mode = _gelu_mode(gelu, x.dtype)
    y = torch.empty_like(x)
    if m:
        rows_kernel[(triton.cdiv(m, rows),)](x, bias, weight, ln_bias, y, m, n, eps,
                                             BLOCK_N=triton.next_power_of_2(n), ROWS=rows, GELU=mode,
                                             num_warps=num_warps)
    return y
