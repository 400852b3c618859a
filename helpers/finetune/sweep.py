"""The sweep: model x batch size x memory cap (and generation per model and cap), one process a point.

    python -m helpers.finetune.sweep --full-plan --budget-s 400     # a chunk; run again to go on
    python -m helpers.finetune.sweep --full-plan --gpus 0 1         # two GPUs, a point on each at a time

Each point runs in a subprocess (``python -m helpers.finetune.sweep_point``), so an out-of-memory error
or a crash cannot poison the next point. As each point finishes, its records are appended to a
progress file (one JSON line a point, flushed to disk) and the whole results file is rewritten
through ``helpers.results.save("finetune", ...)``. Re-running resumes: points already in the
progress file or in the existing results file are never run again, and nothing finished is lost.
A larger batch at the same model and cap as one that ran out of memory is recorded as out of
memory without running it (``measured: False``): memory grows with the batch, because every
batch size's first step holds its longest texts.

On a machine with several GPUs, ``--gpus`` runs one point per GPU at a time (each subprocess sees
only its own GPU); a worker takes a whole group (one model, cap and setting, its batch sizes in
order), so the out-of-memory rule above still saves the work it saves on one GPU. Each point still
owns its GPU alone; the two only share the host's CPU cores.

The plans (``plan``, ``full_plan``) are ``point_spec``'s, cut to a card by ``card_plan``; resuming, the budget, the
GPUs' workers and the out-of-memory rule are the runner's (``runner.run``), which the re-timing and the two-GPU runs
share.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from .. import results
from ..device import HAS_CUDA, SCALE, pick
from ..llama.data import TokenizedData, data_file
from ..llama.memory_caps import GiB
from ..llama.models import MODELS
from ..card_fit import this_card
from .card_plan import sweep_plan
from .point_spec import BATCH_SIZES, NEW_TOKENS, SEED_MAX_LEN, PointSpec, plan
from .runner import Plan, Store, default_store, failure, run, run_child
from .runner import pending as pending_points

TOPIC = "finetune"

# (point, data file, GPU id or None, a function that takes the point's progress reports) -> its records
Runner = Callable[[PointSpec, Path, "str | None", Callable[[str], None]], list[dict]]


def card_gb() -> float | None:
    """This machine's GPU memory in GiB, read through NVML (no CUDA context in the sweep's own process)."""
    if not HAS_CUDA:
        return None
    import pynvml

    pynvml.nvmlInit()
    try:
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        handle = (pynvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit()
                  else pynvml.nvmlDeviceGetHandleByUUID(first) if first.startswith(("GPU-", "MIG-"))
                  else pynvml.nvmlDeviceGetHandleByIndex(0))
        return pynvml.nvmlDeviceGetMemoryInfo(handle).total / GiB
    finally:
        pynvml.nvmlShutdown()


def validate(points: list[PointSpec], scale: str = SCALE) -> None:
    """Check every point before any runs: names, sizes, caps against this card, a GPU for a full run."""
    if not points:
        raise ValueError("the sweep has no points")
    if scale == "full" and not HAS_CUDA:
        raise RuntimeError("a full-scale sweep needs a CUDA GPU; this machine has none "
                           "(run at smoke scale: COURSE_SCALE=smoke)")
    card = card_gb()
    for point in points:
        point.validate(card)
    keys = [p.key() for p in points]
    if len(set(keys)) != len(keys):
        raise ValueError("the sweep lists a point twice")


def visible_gpus() -> list[str] | None:
    """The GPU ids for ``run_sweep(gpus=...)``: every GPU this process sees when it sees more than one."""
    if not HAS_CUDA:
        return None
    import torch

    count = torch.cuda.device_count()  # NVML-based: creates no CUDA context in the sweep's process
    return [str(i) for i in range(count)] if count > 1 else None


def _child_devices(gpu: str) -> str:
    """CUDA_VISIBLE_DEVICES for a child that must see only ``gpu``, an index among the GPUs this process sees."""
    mine = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return mine[int(gpu)] if mine and gpu.isdigit() and int(gpu) < len(mine) else gpu


def subprocess_runner(spec: PointSpec, data_path: Path, gpu: str | None = None,
                      progress: Callable[[str], None] | None = None) -> list[dict]:
    """Run one point in a fresh Python process (seeing only GPU ``gpu`` when given); its records.
    ``progress`` gets the child's reports (a training step, a generation length done) as they come."""
    env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": _child_devices(gpu)} if gpu is not None else {}))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "records.json"
        cmd = [sys.executable, "-m", "helpers.finetune.sweep_point", "--spec", spec.to_json(), "--data", str(data_path),
               "--out", str(out)]
        proc = run_child(cmd, progress, env)
        if proc.returncode != 0 or not out.exists():
            raise failure(f"point {spec.key()}", proc)
        return json.loads(out.read_text())


def _store(store_path: Path | None) -> Store:
    return Store(store_path or default_store(TOPIC), TOPIC)


def run_sweep(points: list[PointSpec], *, data_path: Path | None = None, store_path: Path | None = None,
              runner: Runner = subprocess_runner, budget_s: float | None = None, progress: bool = True,
              gpus: Sequence[str] | None = None) -> list[dict]:
    """Run the points not yet finished, saving after each; returns every finished record.

    ``budget_s``: start no new point after this many seconds (so one call stays inside a time limit;
    run again to continue); 0 starts none and returns what is saved. ``gpus``: GPU ids to run on, one
    point on each at a time (None: the default device, one point at a time). Points are checked before
    any runs. Resuming, the budget, the GPUs' workers and the points not run after an out-of-memory
    batch: ``runner.run``.
    """
    validate(points)
    data_path = Path(data_path) if data_path else data_file()
    TokenizedData.load(data_path)  # readable before any point starts

    def measure(point: PointSpec, gpu: str | None, report: Callable[[str], None]) -> list[dict]:
        return [{**r, "measured": True} for r in runner(point, data_path, gpu, report)]

    plan = Plan(points, lambda: _store(store_path), run_point=measure, desc="fine-tuning sweep")
    return run(plan, budget_s=budget_s, progress=progress, gpus=gpus).records()


def pending(points: list[PointSpec], store_path: Path | None = None) -> list[PointSpec]:
    """The points of ``points`` not finished yet."""
    return pending_points(points, _store(store_path))


def cli() -> argparse.ArgumentParser:
    """The sweep's command line; its defaults follow the scale (notebook 06's plan at each)."""
    parser = argparse.ArgumentParser(description=f"Run (or resume) the QLoRA fine-tuning sweep (scale {SCALE}: "
                                     "defaults to " + pick(full="the Llama-2 models", smoke="the tiny Llama") + ").")
    parser.add_argument("--full-plan", action="store_true",
                        help="the notebook's whole sweep, less what this card cannot hold (other options ignored)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=pick(full=["7b", "13b", "70b"],
                                                                                   smoke=["tiny"]))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=pick(full=list(BATCH_SIZES), smoke=[1, 2, 4]))
    parser.add_argument("--caps", nargs="+", default=pick(full=["none", "40", "48"], smoke=["0.15"]),
                        help="GiB, or 'none' for the whole card")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--attn", default=pick(full="eager", smoke="sdpa"))
    parser.add_argument("--max-len", type=int, default=pick(full=SEED_MAX_LEN, smoke=128), help="0: no truncation")
    parser.add_argument("--new-tokens", nargs="+", type=int, default=pick(full=list(NEW_TOKENS), smoke=[4, 8]),
                        help="generation lengths of the generate points")
    parser.add_argument("--no-generate", action="store_true")
    parser.add_argument("--budget-s", type=float, default=None, help="start no new point after this many seconds")
    parser.add_argument("--gpus", nargs="+", default=None, help="GPU ids to run on, one point on each at a time")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = cli().parse_args(argv)
    caps = [None if c == "none" else float(c) for c in args.caps]
    if args.full_plan:  # the notebook's plan for this card: what it cannot hold left out, each with a line
        card = sweep_plan(pick(full=this_card, smoke=lambda: None)())
        print("\n".join(card.lines) or "the whole plan fits this card")
    points = card.points if args.full_plan else plan(
        args.models, args.batch_sizes, caps, generate=not args.no_generate, lora_r=args.lora_r, attn=args.attn,
        max_len=args.max_len or None, new_tokens=tuple(args.new_tokens))
    records = run_sweep(points, budget_s=args.budget_s, gpus=args.gpus)
    left = pending(points)
    print(f"{len(records)} records saved to {results.path_for(TOPIC)}; {len(left)} of {len(points)} points left")


if __name__ == "__main__":
    main()
