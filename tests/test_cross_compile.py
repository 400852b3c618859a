"""Every kernel launch fits the shared memory a block of every supported target (sm_75 ... sm_90), compiled ahead
of time by Triton's own compiler on this CPU (``scripts/cross_compile_sweep.py``; the configs that decide fitting:
the one the code picks on that target and its smallest fallback). A config that needs more than a target has
must fail the check. Each test compiles in a child process: the kernels must be defined with TRITON_INTERPRET=0."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from helpers.card_fit import CARDS
from helpers.kernels.fit import LIMITS, TARGETS, DoesNotFit, fitting
from helpers.kernels.nf4_gemv import config_for
from helpers.results import REPO_ROOT


# The Hopper candidate uses tensor descriptors (TMA): sm_90 and newer by design, its host function refuses older cards.
HOPPER_ONLY = "candidates.flash_attention_hopper._hopper_fwd_kernel"


# The modules of the kernels that hold tiles in shared memory: CI compiles them for every target.
TILED = {"flash_attention", "flash_attention_hopper", "decode_attention", "paged_decode_attention", "nf4_matmul_tile",
         "nf4_matvec", "fused_bias_gelu_layernorm", "rms_norm"}


def _jitted_kernels() -> set[str]:
    """Every ``@triton.jit`` function named ``*kernel`` under helpers/kernels, as "module.name"."""
    root = REPO_ROOT / "helpers" / "kernels"
    return {f"{'.'.join(path.relative_to(root).with_suffix('').parts)}.{name}" for path in root.rglob("*.py")
            for name in re.findall(r"@triton\.jit[^\n]*\ndef (\w*kernel)\(", path.read_text())}


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
    too_big = [f"{r['launch']} {r['config']}: {r['shared']} bytes" for r in rows if not r["fits"]]
    assert not too_big, f"over {target}'s {LIMITS[target]} bytes a block: {too_big}"
    kernels = {row["launch"].split()[0] for row in rows}
    expected = _jitted_kernels() - ({HOPPER_ONLY} if target != "sm_90" else set())
    if target not in ("sm_75", "sm_80"):  # the element-wise kernels are compiled for those two (launches.launches)
        expected = {name for name in expected if name.split(".")[-2] in TILED}
    assert kernels == expected, f"checked but not a kernel: {kernels - expected}; not checked: {expected - kernels}"
    assert all(row["target"] == target for row in rows), rows
    assert all(row["shared"] > 0 for row in rows if row["launch"].startswith("flash_attention._fwd")), rows


def test_a_planted_config_too_big_for_sm_89_fails(tmp_path):
    run, rows = _sweep(tmp_path, "--plant", "--kernels", "planted", "--targets", "sm_80", "sm_89")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    shared = {row["target"]: row["shared"] for row in rows}
    assert shared["sm_89"] == 120 * 1024 and not [r for r in rows if r["target"] == "sm_89"][0]["fits"], rows
    assert [r for r in rows if r["target"] == "sm_80"][0]["fits"], rows  # 163 KB: the same config fits an A100
    assert "FAIL: planted" in run.stdout and "on sm_89" in run.stdout and "on sm_80" not in run.stdout, run.stdout


def test_fitting_keeps_what_fits_then_the_fallbacks_then_names_the_card():
    need = {"big": 100 * 1024, "mid": 50 * 1024, "small": 30 * 1024}.__getitem__
    assert fitting("k", ["big", "mid"], need, 64 * 1024, "Tesla T4", ["small"]) == ["mid"]
    assert fitting("k", ["big", "mid"], need, 40 * 1024, "Tesla T4", ["small"]) == ["small"]
    with pytest.raises(DoesNotFit, match=r"flash_attention forward: .*Tesla T4's 20 KB .* smallest needs 30 KB"):
        fitting("flash_attention forward", ["big", "mid"], need, 20 * 1024, "Tesla T4", ["small"])


def test_nf4_fp32_tiles_halve_on_a_card_under_96_kb():
    t4, a10 = CARDS["Tesla T4"].smem_per_block_bytes, CARDS["NVIDIA A10"].smem_per_block_bytes
    for m in (2, 32):
        wide = config_for(m, 11008, 4096, 64, torch.float32, smem_per_block=a10)
        assert config_for(m, 11008, 4096, 64, torch.float32, smem_per_block=t4).block_k == wide.block_k // 2
        assert config_for(m, 11008, 4096, 64, torch.bfloat16, smem_per_block=t4) == \
            config_for(m, 11008, 4096, 64, torch.bfloat16, smem_per_block=a10)  # 16-bit x keeps the table's


PRUNE_ON_A_T4 = """
from helpers.kernels import fit, launches, flash_attention as fa
fit.this_arch = lambda: ("sm_75", 64 * 1024, "Tesla T4")
row = [r for r in launches.launches() if r.name == "flash_attention._bwd_dq_kernel float16 D=128 causal"][0]
kept = fa._bwd_dq_kernel.early_config_prune(fa._bwd_dq_kernel.configs[:1], row.args)  # one tuned: cheaper
print([(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages) for c in kept])
"""


def test_flash_attention_prunes_to_the_fallbacks_on_a_t4():
    """What the autotuner is left with on a T4 at D = 128: no tuned backward config fits 64 KB, the fallbacks do."""
    run = subprocess.run([sys.executable, "-c", PRUNE_ON_A_T4], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(REPO_ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[-2] == "[(32, 64, 1), (32, 32, 1)]", run.stdout
