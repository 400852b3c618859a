"""Every kernel launch fits the shared memory a block of every supported target (sm_75 ... sm_90), compiled ahead
of time by Triton's own compiler on this CPU (``scripts/cross_compile_sweep.py``; the configs that decide fitting:
the one the code picks on that target and its smallest fallback). A config that needs more than a target has
must fail the check. Each test compiles in a child process: the kernels must be defined with TRITON_INTERPRET=0."""
import json
import os
import subprocess
import sys

import pytest

from helpers.kernels.fit import LIMITS, TARGETS
from helpers.results import REPO_ROOT


def _sweep(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, "scripts/cross_compile_sweep.py", "--picks", "--json", str(out), *args],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "0"})
    return run, json.loads(out.read_text()) if out.exists() else []


def test_limits_are_the_cards():
    assert LIMITS == {"sm_75": 64 * 1024, "sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024,
                      "sm_90": 227 * 1024}


@pytest.mark.parametrize("target", TARGETS)
def test_every_kernel_fits(tmp_path, target):
    run, rows = _sweep(tmp_path, "--ci", "--targets", target)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    kernels = {row["launch"].split()[0] for row in rows}
    assert {"flash_attention._fwd_kernel", "flash_attention._bwd_dkdv_kernel", "flash_attention._bwd_dq_kernel",
            "nf4_gemv._nf4_matmul_tile_kernel", "nf4_gemv._nf4_matmul_row_kernel"} <= kernels, kernels
    assert all(row["target"] == target and row["shared"] > 0 for row in rows), rows


def test_a_planted_config_too_big_for_sm_89_fails(tmp_path):
    run, rows = _sweep(tmp_path, "--plant", "--kernels", "planted", "--targets", "sm_80", "sm_89")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    shared = {row["target"]: row["shared"] for row in rows}
    assert shared["sm_89"] == 120 * 1024 and not [r for r in rows if r["target"] == "sm_89"][0]["fits"], rows
    assert [r for r in rows if r["target"] == "sm_80"][0]["fits"], rows  # 163 KB: the same config fits an A100
    assert "FAIL: planted" in run.stdout and "on sm_89" in run.stdout and "on sm_80" not in run.stdout, run.stdout
