"""scripts/execute_notebooks.py: outputs saved cell by cell, a failure saved and reported."""
import importlib.util

import nbformat

from helpers.results import REPO_ROOT

spec = importlib.util.spec_from_file_location("execute_notebooks", REPO_ROOT / "scripts" / "execute_notebooks.py")
execute_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(execute_notebooks)


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# test")] + [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)


def test_runs_in_the_notebooks_folder_and_saves_outputs(tmp_path):
    good = tmp_path / "good.ipynb"
    _notebook(good, "import os\nprint(os.getcwd())", "print(6 * 7)")
    assert execute_notebooks.main([str(good)]) == 0
    cells = nbformat.read(good, as_version=4).cells
    assert cells[1].outputs[0]["text"].strip() == str(tmp_path) and cells[2].outputs[0]["text"].strip() == "42"


def test_a_failing_cell_keeps_what_ran_before_it_and_no_older_outputs(tmp_path):
    bad, good = tmp_path / "bad.ipynb", tmp_path / "good.ipynb"
    _notebook(bad, "print('before')", "raise ValueError('boom')", "print('never')")
    nb = nbformat.read(bad, as_version=4)
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text="an earlier run's output")]
    nbformat.write(nb, bad)
    _notebook(good, "print('still run')")
    assert execute_notebooks.main([str(bad), str(good)]) == 1
    cells = nbformat.read(bad, as_version=4).cells
    assert cells[1].outputs[0]["text"].strip() == "before"
    assert cells[2].outputs[0]["ename"] == "ValueError" and not cells[3].outputs
    assert nbformat.read(good, as_version=4).cells[1].outputs[0]["text"].strip() == "still run"
