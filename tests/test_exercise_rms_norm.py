"""Exercise 07.4, Llama's RMSNorm forward in Triton: its check fails the kernels a learner plausibly writes wrong
(each a real Triton kernel, one switch away from the solution), its cases hold what the task claims, the notebook's
cells run alone after a restart, and the skeleton filled in as the task asks passes."""
import pytest
import torch

import helpers  # noqa: F401  (before triton: switches it to the interpreter without a GPU)
import triton
import triton.language as tl
from helpers.exercises import CHECKS, ex07
from helpers.results import REPO_ROOT
from exercise_cells import checked, run_exercise, shared_bytes_on_sm90

NOTEBOOK = REPO_ROOT / "notebooks" / "07_kernels_at_work.ipynb"
CHECK = CHECKS["07.4"]


@triton.jit
def _switched_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, eps, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                     MEAN_OVER_N: tl.constexpr, EPS_INSIDE: tl.constexpr, WEIGHT: tl.constexpr):
    """The solution's kernel with each part behind a switch (all on: the solution)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    width = n_cols
    if not MEAN_OVER_N:  # the mean taken over the padded block
        width = BLOCK_N
    if EPS_INSIDE:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / width + eps)
    else:  # 1 / (sqrt(mean) + eps)
        rstd = 1.0 / (tl.sqrt(tl.sum(x * x, axis=1) / width) + eps)
    y = x * rstd[:, None]
    if WEIGHT:
        y = y * w[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def switched(grid_of_one=False, **switches):
    """``rms_norm`` with some switches off (a planted bug), or launched as a grid of one program."""
    flags = {"MEAN_OVER_N": True, "EPS_INSIDE": True, "WEIGHT": True, **switches}

    def answer(x, w, eps, rows_per_program):
        m, n = x.shape
        y = torch.empty_like(x)
        programs = 1 if grid_of_one else triton.cdiv(m, rows_per_program)
        _switched_kernel[(programs,)](x, w, y, m, n, eps, ROWS=rows_per_program, BLOCK_N=triton.next_power_of_2(n),
                                      **flags)
        return y
    return answer


def unmasked_padding(x, w, eps, rows_per_program):
    """Padding lanes not masked: lane j >= N of a row loads element j - N of the next row (0 past the end) and adds
    its square to the row's sum (the torch equivalent: out of bounds reads are not safe in the interpreter)."""
    m, n = x.shape
    block = triton.next_power_of_2(n)
    flat = torch.cat([x.float().flatten(), x.new_zeros(block, dtype=torch.float32)])
    lanes = flat[torch.arange(m, device=x.device)[:, None] * n + torch.arange(block, device=x.device)[None, :]]
    rstd = torch.rsqrt(lanes.pow(2).sum(dim=1, keepdim=True) / n + eps)
    return (x.float() * rstd * w.float()).to(x.dtype)


def test_the_switched_kernel_with_every_switch_on_passes():
    """So that each planted failure below comes from its one switch."""
    passed, out = checked(CHECK, switched())
    assert passed, out


@pytest.mark.parametrize("planted, kind", [
    (switched(MEAN_OVER_N=False), "value"),
    (unmasked_padding, "value"),
    (switched(EPS_INSIDE=False), "value"),
    (switched(WEIGHT=False), "value"),
    (switched(grid_of_one=True), "unwritten"),
], ids=["mean over BLOCK_N", "padding not masked", "eps outside the sqrt", "no weight", "grid of one program"])
def test_check_fails_a_planted_kernel(planted, kind):
    passed, out = checked(CHECK, planted)
    assert not passed and f"- {kind}: " in out, out


def test_cases_hold_what_the_task_claims():
    for case in CHECK.cases:
        m, n, rows_per_program = case.params["shape"]
        assert n & (n - 1), f"N={n} is a power of two: the padding lanes would never matter"
        assert triton.cdiv(m, rows_per_program) >= 2, "one program: the grid would never matter"
        assert m % rows_per_program, "M a multiple of rows_per_program: the last program would be full"
        assert rows_per_program & (rows_per_program - 1) == 0 and rows_per_program > 1
    assert {case.dtype for case in CHECK.cases} == {torch.float32, torch.bfloat16}


def test_some_rows_have_a_mean_square_near_eps():
    """Else eps, inside or outside the square root, would not change the result beyond the tolerance."""
    case = CHECK.cases[0]
    x, _, eps, _ = CHECK.make_inputs(case, torch.Generator().manual_seed(0))
    assert (x.double().pow(2).mean(dim=1) < 10 * eps).any()


def test_solution_is_the_modules_function():
    assert CHECK.solution is ex07.rms_norm


def test_solution_compiles_for_the_gpu():
    """The readable kernel through Triton's compiler for sm_90, on this CPU (the check runs it on a GPU at full
    scale)."""
    args = "dict(x_ptr=b, w_ptr=b, y_ptr=b, n_rows=4099, n_cols=4000, eps=1e-6, ROWS=2, BLOCK_N=4096)"
    assert shared_bytes_on_sm90("ex07._rms_norm_kernel", args) >= 0


FILLED = {  # what a learner writes for each TODO of the skeleton, as the task and the comments ask
    "mask = ...": "mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)",
    "x = ...": "x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)",
    "w = ...": "w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)",
    "rstd = ...": "rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)",
    "# TODO: store": "tl.store(y_ptr + offs, (x * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)",
    "raise NotImplementedError": "",
    "# TODO: launch": "rms_norm_kernel[(triton.cdiv(m, rows_per_program),)](x, w, y, m, n, eps, "
                      "ROWS=rows_per_program, BLOCK_N=triton.next_power_of_2(n))",
}


def test_skeleton_filled_in_passes():
    assert "07.4: correct on all" in run_exercise(NOTEBOOK, "07.4", FILLED)
