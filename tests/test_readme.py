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


def _block(text: str, name: str) -> str:
    return text.split(f"<!-- {name} -->", 1)[1].split(f"<!-- /{name} -->", 1)[0]


def test_readme_front_page_has_the_claims_the_headlines_and_the_full_table_elsewhere():
    readme = (results.REPO_ROOT / "README.md").read_text()
    claim_rows = [line for line in _block(readme, "claims-table").splitlines() if line.startswith("| ")][2:]
    assert len(claim_rows) == 9
    headline_rows = [line for line in _block(readme, "results-table").splitlines() if line.startswith("| ")][2:]
    assert 0 < len(headline_rows) <= 10
    full = (results.REPO_ROOT / "results" / "README.md").read_text()
    assert all(row in full for row in headline_rows) and full.count("\n| ") > len(headline_rows)
    for heading in ("## Who it is for", "## The course", "## Exercises", "## Set up and run"):
        assert f"\n{heading}\n" in readme, heading
    assert "<!-- main-command -->\n```bash\n" in readme and "<!-- test-command -->\n```bash\n" in readme


def test_headlines_pick_one_row_per_prefix_in_order():
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_readme", results.REPO_ROOT / "scripts" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [(f"{prefix} (a)", "1", "", "00") for prefix in reversed(module.HEADLINES)] + [("other", "2", "", "01")]
    picked = module.headlines(rows)
    assert [r[0] for r in picked] == [f"{p} (a)" for p in module.HEADLINES] and len(picked) <= 10
    assert module.headlines(rows[:1]) == rows[:1]


def test_readme_gives_the_cpu_only_torch_command_for_a_machine_without_a_gpu():
    readme = (results.REPO_ROOT / "README.md").read_text()
    command = _block(readme, "cpu-torch-command")
    assert "--index-url https://download.pytorch.org/whl/cpu" in command
    pinned = _block(readme, "test-command").split("torch==", 1)[1].split()[0]
    assert f"torch=={pinned} " in command, "the CPU command must install the test command's torch pin"


def test_readme_counts_the_exercises_there_are():
    from helpers.exercises import CHECKS
    from helpers.exercises.checks import CodeCheck

    readme = (results.REPO_ROOT / "README.md").read_text()
    code = sum(isinstance(check, CodeCheck) for check in CHECKS.values())
    assert f"The notebooks hold {len(CHECKS)} exercises: {code} ask you to write" in " ".join(readme.split())
    assert f"; {len(CHECKS) - code} ask you to predict" in " ".join(readme.split())
