"""Exercises of notebook 02 (arithmetic intensity, the roofline): a one-pass softmax, a ridge point, an intensity."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device, datasheets
from ..studies import roofline
from .checks import Case, CodeCheck, NumberCheck, on_device


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Solution of 02.1: softmax over the last dimension of a contiguous 2-D ``x``, one program a row,
    computed in fp32 and stored in ``x``'s dtype."""
    out = torch.empty_like(x)
    _softmax_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def _softmax_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor]:
    # large scores, each row shifted down by up to 200: exp() overflows fp32 unless the row maximum is
    # subtracted first, and a padding lane that loads 0 instead of -inf outweighs a row that is all negative
    m, n = case.params["shape"]
    scores = 40 * torch.randn(m, n, generator=generator) - 200 * torch.rand(m, 1, generator=generator)
    return (on_device(scores.to(case.dtype)),)


SOFTMAX = CodeCheck(
    "02.1", "softmax_rows(x): the softmax of each row in one Triton program, one read and one write",
    solution=softmax_rows, make_inputs=_softmax_inputs,
    reference=lambda x: torch.softmax(x.detach().cpu().double(), dim=-1),
    cases=[Case(f"{m} x {n}", dtype, {"shape": (m, n)})
           for (m, n) in device.pick(full=[(3, 37), (64, 1000), (129, 4097)], smoke=[(3, 37), (4, 100), (2, 1000)])
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype,),
    hints={"value": "Wrong probabilities. Do masked lanes load -inf (`other=-float('inf')`), so that they add "
                    "exp(-inf) = 0 to the sum? Do you subtract the row maximum before `tl.exp`?",
           "unwritten": "NaN: either rows never written (grid `(x.shape[0],)`), or exp() overflowed to inf: "
                        "subtract the row maximum first; inf / inf is NaN.",
           "dtype": "Store in the input's dtype: `.to(out_ptr.dtype.element_ty)` before `tl.store`."})


def _ridge() -> tuple[float, str]:
    a100 = datasheets.by_name("A100 40GB SXM")
    return a100.ridge_flops_per_byte, (f"datasheet (helpers.datasheets): {a100.tensor_tflops:g} TFLOP/s bf16 tensor "
                                       f"cores / {a100.bandwidth_gbps:,.0f} GB/s = {a100.ridge_flops_per_byte:.1f} "
                                       "FLOP per byte")


RIDGE = NumberCheck("02.2", "the bf16 tensor-core ridge point of the A100 40GB, FLOP per byte",
                    _ridge, tolerance=0.05, relative=True, unit="FLOP/byte")


def _softmax_intensity() -> tuple[float, str]:
    op = next(o for o in roofline.operations() if o["operation"].startswith("softmax"))
    return op["flops_per_byte"], (f"{roofline.SOFTMAX_FLOPS} FLOPs an element (max, subtract, exp, sum, divide) "
                                  "over 2 + 2 bytes (one bf16 read, one bf16 write): roofline.operations()")


SOFTMAX_INTENSITY = NumberCheck("02.3", "the arithmetic intensity of your softmax on bf16 rows, FLOP per byte",
                                _softmax_intensity, tolerance=0.05, relative=True, unit="FLOP/byte")

CHECKS = (SOFTMAX, RIDGE, SOFTMAX_INTENSITY)
