"""scripts/execute_notebooks.py: outputs saved cell by cell, a failure saved and reported."""
import importlib.util

import nbformat
import pytest
import torch

from helpers.notebook_files import KERNELSPEC
from helpers import results
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
    saved = nbformat.read(good, as_version=4)
    cells = saved.cells
    assert cells[1].outputs[0]["text"].strip() == str(tmp_path) and cells[2].outputs[0]["text"].strip() == "42"
    assert saved.metadata == {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}  # no Python version


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


def test_a_save_that_dies_midway_leaves_the_last_good_notebook(tmp_path, monkeypatch):
    path = tmp_path / "nb.ipynb"
    _notebook(path, "print(1)")
    before = path.read_bytes()
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 100_000)]

    def killed(fd):  # the new text written, not yet on disk, and the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        execute_notebooks.save(nb, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["nb.ipynb"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_outputs_are_not_replaced_without_a_gpu_unless_asked(tmp_path, capsys):
    path = tmp_path / "gpu.ipynb"
    _notebook(path, "print('run')")
    nb = nbformat.read(path, as_version=4)
    line = "GPU NVIDIA H200; scale=full; Triton kernels compile for the GPU"
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=line)]
    nbformat.write(nb, path)
    before = path.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        execute_notebooks.main([str(path)])
    assert exit_.value.code == 2 and "--overwrite-gpu-outputs" in capsys.readouterr().err
    assert path.read_bytes() == before
    assert execute_notebooks.main([str(path), "--overwrite-gpu-outputs"]) == 0
    assert nbformat.read(path, as_version=4).cells[1].outputs[0]["text"].strip() == "run"
