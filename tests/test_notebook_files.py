"""Notebook metadata: the committed notebooks clean, and every save (JupyterLab's, the executor's) cleans."""
import importlib.util
import json
import subprocess
import sys

import pytest

from helpers.notebook_files import KERNELSPEC, clean_metadata
from helpers.results import REPO_ROOT

NOTEBOOKS = [*sorted((REPO_ROOT / "notebooks").glob("*.ipynb")),
             *sorted((REPO_ROOT / "notebooks").glob("appendix/*.ipynb"))]


def _editor_saved() -> dict:
    """A notebook as JupyterLab saves it: widget state, the kernel's Python version, editor state per cell."""
    return {"metadata": {"kernelspec": {"display_name": "venv", "language": "python", "name": "venv"},
                         "language_info": {"name": "python", "version": "3.11.7"},
                         "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {"x": 1}}}},
            "cells": [{"cell_type": "code", "metadata": {"tags": ["raises-exception"], "scrolled": True,
                                                         "collapsed": False, "execution": {"iopub.execute_input": "x"}},
                       "source": "1", "outputs": []}], "nbformat": 4, "nbformat_minor": 5}


def test_clean_metadata_keeps_the_kernel_the_language_the_tags_and_the_timings():
    nb = clean_metadata(_editor_saved())
    assert nb["metadata"] == {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    assert nb["cells"][0]["metadata"] == {"tags": ["raises-exception"], "execution": {"iopub.execute_input": "x"}}
    assert clean_metadata(json.loads(json.dumps(nb))) == nb  # once clean, it stays as it is


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.relative_to(REPO_ROOT / "notebooks").as_posix() for p in NOTEBOOKS])
def test_committed_notebooks_are_clean(path):
    nb = json.loads(path.read_text())
    assert clean_metadata(json.loads(json.dumps(nb))) == nb, f"{path.name}: run helpers.notebook_files.clean_metadata"


def test_jupyterlab_saves_through_the_cleaning_hook():
    spec = importlib.util.spec_from_file_location("jupyter_server_config", REPO_ROOT / "jupyter_server_config.py")
    config = importlib.util.module_from_spec(spec)

    class Config:  # what Jupyter's config loader gives the file as `c`
        class FileContentsManager:
            pre_save_hook = None

    config.get_config = lambda: Config
    spec.loader.exec_module(config)
    model = {"type": "notebook", "content": _editor_saved()}
    Config.FileContentsManager.pre_save_hook(model=model, path="x.ipynb", contents_manager=None)
    assert "widgets" not in model["content"]["metadata"] and model["content"]["metadata"]["kernelspec"] == KERNELSPEC
    other = {"type": "file", "content": "text"}
    Config.FileContentsManager.pre_save_hook(model=other, path="x.txt", contents_manager=None)
    assert other == {"type": "file", "content": "text"}


def test_appendix_notebooks_are_collected_after_the_numbered_ones():
    """pytest (testpaths: tests, notebooks) collects notebooks/appendix/ too, after 00-08: the conftest scheduler runs
    every notebook cell on one worker in collection order, so an appendix notebook runs after its parent."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--nbval-lax", "notebooks"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    files = list(dict.fromkeys(line.split("::")[0] for line in out.stdout.splitlines() if ".ipynb::" in line))
    appendix = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "notebooks").glob("appendix/*.ipynb"))
    assert appendix and files[-len(appendix):] == appendix, out.stdout[-2000:] + out.stderr[-2000:]
    assert all(not f.startswith("notebooks/appendix/") for f in files[:-len(appendix)])
