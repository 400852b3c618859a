import subprocess
import sys

from helpers import results


def test_readme_results_table_matches_the_committed_results():
    out = subprocess.run([sys.executable, "scripts/update_readme.py", "--check"], cwd=results.REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_readme_names_every_notebook():
    readme = (results.REPO_ROOT / "README.md").read_text()
    for nb in sorted((results.REPO_ROOT / "notebooks").glob("*.ipynb")):
        assert f"`{nb.stem}`" in readme, nb.stem
