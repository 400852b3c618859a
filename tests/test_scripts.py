"""Every script without a test of its own imports and answers ``--help`` (exit 0, its options in the usage text):
their real runs need a GPU, but a broken import or argument parser shows on any machine."""
import os
import subprocess
import sys

import pytest

from helpers.results import REPO_ROOT

OPTIONS = {
    "decode_attention_bench": [],
    "decode_ladder": ["--models", "--repeats", "--topic"],
    "flash_attention_hopper_probe": [],
    "flash_attention_bench": ["--B", "--H", "--S", "--D", "--dtype", "--impls", "--passes"],
    "fused_bias_gelu_layernorm_tune": ["--out", "--top", "--ns", "--block", "--passes", "--dtypes", "--gelu", "--rows",
                                       "--num-warps", "--programs-per-sm", "--loads"],
    "host_overhead": ["--calls"],
    "l2_flush_check": [],
    "nf4_gemv_tune": ["--rows", "--top", "--block-n", "--block-k", "--num-warps", "--split-k"],
    "nf4_linear_cost": ["--calls"],
    "qlora_step_pacing": ["--model", "--batch", "--steps", "--max-len", "--variants", "--rounds", "--host-top"],
    "peers_side_by_side": ["--kernels"],
    "rms_norm_tune": ["--ns", "--weights", "--passes", "--top", "--stages", "--rows", "--num-warps",
                      "--programs-per-sm", "--graph", "--peers"],
    "step_parts": ["--train", "--timed", "--decode-model", "--contexts", "--rounds"],
    "step_timeline": ["--train"],
}


@pytest.mark.parametrize("script", sorted(OPTIONS))
def test_script_answers_help(script):
    out = subprocess.run([sys.executable, f"scripts/{script}.py", "--help"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "COURSE_SCALE": "smoke"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"usage: {script}.py"), out.stdout
    missing = [option for option in OPTIONS[script] if option not in out.stdout]
    assert not missing, f"usage text lacks {missing}:\n{out.stdout}"


def test_every_script_has_a_test():
    """A new script gets a line in OPTIONS (or a test of its own that names it)."""
    tests = "".join(p.read_text() for p in (REPO_ROOT / "tests").glob("test_*.py") if p.name != "test_scripts.py")
    untested = [p.stem for p in (REPO_ROOT / "scripts").glob("*.py") if p.stem not in OPTIONS and p.stem not in tests]
    assert not untested, f"scripts without a test: {untested}"
