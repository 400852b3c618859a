"""The code passes ruff's checks (the rules in pyproject.toml's [tool.ruff])."""
import subprocess
import sys

from helpers.results import REPO_ROOT

CHECKED = ("helpers", "scripts", "tests", "conftest.py", "jupyter_server_config.py")


def test_ruff_flags_nothing():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *CHECKED], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert "No module named ruff" not in out.stderr, "ruff is missing: the test extra has it (pip install -e .[test])"
    assert out.returncode == 0, out.stdout + out.stderr
