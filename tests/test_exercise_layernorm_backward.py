"""Exercise 04.3, the LayerNorm backward with partial sums per program: its check fails the kernels a learner
plausibly writes wrong (each a real Triton kernel, one switch away from the solution), its cases hold what the
task claims, the notebook's cells run alone after a restart, and the skeleton filled in as the task asks passes."""
import time

import pytest
import torch

import helpers  # noqa: F401  (before triton: switches it to the interpreter without a GPU)
import triton
import triton.language as tl
from helpers.exercises import CHECKS, ex04
from helpers.results import REPO_ROOT
from exercise_cells import checked, run_exercise, shared_bytes_on_sm90

NOTEBOOK = REPO_ROOT / "notebooks" / "04_fused_kernel_in_triton.ipynb"
CHECK = CHECKS["04.3"]


@triton.jit
def _switched_kernel(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_part_ptr, db_part_ptr, n_rows, n_cols,
                     ROWS_PER_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr, MEANS_OVER_N: tl.constexpr,
                     ACCUMULATE: tl.constexpr, LAST_ROW: tl.constexpr, OWN_PARTIAL_ROW: tl.constexpr,
                     BOTH_SUMS: tl.constexpr):
    """The solution's kernel with each part behind a switch (all on: the solution)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid * ROWS_PER_PROGRAM
    row_end = tl.minimum(row_start + ROWS_PER_PROGRAM, n_rows)
    if not LAST_ROW:  # the last program stops one row early (n_rows - 1 taken for the last row's index)
        row_end = tl.minimum(row_start + ROWS_PER_PROGRAM, n_rows - 1)
    width = n_cols
    if not MEANS_OVER_N:  # the means taken over the padded block
        width = BLOCK_N
    for row in range(row_start, row_end):
        offs = row * n_cols + cols
        x = tl.load(x_ptr + offs, mask=col_ok, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=col_ok, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = (x - tl.load(mean_ptr + row)) * rstd
        wdy = w * dy
        c1 = tl.sum(wdy * xhat, axis=0) / width
        if not BOTH_SUMS:  # the xhat term left out: dx as if the variance did not depend on x
            c1 = 0.0
        c2 = tl.sum(wdy, axis=0) / width
        tl.store(dx_ptr + offs, (rstd * (wdy - c2 - xhat * c1)).to(dx_ptr.dtype.element_ty), mask=col_ok)
        if ACCUMULATE:
            dw_acc += dy * xhat
            db_acc += dy
        else:  # each row overwrites the accumulators: a program keeps only its last row's share
            dw_acc = dy * xhat
            db_acc = dy
    part = pid
    if not OWN_PARTIAL_ROW:  # every program writes row 0 of the partial buffers
        part = 0
    tl.store(dw_part_ptr + part * n_cols + cols, dw_acc, mask=col_ok)
    tl.store(db_part_ptr + part * n_cols + cols, db_acc, mask=col_ok)


def switched(grid_of_one=False, first_partial_only=False, **switches):
    """``layernorm_backward`` with some switches off (a planted bug), launched as a grid of one program, or with
    the host taking the first partial row for the sum."""
    flags = {"MEANS_OVER_N": True, "ACCUMULATE": True, "LAST_ROW": True, "OWN_PARTIAL_ROW": True,
             "BOTH_SUMS": True, **switches}

    def answer(x, w, mean, rstd, dy, rows_per_program):
        m, n = x.shape
        programs = triton.cdiv(m, rows_per_program)
        dx = torch.empty_like(x)
        dw_part = torch.empty(programs, n, dtype=torch.float32, device=x.device)
        db_part = torch.empty(programs, n, dtype=torch.float32, device=x.device)
        _switched_kernel[(1 if grid_of_one else programs,)](
            x, w, mean, rstd, dy, dx, dw_part, db_part, m, n, ROWS_PER_PROGRAM=rows_per_program,
            BLOCK_N=triton.next_power_of_2(n), **flags)
        if first_partial_only:
            return dx, dw_part[0].to(w.dtype), db_part[0].to(w.dtype)
        return dx, dw_part.sum(dim=0).to(w.dtype), db_part.sum(dim=0).to(w.dtype)
    return answer


def test_the_switched_kernel_with_every_switch_on_passes():
    """So that each planted failure below comes from its one switch."""
    passed, out = checked(CHECK, switched())
    assert passed, out


@pytest.mark.parametrize("planted, kind", [
    (switched(MEANS_OVER_N=False), "value"),
    (switched(BOTH_SUMS=False), "value"),
    (switched(ACCUMULATE=False), "value"),
    (switched(LAST_ROW=False), "unwritten"),  # the last row's dx stays NaN
    (switched(OWN_PARTIAL_ROW=False), "unwritten"),  # the other partial rows stay NaN
    (switched(grid_of_one=True), "unwritten"),
    (switched(first_partial_only=True), "value"),
], ids=["means over BLOCK_N", "one row sum", "accumulators overwritten", "last row skipped",
        "partials all in row 0", "grid of one program", "host sums one partial row"])
def test_check_fails_a_planted_kernel(planted, kind):
    passed, out = checked(CHECK, planted)
    assert not passed and f"- {kind}: " in out, out


def test_cases_hold_what_the_task_claims():
    shapes = [case.params["shape"] for case in CHECK.cases]
    for m, n, rows_per_program in shapes:
        assert n & (n - 1), f"N={n} is a power of two: the padding lanes would never matter"
        assert triton.cdiv(m, rows_per_program) >= 2, "one program: the partial rows would never be summed"
        assert m % rows_per_program, "M a multiple of rows_per_program: the last program would be full"
    assert {case.dtype for case in CHECK.cases} == {torch.float32, torch.bfloat16}


def test_reference_is_the_gradient_of_layer_norm_with_these_statistics():
    """The reference (autograd, its own statistics) agrees with the task's formulas on the inputs' mean and rstd."""
    x, w, mean, rstd, dy, _ = CHECK.make_inputs(CHECK.cases[-1], torch.Generator().manual_seed(0))
    x, w, mean, rstd, dy = (t.cpu().double() for t in (x, w, mean, rstd, dy))
    xhat = (x - mean[:, None]) * rstd[:, None]
    wdy = w * dy
    dx = rstd[:, None] * (wdy - wdy.mean(1, keepdim=True) - xhat * (wdy * xhat).mean(1, keepdim=True))
    for got, want in zip(CHECK.reference(x, w, mean, rstd, dy, 3), (dx, (dy * xhat).sum(0), dy.sum(0))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # mean and rstd are the inputs' in fp32


def test_check_is_quick_on_this_machine(capsys):
    start = time.perf_counter()
    assert CHECK.check(CHECK.solution).passed
    assert time.perf_counter() - start < 30, capsys.readouterr().out


def test_solution_is_the_modules_function():
    assert CHECK.solution is ex04.layernorm_backward


def test_solution_compiles_for_the_gpu():
    """The readable kernel (a row loop with a run-time end) through Triton's compiler for sm_90, on this CPU."""
    args = ("dict(x_ptr=b, w_ptr=b, mean_ptr=f, rstd_ptr=f, dy_ptr=b, dx_ptr=b, dw_part_ptr=f, db_part_ptr=f, "
            "n_rows=4099, n_cols=768, ROWS_PER_PROGRAM=16, BLOCK_N=1024)")
    assert shared_bytes_on_sm90("ex04._layernorm_backward_kernel", args) >= 0


FILLED = {  # what a learner writes for each TODO of the skeleton, as the task and the comments ask
    "row_end = ...": "row_end = tl.minimum(row_start + ROWS_PER_PROGRAM, n_rows)",
    "# TODO: load": "x = tl.load(x_ptr + offs, mask=col_ok, other=0.0).to(tl.float32); "
                    "dy = tl.load(dy_ptr + offs, mask=col_ok, other=0.0).to(tl.float32); "
                    "mean = tl.load(mean_ptr + row); rstd = tl.load(rstd_ptr + row)",
    "# TODO: xhat": "xhat = (x - mean) * rstd",
    "# TODO: dx": "wdy = w * dy; dx = rstd * (wdy - tl.sum(wdy, axis=0) / n_cols - "
                  "xhat * (tl.sum(wdy * xhat, axis=0) / n_cols)); "
                  "tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=col_ok)",
    "# TODO: add": "dw_acc += dy * xhat; db_acc += dy",
    "# TODO: store": "tl.store(dw_part_ptr + pid * n_cols + cols, dw_acc, mask=col_ok); "
                     "tl.store(db_part_ptr + pid * n_cols + cols, db_acc, mask=col_ok)",
    "raise NotImplementedError": "",
    "# TODO: launch": "layernorm_backward_kernel[(programs,)](x, w, mean, rstd, dy, dx, dw_part, db_part, m, n, "
                      "ROWS_PER_PROGRAM=rows_per_program, BLOCK_N=triton.next_power_of_2(n))",
    "dw = ...": "dw = dw_part.sum(dim=0).to(w.dtype)",
    "db = ...": "db = db_part.sum(dim=0).to(w.dtype)",
}


def test_skeleton_filled_in_passes():
    assert "04.3: correct on all" in run_exercise(NOTEBOOK, "04.3", FILLED)
