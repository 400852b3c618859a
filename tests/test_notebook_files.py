"""Notebook metadata: the committed notebooks clean, and every save (JupyterLab's, the executor's) cleans."""
import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest

from helpers.notebook_files import KERNELSPEC, clean, clean_metadata, clean_outputs, collapse_redraws
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
    assert clean(json.loads(json.dumps(nb))) == nb, f"{path.name}: run python -m helpers.notebook_files {path.name}"


def _stream(text, name="stderr"):
    return {"output_type": "stream", "name": name, "text": text}


def _tqdm_as_saved(n: int) -> list[dict]:
    """A text tqdm bar as nbclient saves it: one stderr output per redraw, then the closing newline."""
    bars = [_stream(["\r", f"N=1024: {100 * i // n:3d}%|{'#' * i:<{n}}| {i}/{n} [00:0{i}<00:00,  2.7it/s]"])
            for i in range(n + 1)]
    return bars + [_stream(["\n"])]


def test_a_progress_bar_saved_as_many_outputs_becomes_its_last_line():
    nb = {"cells": [{"cell_type": "code", "outputs": [_stream("start\n", "stdout"), *_tqdm_as_saved(20),
                                                      {"output_type": "display_data", "data": {"text/plain": "table"}},
                                                      _stream("done\n", "stdout")]}]}
    outs = clean_outputs(nb)["cells"][0]["outputs"]
    assert [o["output_type"] for o in outs] == ["stream", "stream", "display_data", "stream"]
    assert outs[1]["text"] == ["N=1024: 100%|####################| 20/20 [00:020<00:00,  2.7it/s]\n"]
    assert outs[0]["text"] == "start\n" and outs[3]["text"] == "done\n"  # a string stays a string
    assert clean_outputs(json.loads(json.dumps(nb))) == nb


def test_consecutive_streams_merge_and_carriage_returns_collapse_line_by_line():
    nb = {"cells": [{"cell_type": "code", "outputs": [_stream("a\n", "stdout"), _stream("b\n", "stdout"),
                                                      _stream("warn\n"), _stream("c\n", "stdout")]},
                    {"cell_type": "markdown", "source": "x\ry"}]}
    outs = clean_outputs(nb)["cells"][0]["outputs"]
    assert [(o["name"], o["text"]) for o in outs] == [("stdout", "a\nb\n"), ("stderr", "warn\n"), ("stdout", "c\n")]
    assert nb["cells"][1] == {"cell_type": "markdown", "source": "x\ry"}
    assert collapse_redraws("keep\n 10%\r 50%\r100%\nnext\r\n") == "keep\n100%\nnext\n"


def test_progress_widgets_stale_frames_are_dropped_and_other_displays_kept():
    bar = "peak memory, naive:   0%|          | 0/7 [00:00<?, ?it/s]"
    frame = {"output_type": "display_data", "data": {"text/plain": bar}}
    widget = {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                                      "text/plain": "HBox()"}}
    table = {"output_type": "display_data", "data": {"text/plain": "   ms  |  0%|\n"}}
    nb = {"cells": [{"cell_type": "code", "outputs": [frame, widget, table]}]}
    assert clean_outputs(nb)["cells"][0]["outputs"] == [table]


def test_jupyterlab_saves_through_the_cleaning_hook(tmp_path):
    spec = importlib.util.spec_from_file_location("jupyter_server_config", REPO_ROOT / "jupyter_server_config.py")
    config = importlib.util.module_from_spec(spec)

    class Config:  # what Jupyter's config loader gives the file as `c`
        class ServerApp:
            contents_manager_class = None

    config.get_config = lambda: Config
    spec.loader.exec_module(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the hook is registered, not set through the deprecated option
        manager = Config.ServerApp.contents_manager_class(root_dir=str(tmp_path))
    model = {"type": "notebook", "content": _editor_saved()}
    manager.run_pre_save_hooks(model=model, path="x.ipynb")
    assert "widgets" not in model["content"]["metadata"] and model["content"]["metadata"]["kernelspec"] == KERNELSPEC
    model = {"type": "notebook", "content": {"metadata": {}, "cells": [{"cell_type": "code", "metadata": {},
                                                                        "outputs": _tqdm_as_saved(3)}]}}
    manager.run_pre_save_hooks(model=model, path="x.ipynb")
    assert len(model["content"]["cells"][0]["outputs"]) == 1
    other = {"type": "file", "content": "text"}
    manager.run_pre_save_hooks(model=other, path="x.txt")
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


def test_jupyterlab_started_without_a_gpu_gives_its_kernels_the_triton_interpreter():
    """The kernels inherit the server's environment; TRITON_INTERPRET must be set before a cell imports triton."""
    code = ("import os, runpy, torch; ns = runpy.run_path('jupyter_server_config.py', "
            "init_globals={'get_config': lambda: type('C', (), {'ServerApp': type('S', (), {})})}); "
            "print(torch.cuda.is_available(), os.environ.get('TRITON_INTERPRET'))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    has_gpu, interpret = out.stdout.split()
    assert interpret == ("None" if has_gpu == "True" else "1")
