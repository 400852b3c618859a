"""Exercises of notebook 04 (the fused kernel): the vector add grown into bias + GELU, the measured speedup, and a
LayerNorm backward whose weight and bias gradients are summed from partial rows, one per program."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import device, results
from .checks import Case, CodeCheck, NumberCheck, on_device, truncated_bf16_tolerance


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

LN_EPS = 1e-5  # the forward's epsilon: the saved rstd is 1 / sqrt(var + LN_EPS)


@triton.jit
def _layernorm_backward_kernel(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_part_ptr, db_part_ptr,
                               n_rows, n_cols, ROWS_PER_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid * ROWS_PER_PROGRAM
    row_end = tl.minimum(row_start + ROWS_PER_PROGRAM, n_rows)
    for row in range(row_start, row_end):
        offs = row * n_cols + cols
        x = tl.load(x_ptr + offs, mask=col_ok, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=col_ok, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = (x - tl.load(mean_ptr + row)) * rstd
        wdy = w * dy  # 0 in the padding lanes (w and dy load 0 there), so they add nothing to the row sums
        c1 = tl.sum(wdy * xhat, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        tl.store(dx_ptr + offs, (rstd * (wdy - c2 - xhat * c1)).to(dx_ptr.dtype.element_ty), mask=col_ok)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(dw_part_ptr + pid * n_cols + cols, dw_acc, mask=col_ok)
    tl.store(db_part_ptr + pid * n_cols + cols, db_acc, mask=col_ok)


def layernorm_backward(x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor,
                       rows_per_program: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Solution of 04.3: ``(dx, dw, db)`` of ``y = (x - mean) * rstd * w + b`` over the rows of a contiguous (M, N)
    ``x``, given the forward's fp32 row ``mean`` and ``rstd`` (M,) and ``dy``. Each program takes
    ``rows_per_program`` consecutive rows, writes their ``dx`` and one row of fp32 partial sums of ``dw`` and of
    ``db``; the partial rows are added afterwards."""
    m, n = x.shape
    programs = triton.cdiv(m, rows_per_program)
    dx = torch.empty_like(x)
    dw_part = torch.empty(programs, n, dtype=torch.float32, device=x.device)
    db_part = torch.empty(programs, n, dtype=torch.float32, device=x.device)
    _layernorm_backward_kernel[(programs,)](x, w, mean, rstd, dy, dx, dw_part, db_part, m, n,
                                            ROWS_PER_PROGRAM=rows_per_program, BLOCK_N=triton.next_power_of_2(n))
    return dx, dw_part.sum(dim=0).to(w.dtype), db_part.sum(dim=0).to(w.dtype)


def _layernorm_backward_inputs(case: Case, generator: torch.Generator) -> tuple:
    # rows with their own offset and spread (a kernel that skips the mean or rstd is off), a weight far from 1
    m, n, rows_per_program = case.params["shape"]
    x = (3 * torch.randn(m, n, generator=generator) + 4 * torch.randn(m, 1, generator=generator)).to(case.dtype)
    x64 = x.double()
    mean, var = x64.mean(dim=1), x64.var(dim=1, unbiased=False)
    w = torch.randn(n, generator=generator).to(case.dtype)
    dy = torch.randn(m, n, generator=generator).to(case.dtype)
    return (*(on_device(t) for t in (x, w, mean.float(), torch.rsqrt(var + LN_EPS).float(), dy)), rows_per_program)


def _layernorm_backward_reference(x, w, mean, rstd, dy, rows_per_program) -> tuple[torch.Tensor, ...]:
    """dx, dw, db from float64 autograd through ``F.layer_norm`` (its own statistics, from ``x``)."""
    x64, w64 = (t.detach().cpu().double().requires_grad_() for t in (x, w))
    b64 = torch.zeros_like(w64, requires_grad=True)
    F.layer_norm(x64, (x.shape[1],), w64, b64, LN_EPS).backward(dy.detach().cpu().double())
    return x64.grad, w64.grad, b64.grad


LAYERNORM_BACKWARD = CodeCheck(
    "04.3", "layernorm_backward(x, w, mean, rstd, dy, rows_per_program) -> (dx, dw, db): one program per "
            "rows_per_program rows, dw and db summed from one partial row per program",
    solution=layernorm_backward, make_inputs=_layernorm_backward_inputs, reference=_layernorm_backward_reference,
    cases=[Case(f"{m} x {n}, {r} rows a program", dtype, {"shape": (m, n, r)})
           for (m, n, r) in device.pick(full=[(3, 37, 2), (1000, 1000, 8), (4099, 768, 16)],
                                        smoke=[(3, 37, 2), (10, 100, 4), (13, 257, 3)])  # the last program: fewer
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype,) * 3,
    tolerance=truncated_bf16_tolerance,
    hints={"value": "Wrong values (the error is the worst of dx, dw, db). The two row sums of dx are means over "
                    "the n_cols real columns, not BLOCK_N: what must a padding lane add to them? dw and db need "
                    "every row of every program: does each row add into the accumulators (+=), does each program "
                    "store its own partial row (index pid), and does the host add all the partial rows? On the "
                    "CPU, Triton's interpreter computes wrong values in bfloat16 arithmetic: convert each load to "
                    "float32 first.",
           "unwritten": "NaN in the result: rows of dx or partial rows never written (they start as NaN). The "
                        "grid needs enough programs of rows_per_program rows to cover all M rows, the last "
                        "program stops at row M, and every program stores its partial row at index pid.",
           "dtype": "dx in x's dtype (`.to(dx_ptr.dtype.element_ty)` in the store); dw and db in w's dtype: "
                    "sum the fp32 partial rows, then convert."})

CHECKS = (BIAS_GELU, SPEEDUP, LAYERNORM_BACKWARD)
