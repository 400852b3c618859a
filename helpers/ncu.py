"""Nsight Compute (``ncu``) from Python: profile a command and read its raw CSV page.

The course's counter scripts run themselves under ncu (a child with ``--launch`` does the GPU work) at the GPU's
own clocks (``--clock-control none``, as in every other measurement of the course), and keep ncu's raw output
beside their records so that a table can be rebuilt from it without a GPU.
"""
from __future__ import annotations

import csv
import io
import shutil
import subprocess

BASE = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base"]


def profile(command: list[str], metrics: list[str] = (), sections: list[str] = (), kernel_regex: str | None = None,
            from_start: bool = True) -> str:
    """ncu's raw CSV for the kernels ``command`` launches: the ``metrics`` and every metric of ``sections``, of the
    kernels whose names match ``kernel_regex`` (all when None); with ``from_start=False``, only those launched
    between the program's ``cudaProfilerStart`` and ``cudaProfilerStop``. Raises RuntimeError when ncu fails."""
    if shutil.which("ncu") is None:
        raise RuntimeError("ncu (Nsight Compute) is not on the PATH: it ships with the CUDA toolkit")
    cmd = list(BASE)
    if kernel_regex:
        cmd += ["-k", f"regex:{kernel_regex}"]
    if not from_start:
        cmd += ["--profile-from-start", "off"]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    for section in sections:
        cmd += ["--section", section]
    run = subprocess.run(cmd + list(command), capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"ncu exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return run.stdout


def raw_rows(text: str) -> list[dict[str, str]]:
    """ncu's ``--csv --page raw`` output -> one dict a profiled launch, in launch order (the program's own output,
    ncu's ``==PROF==`` lines and the units row dropped)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    return [r for r in csv.DictReader(io.StringIO("\n".join(lines))) if r.get("Kernel Name")]


def number(row: dict[str, str], metric: str) -> float:
    """``row``'s value of ``metric`` as a number (ncu writes thousands with commas)."""
    return float(row[metric].replace(",", ""))
