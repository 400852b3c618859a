"""Exercises of notebook 01 (the memory hierarchy): a masked load, the bytes a launch reads, the L2 cliff."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device
from ..studies import memory_hierarchy
from ..kernels.probes import stream
from .checks import Case, CodeCheck, NumberCheck, on_device


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(x.to(tl.float32), axis=0))


def masked_row_sum(x: torch.Tensor) -> torch.Tensor:
    """Solution of 01.1: the float32 sum of each row of a contiguous 2-D ``x``, one program a row."""
    out = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
    _row_sum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def _row_sum_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor]:
    return (on_device(torch.randn(case.params["shape"], generator=generator).to(case.dtype)),)


ROW_SUM = CodeCheck(
    "01.1", "masked_row_sum(x): one Triton program sums one row of a width that is not a power of two",
    solution=masked_row_sum, make_inputs=_row_sum_inputs,
    reference=lambda x: x.detach().cpu().double().sum(dim=1),
    cases=[Case(f"{m} x {n}", dtype, {"shape": (m, n)})
           for (m, n) in device.pick(full=[(3, 37), (64, 1000), (257, 4097)], smoke=[(3, 37), (5, 100), (2, 1000)])
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (torch.float32,),
    tolerance=lambda case: 1e-5,  # the sums are float32 whatever the input's dtype
    hints={"value": "Wrong sums. Is the mask `cols < n_cols` (not <=, not BLOCK)? Does row r start at "
                    "`r * n_cols`? Do masked lanes load 0 (`other=0.0`)? If only the bfloat16 cases fail: convert "
                    "the loaded values with `.to(tl.float32)` before `tl.sum` (the interpreter's bfloat16 "
                    "arithmetic is wrong, and a float32 sum is the accurate one anyway).",
           "unwritten": "NaN in the result: either some rows were never written (launch one program per row, grid "
                        "`(x.shape[0],)`), or an unmasked load read past the tensor, where memory can hold NaN: "
                        "mask every load, with `other=0.0`.",
           "raised": "Read the message above. `tl.arange` needs a power-of-two length (use `BLOCK = "
                     "triton.next_power_of_2(n_cols)` and mask the extra lanes), and `tl.load(..., other=...)` "
                     "needs a `mask=` too."})


def _bytes_read() -> tuple[float, str]:
    n, programs, block, passes = 10_000, 6, 1024, 2
    chunk, n_chunks = stream.plan(n, programs, block)
    total = stream.bytes_read(n, programs, block, passes)
    return float(total), (f"stream.plan({n}, {programs}, {block}) gives {n_chunks} chunks of {chunk} elements "
                          f"(the last one {n - (n_chunks - 1) * chunk}); program p reads chunk p % {n_chunks}, so "
                          f"program {programs - 1} reads chunk 0 a second time; x {passes} passes x 4 bytes = "
                          f"{total:,} bytes (stream.bytes_read)")


BYTES_READ = NumberCheck(
    "01.2", "bytes one stream_sum launch reads: 10,000 float32, programs=6, block=1024, passes=2",
    _bytes_read, tolerance=0.5, relative=False, unit="bytes")


def _l2_cliff() -> tuple[float, str]:
    levels, saved = memory_hierarchy.reference_levels()
    l2, hbm = levels.gbps["L2"], levels.gbps["HBM"]
    return l2 / hbm, (f"results/{saved.path.parent.name}/memory_hierarchy.json ({saved.describe()}): median "
                      f"bandwidth over the L2 window {l2:,.0f} GB/s, over the HBM window {hbm:,.0f} GB/s "
                      f"(memory_hierarchy.level_windows for its {levels.l2_bytes / 2**20:g} MB L2, as the driver "
                      "reports it, as in section 2); ratio L2 / HBM")


L2_CLIFF = NumberCheck(
    "01.3", "how many times faster the L2 plateau was than the HBM plateau on the reference H100",
    _l2_cliff, tolerance=0.25, relative=True, unit="x")

CHECKS = (ROW_SUM, BYTES_READ, L2_CLIFF)
