"""The intensity dial: read each float32 element once, do ``k`` dependent FMAs on it, write it once.

Per element: 8 bytes moved (4 read, 4 written) and 2k FLOPs, so the arithmetic intensity is k/4
FLOP per byte and one kernel sweeps from memory-bound (k = 0: a copy) to compute-bound (k in the
thousands). Each thread holds several elements, so it runs several independent FMA chains and
hides the FMA latency; ``a`` and ``b`` are run-time scalars, so the compiler cannot fold the chain.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import device as _device  # noqa: F401  (interpreter switch before @triton.jit)


@triton.jit
def intensity_dial_kernel(x_ptr, y_ptr, n_elements, k, a, b, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """y = f^k(x) with f(v) = v * a + b, one fused multiply-add per step."""
    pid = tl.program_id(0)
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n_elements
    v = tl.load(x_ptr + idx, mask=mask, other=0.0)
    for _ in range(k // UNROLL):
        for _ in tl.static_range(UNROLL):
            v = tl.fma(v, a, b)
    for _ in range(k % UNROLL):
        v = tl.fma(v, a, b)
    tl.store(y_ptr + idx, v, mask=mask)


def flops_and_bytes(n_elements: int, k: int) -> tuple[int, int]:
    """FLOPs (an FMA counts 2) and minimum bytes moved by one dial launch over ``n_elements`` floats."""
    return 2 * k * n_elements, 8 * n_elements


def dial(x: torch.Tensor, k: int, a: float = 0.999, b: float = 0.001, out: torch.Tensor | None = None,
         block: int = 2048, num_warps: int = 4, unroll: int = 8) -> torch.Tensor:
    """Apply ``v -> v * a + b`` ``k`` times to every element of the contiguous float32 tensor ``x``."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise ValueError(f"x must be a float32 tensor, got {getattr(x, 'dtype', type(x))}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")
    if x.numel() == 0:
        raise ValueError("x is empty")
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative int, got {k!r}")
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    if unroll < 1:
        raise ValueError(f"unroll must be >= 1, got {unroll}")
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor with x's shape, dtype and device")
    grid = (triton.cdiv(x.numel(), block),)
    intensity_dial_kernel[grid](x, out, x.numel(), k, float(a), float(b), BLOCK=block, UNROLL=unroll,
                                num_warps=num_warps)
    return out


def dial_reference(x: torch.Tensor, k: int, a: float = 0.999, b: float = 0.001) -> torch.Tensor:
    """The dial's result computed in float64 on the CPU."""
    v = x.detach().to("cpu", torch.float64)
    for _ in range(k):
        v = v * a + b
    return v
