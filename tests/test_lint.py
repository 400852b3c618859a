"""helpers/, scripts/, tests/ and conftest.py pass ruff's checks (the rules in pyproject.toml's [tool.ruff])."""
import subprocess
import sys

from helpers.results import REPO_ROOT


def test_ruff_flags_nothing():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "helpers", "scripts", "tests",
                          "conftest.py"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert "No module named ruff" not in out.stderr, "ruff is missing: the test extra has it (pip install -e .[test])"
    assert out.returncode == 0, out.stdout + out.stderr
