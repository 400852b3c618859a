"""Execute notebooks in place, top to bottom, saving each after every cell, so that a long run cut short
(a lost connection, a time limit) keeps the outputs of every cell it finished. Every code cell's old
outputs are cleared first: a run cut short leaves the cells it did not reach empty, never showing an
earlier run's outputs beside this one's. SIGTERM (``timeout``) stops the run and shuts its kernel down.

    python scripts/execute_notebooks.py notebooks/04_fused_kernel_in_triton.ipynb [...] [--cell-timeout 1800]

Each notebook runs in a fresh kernel with its own folder as the working directory, as JupyterLab runs it.
A failing cell stops that notebook (its error is saved in the notebook) and the script exits 1 after the rest.
Every save is atomic (a temporary file beside the notebook, flushed to disk, then renamed): a run killed
mid-save leaves the notebook as it was after the last cell. On a machine without a GPU the script refuses
to replace a notebook's GPU outputs (a run at full scale) with smoke-scale ones, unless told to
(``--overwrite-gpu-outputs``).
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from helpers.notebook_files import clean
from helpers.results import write_atomically

GPU_RUN_MARK = "scale=full"  # helpers.describe()'s words in a notebook's first output on a GPU


def save(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` to ``path`` atomically (``helpers.results.write_atomically``), its metadata and outputs cleaned
    (``helpers.notebook_files``)."""
    clean(nb)
    write_atomically(path, nbformat.writes(nb))


def has_gpu_outputs(path: Path) -> bool:
    """Whether the saved notebook's outputs come from a full-scale (GPU) run."""
    nb = nbformat.read(path, as_version=4)
    return any(GPU_RUN_MARK in "".join(out.get("text", "")) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []))


def execute(path: Path, cell_timeout: int | None = None) -> bool:
    """Run ``path`` cell by cell, writing it back after each; True when every cell ran."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    save(nb, path)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    start = time.perf_counter()
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
                if cell.cell_type == "code":
                    save(nb, path)
                    print(f"{path.name}: cell {index + 1}/{len(nb.cells)} done at {time.perf_counter() - start:.0f} s",
                          flush=True)
    except CellExecutionError as error:
        save(nb, path)
        print(f"{path.name}: FAILED at {time.perf_counter() - start:.0f} s\n{str(error)[-3000:]}", flush=True)
        return False
    save(nb, path)
    print(f"{path.name}: every cell ran, {time.perf_counter() - start:.0f} s", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--cell-timeout", type=int, help="seconds one cell may take (default: no limit)")
    parser.add_argument("--overwrite-gpu-outputs", action="store_true",
                        help="on a machine without a GPU, replace a notebook's GPU outputs all the same")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.overwrite_gpu_outputs:
        kept = [str(p) for p in args.notebooks if has_gpu_outputs(p)]
        if kept:
            parser.error(f"this machine has no GPU, and {', '.join(kept)} hold(s) a GPU run's outputs that a run here "
                         "would replace with smoke-scale ones; run on a GPU, or pass --overwrite-gpu-outputs")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # unwinds: the kernel is shut down
    ok = [execute(path, args.cell_timeout) for path in args.notebooks]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
