"""Exercises of notebook 04 (the fused kernel): the vector add grown into bias + GELU, and the measured speedup."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import device, results
from .checks import Case, CodeCheck, NumberCheck, on_device


@triton.jit
def _bias_gelu_kernel(x_ptr, bias_ptr, out_ptr, n_elements, n_cols, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    v = tl.load(x_ptr + offsets, mask=mask).to(tl.float32) + tl.load(bias_ptr + offsets % n_cols, mask=mask)
    y = 0.5 * v * (1 + tl.erf(v * 0.7071067811865476))
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Solution of 04.1: ``GELU(x + bias)`` (exact, erf form) for a contiguous (M, N) ``x`` and an (N,)
    ``bias``; the vector add's flat blocks, with the bias element of column ``offset % N``."""
    out = torch.empty_like(x)
    _bias_gelu_kernel[(triton.cdiv(x.numel(), block),)](x, bias, out, x.numel(), x.shape[1], BLOCK=block)
    return out


def _bias_gelu_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = case.params["shape"]
    return (on_device(torch.randn(m, n, generator=generator).to(case.dtype)),
            on_device(torch.randn(n, generator=generator).to(case.dtype)))


BIAS_GELU = CodeCheck(
    "04.1", "bias_gelu(x, bias): GELU(x + bias) in one Triton kernel grown from the vector add",
    solution=bias_gelu, make_inputs=_bias_gelu_inputs,
    reference=lambda x, b: F.gelu(x.detach().cpu().double() + b.detach().cpu().double()),
    cases=[Case(f"{m} x {n}", dtype, {"shape": (m, n)})
           for (m, n) in device.pick(full=[(3, 37), (1000, 1000), (4099, 768)],
                                     smoke=[(3, 37), (5, 100), (67, 129)])  # 8,643 elements: several programs
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype,),
    hints={"value": "Wrong values. The bias has one element per column: column = offset % N (not offset // N). "
                    "GELU here is the exact one, 0.5 * v * (1 + erf(v / sqrt(2))), applied to x + bias.",
           "unwritten": "NaN in the result: either outputs never written (the grid must cover M * N elements, "
                        "`triton.cdiv(x.numel(), BLOCK)` programs, with the mask `offsets < x.numel()`), or a "
                        "load past the end of bias (index it by column, `offsets % n_cols`, not by `offsets`).",
           "dtype": "Return x's dtype: compute in fp32, then `.to(out_ptr.dtype.element_ty)` in the store."})


def _speedup() -> tuple[float, str]:
    saved = results.reference("fused_bias_gelu_layernorm")
    rows = {r["impl"]: r for r in saved.where(**{"pass": "fwd"}, dtype="bf16", M=16384, N=4096, timing="events")}
    eager, fused = rows["eager"], rows["triton"]
    return eager["ms"] / fused["ms"], (
        f"results/{saved.path.parent.name}/fused_bias_gelu_layernorm.json ({saved.describe()}), bf16 16384 x 4096 "
        "forward: eager "
        f"{eager['ms']:.3f} ms, fused Triton {fused['ms']:.3f} ms. The bytes alone predict about 3x; the rest is "
        "that the eager kernels run well below the copy ceiling while the fused one runs near it")


SPEEDUP = NumberCheck("04.2", "the measured forward speedup of the fused kernel over eager PyTorch on the "
                      "reference H100 (bf16, 16384 x 4096)", _speedup, tolerance=0.25, relative=True, unit="x")

CHECKS = (BIAS_GELU, SPEEDUP)
