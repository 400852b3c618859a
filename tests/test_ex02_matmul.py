"""Exercise 02.4, the tiled matmul: its cases reach every edge the kernel must mask, the notebook's cells run
alone after a restart, and the skeleton filled in as the task asks passes the check."""
import time

import helpers  # noqa: F401  (before triton: switches it to the interpreter without a GPU)
import torch
import triton
from helpers.exercises import CHECKS, ex02
from helpers.results import REPO_ROOT
from exercise_cells import run_exercise

NOTEBOOK = REPO_ROOT / "notebooks" / "02_arithmetic_intensity_and_roofline.ipynb"
CHECK = CHECKS["02.4"]


def test_cases_need_several_programs_in_both_dimensions_and_a_ragged_k():
    blocks = ex02.MATMUL_BLOCKS
    shapes = [case.params["shape"] for case in CHECK.cases]
    for m, n, k in shapes:
        assert triton.cdiv(m, blocks["BLOCK_M"]) >= 2 and triton.cdiv(n, blocks["BLOCK_N"]) >= 2, (m, n)
        assert k % blocks["BLOCK_K"], f"K={k} ends in a full tile: a loop that drops the tail would pass"
    assert any(k < blocks["BLOCK_K"] for _, _, k in shapes), "no case whose K is one partial tile"
    assert {case.dtype for case in CHECK.cases} == {torch.float32, torch.float16}


def test_check_is_quick_on_this_machine(capsys):
    start = time.perf_counter()
    assert CHECK.check(CHECK.solution).passed
    assert time.perf_counter() - start < 30, capsys.readouterr().out


FILLED = {  # what a learner writes for each TODO of the skeleton, as the task and the comments ask
    "a = ...": "a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), "
               "other=0.0)",
    "b = ...": "b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), "
               "other=0.0)",
    "acc = ...": "acc += tl.dot(a, b)",
    "# TODO: store": "tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty), "
                     "mask=(rows[:, None] < M) & (cols[None, :] < N))",
    "# TODO: launch": "matmul_kernel[(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))](a, b, c, M, N, K, "
                      "BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)",
    "raise NotImplementedError": "",
}


def test_skeleton_filled_in_passes():
    assert "02.4: correct on all" in run_exercise(NOTEBOOK, "02.4", FILLED)
