"""Nsight Compute (``ncu``) from Python: profile a command and read its raw CSV page.

The course's counter scripts run themselves under ncu (a child with ``--launch`` does the GPU work) at the GPU's
own clocks (``--clock-control none``, as in every other measurement of the course), and keep ncu's raw output
beside their records so that a table can be rebuilt from it without a GPU.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

BASE = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base"]
KERNEL_METRICS = {  # record field -> ncu metric: what every counter script records of a kernel
    "duration_ns": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "issue_slots_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "warps_per_scheduler": "smsp__warps_active.avg.per_cycle_active",
    "eligible_per_scheduler": "smsp__warps_eligible.avg.per_cycle_active",
    "warp_instructions": "smsp__inst_executed.sum",
    "registers": "launch__registers_per_thread",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
}


def profile(command: list[str], metrics: list[str] = (), sections: list[str] = (), kernel_regex: str | None = None,
            from_start: bool = True, cache_control: str = "all") -> str:
    """ncu's raw CSV for the kernels ``command`` launches: the ``metrics`` and every metric of ``sections``, of the
    kernels whose names match ``kernel_regex`` (all when None); with ``from_start=False``, only those launched
    between the program's ``cudaProfilerStart`` and ``cudaProfilerStop``. ``cache_control``: "all" (ncu's default)
    flushes the caches before each kernel; "none" leaves them as the kernel before left them, as in the program's
    own run. Raises RuntimeError when ncu fails."""
    if cache_control not in ("all", "none"):
        raise ValueError(f"cache_control must be 'all' or 'none', got {cache_control!r}")
    if shutil.which("ncu") is None:
        raise RuntimeError("ncu (Nsight Compute) is not on the PATH: it ships with the CUDA toolkit")
    cmd = [*BASE, "--cache-control", cache_control]
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


STALL_SECTION = "WarpStateStats"  # the section whose metrics say why warps did not issue
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")  # cycles an issue


def top_stalls(row: dict[str, str], count: int = 3) -> dict[str, str | float | None]:
    """The ``count`` stall reasons that cost ``row``'s warps most cycles per issued instruction (``STALL_SECTION``),
    most first: ``stall_1`` (its name) and ``stall_1_cycles``, and so on, None past the last reason measured."""
    stalls = {STALL.match(m).group(1): number(row, m) for m in row if STALL.match(m) and row[m]}
    stalls.pop("selected", None)  # a warp issuing: not a stall
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:count]
    fields: dict[str, str | float | None] = {}
    for i in range(count):
        fields[f"stall_{i + 1}"], fields[f"stall_{i + 1}_cycles"] = top[i] if i < len(top) else (None, None)
    return fields


def stall_text(record: dict, count: int = 3) -> str:
    """:func:`top_stalls`' fields of ``record`` as "name cycles, ..." ("not measured" without them)."""
    names = [i for i in range(1, count + 1) if record.get(f"stall_{i}")]
    return ", ".join(f"{record[f'stall_{i}']} {record[f'stall_{i}_cycles']:.1f}" for i in names) or "not measured"


def script_main(script: str, topic: str, what: str, launch: Callable[[], None], parse: Callable[[str], list[dict]],
                show: Callable[[list[dict]], None], annotate: Callable[[list[dict]], None] | None = None,
                **profile_options) -> int:
    """A counter script's command line. ``--launch``: the profiled child, which runs ``launch()``. ``--from-csv FILE``:
    the table again (``show``) from a saved ncu output, nothing saved. Neither: ncu profiles ``script --launch`` with
    ``profile_options`` (see :func:`profile`), and the records (``parse``, then ``annotate`` in place) are shown and
    saved to ``results/<gpu>/<topic>.json``, ncu's raw output beside them, gzipped (.csv.gz). ``what`` names the
    work in the error a machine without a GPU gets."""
    from . import require_cuda, results

    parser = argparse.ArgumentParser(description=f"Hardware counters: {what}, read by Nsight Compute.")
    parser.add_argument("--launch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--from-csv", help="a saved ncu output (--csv --page raw; .csv or .csv.gz) to tabulate "
                        "(nothing saved)")
    args = parser.parse_args()
    if args.from_csv:
        raw = Path(args.from_csv).read_bytes()
        show(parse((gzip.decompress(raw) if args.from_csv.endswith(".gz") else raw).decode()))
        return 0
    require_cuda(f"reading the hardware counters of {what}")
    if args.launch:
        launch()
        return 0
    text = profile([sys.executable, os.path.abspath(script), "--launch"], **profile_options)
    records = parse(text)
    if annotate:
        annotate(records)
    show(records)
    path = results.save(topic, records)
    results.write_beside(path, ".csv.gz", text)  # ncu's own output, for --from-csv
    print(f"saved to {path} (and .csv.gz)")
    return 0
