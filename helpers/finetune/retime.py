"""The sweep's step times measured again over more steps, the model built once per group of points.

    python -m helpers.finetune.retime --budget-s 480     # a chunk of the full plan; run again to go on
    python -m helpers.finetune.retime --models 13b --max-batch 4 --caps 40 48   # what a verdict reads, first

A sweep point (``helpers.finetune.sweep_point``) builds its model in a fresh process, so that its peak memory and its
out-of-memory verdict owe nothing to an earlier point; it times only a few steps. Small batches wait on the
host, so a few steps leave their time uncertain. This module times every point that trained again, over
``TIMED_STEPS`` steps: one process per group (one model, cap and setting), the model built and LoRA attached
once, then each batch size in turn on the sweep's own batches (the same warm-up and first timed texts, then
more of the same shuffle), the allocator's cache emptied between batch sizes. The adapter goes on training
from one batch size to the next: a step's time does not depend on its values. Each batch is padded to its
own longest text, so the steps of one point differ in shape, and a point's spread (min to max) is partly
the data's. Two points that differ only in their cap run the same batches: their medians' difference is
the measurement's own noise. The records keep each step's time over its padded tokens too (median, min,
max), a spread with the shapes' share taken out.

Memory stays the sweep's measurement. This module's records hold times (and, on a GPU, each batch size's peak
reserved memory beside the model built once; ``results/<gpu>/finetune_timing.json``, one a point, saved as each
finishes, resumed like the sweep), and :func:`merged` puts their times into the sweep's records.
:func:`time_here` runs the same groups without saving: a card's own few points beside a committed sweep.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from .. import children, results
from ..device import SCALE, pick
from . import distributed, runner
from ..llama.data import TokenizedData, data_file, make_batches
from ..llama.lora import LoraSettings, attach_lora, check_checkpointing
from ..llama.memory_caps import apply_cap, is_oom
from ..llama.models import build_model
from .point_spec import PointSpec, base_record, full_plan, plan
from .timing import run_timed_steps

TOPIC = "finetune_timing"
TIMED_STEPS = pick(full=10, smoke=2)
TIMING_FIELDS = ("step_s", "step_s_min", "step_s_max", "timed_steps", "tokens_per_s", "samples_per_s",
                 "mean_seq_len", "mean_padded_len", "gpu_util_pct")


def todo(points: list[PointSpec], sweep_records: list[dict]) -> list[PointSpec]:
    """The training points of ``points`` that the sweep measured and that trained (out of memory: nothing to time)."""
    ok = {r["point"] for r in sweep_records if r.get("kind") == "train" and r.get("status") == "ok"
          and r.get("measured", True)}
    return [p for p in points if p.kind == "train" and p.key() in ok]


def select(points: list[PointSpec], models: list[str] | None = None, max_batch: int | None = None,
           caps: list[float | None] | None = None) -> list[PointSpec]:
    """The points of ``points`` of ``models``, at batch sizes up to ``max_batch`` and under ``caps`` (None as a
    cap: the whole card); an argument left None keeps every value. To re-time first what a verdict reads."""
    return [p for p in points if (models is None or p.model in models)
            and (max_batch is None or p.batch_size <= max_batch) and (caps is None or p.cap_gb in caps)]


def time_group(specs: list[PointSpec], data: TokenizedData, device: torch.device, deadline: float,
               on_record: Callable[[dict], None]) -> None:
    """Time each of ``specs`` (one group, batch sizes in order) in this process, the model built once;
    ``on_record`` gets each point's record as it finishes. No point starts after ``deadline`` (time.time());
    running out of memory (possible here, where the sweep's fresh process fitted) ends the group."""
    first = specs[0]
    if device.type == "cuda":
        apply_cap(first.cap_gb)
    model, _ = build_model(first.model, device, vocab_size=data.vocab_size, attn=first.attn)
    model = attach_lora(model, LoraSettings(r=first.lora_r), gradient_checkpointing=first.grad_ckpt)
    checkpointing = check_checkpointing(model, torch.tensor([data.token_ids[0][:16]], device=device))
    if checkpointing != first.grad_ckpt:  # the sweep measured the other kind of step: its times would not be its own
        raise RuntimeError(f"{first.key()}: gradient checkpointing {'off' if first.grad_ckpt else 'on'} in "
                           "training, where the point asks for the opposite")
    for spec in specs:
        if time.time() >= deadline:
            return
        batches = make_batches(data.token_ids, spec.batch_size, spec.warmup_steps + TIMED_STEPS, spec.max_len)
        timed = batches[spec.warmup_steps:]
        record = {"kind": "train", **base_record(spec, device), "batch_size": spec.batch_size,
                  "warmup_steps": spec.warmup_steps, "timed_steps": TIMED_STEPS, "checkpointing": checkpointing}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            times, monitor, _ = run_timed_steps(model, batches, device, spec.warmup_steps, None)
        except Exception as error:
            if not is_oom(error):
                raise
            on_record({**record, "status": "oom", "oom_message": str(error).splitlines()[0][:200]})
            return
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        on_record({**record, "status": "ok", "step_s": statistics.median(times), "step_s_min": min(times),
                   "step_s_max": max(times), "step_s_mean": statistics.fmean(times),
                   **_per_padded_token(times, timed),
                   "tokens_per_s": sum(int(b["attention_mask"].sum()) for b in timed) / sum(times),
                   "samples_per_s": spec.batch_size * len(times) / sum(times),
                   "mean_seq_len": statistics.fmean(float(b["attention_mask"].sum(1).float().mean()) for b in timed),
                   "mean_padded_len": statistics.fmean(b["input_ids"].shape[1] for b in timed),
                   "gpu_util_pct": monitor.get("util_pct_mean"),
                   "peak_reserved_gb": torch.cuda.max_memory_reserved() / 2**30 if device.type == "cuda" else None})


def _per_padded_token(times: list[float], timed: list[dict]) -> dict:
    """Each step's time over its padded tokens (batch x width): its median, min and max, a spread the
    batches' differing shapes leave out."""
    per = [t / b["input_ids"].numel() for t, b in zip(times, timed)]
    return {"s_per_padded_token": statistics.median(per), "s_per_padded_token_min": min(per),
            "s_per_padded_token_max": max(per)}


def _run_child(specs: list[PointSpec], data_path: Path, deadline: float, store_path: Path,
               progress: Callable[[str], None]) -> None:
    """One group in a fresh process, which appends each point's record to the progress file at ``store_path`` as
    it finishes: a child that fails, or a run killed part way, keeps every point finished."""
    cmd = [sys.executable, "-m", "helpers.finetune.retime", "--group", json.dumps([s.to_json() for s in specs]),
           "--data", str(data_path), "--deadline", str(deadline), "--progress-file", str(store_path)]
    proc = runner.run_child(cmd, progress)
    if proc.returncode != 0:
        raise runner.failure(f"re-timing {specs[0].key()} and its group", proc)


def run(points: list[PointSpec], sweep_records: list[dict], *, budget_s: float | None = None,
        data_path: Path | None = None, store_path: Path | None = None, progress: bool = True) -> list[dict]:
    """Re-time the points of ``points`` that trained in the sweep and are not re-timed yet; every record saved.
    ``budget_s``: start no new point after this many seconds (0 starts none)."""
    store_path = Path(store_path or runner.default_store(TOPIC))
    data_path = Path(data_path) if data_path else data_file()

    def run_group(group: list[PointSpec], gpu: str | None, deadline: float, report: Callable[[str], None]) -> None:
        _run_child(group, data_path, deadline, store_path, report)

    plan = runner.Plan(todo(points, sweep_records), lambda: runner.Store(store_path, TOPIC), run_group=run_group,
                       desc="re-timing")
    return runner.run(plan, budget_s=budget_s, progress=progress).records()


def time_here(points: list[PointSpec], *, budget_s: float, data_path: Path | None = None) -> list[dict]:
    """Time ``points`` on this machine now, one child a group (one model, cap and setting: the model built once),
    saving nothing; their records. No point starts after ``budget_s`` seconds; running out of memory ends a group."""
    data_path = Path(data_path) if data_path else data_file()
    deadline = time.time() + budget_s

    def setting(p: PointSpec) -> tuple:
        return p.model, p.cap_gb, p.lora_r, p.attn, p.grad_ckpt, p.max_len

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "progress.jsonl"
        for _, group in itertools.groupby(points, key=setting):
            if time.time() < deadline:
                _run_child(list(group), data_path, deadline, store, lambda report: None)
        lines = store.read_text().splitlines() if store.exists() else []
    return [r for line in lines for r in json.loads(line)["records"]]


def merged(sweep_records: list[dict], timing_records: list[dict]) -> list[dict]:
    """The sweep's records with each re-timed point's times (``TIMING_FIELDS``) in place of the sweep's own,
    and ``timed_from`` naming where the times come from ("re-timed" with its commit, or "sweep")."""
    timed = {r["point"]: r for r in timing_records if r.get("status") == "ok"}
    out = []
    for r in sweep_records:
        t = timed.get(r["point"]) if r.get("status") == "ok" else None
        if t is None:
            out.append({**r, "timed_steps": distributed.timed_step_count(r), "timed_from": "sweep"})
        else:
            out.append({**r, **{k: t[k] for k in TIMING_FIELDS},
                        "timed_from": f"re-timed at {t['git_commit'][:12]}, {t['measured_at'][:16]}"})
    return out


def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True, help="the group's points: a JSON list of PointSpec JSON")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--deadline", required=True, type=float, help="time.time() after which no point starts")
    parser.add_argument("--progress-file", required=True, type=Path,
                        help="the progress file the records are appended to (a line a point) as they finish")
    args = parser.parse_args(argv)
    children.die_with_parent()
    specs = [PointSpec.from_json(s) for s in json.loads(args.group)]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def write(record: dict) -> None:
        runner.append(args.progress_file, record["point"], [record])
        children.report_progress(f"batch {record['batch_size']} {record['status']}")

    time_group(specs, TokenizedData.load(args.data), device, args.deadline, write)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--group" in argv:
        return _child(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=None, help="start no new point after this many seconds")
    parser.add_argument("--models", nargs="+", default=None, help="only these models (default: all)")
    parser.add_argument("--max-batch", type=int, default=None, help="only batch sizes up to this one")
    parser.add_argument("--caps", nargs="+", default=None,
                        help="only these memory caps in GiB, 'none' for the whole card (default: all)")
    args = parser.parse_args(argv)
    caps = None if args.caps is None else [None if c == "none" else float(c) for c in args.caps]
    points = pick(full=full_plan, smoke=lambda: plan(["tiny"], [1, 2, 4], [0.15], generate=False, max_len=128))()
    points = select(points, args.models, args.max_batch, caps)
    sweep_records = results.load("finetune", scale=SCALE).records
    records = run(points, sweep_records, budget_s=args.budget_s)
    left = [p for p in todo(points, sweep_records) if p.key() not in {r["point"] for r in records}]
    print(f"{len(records)} re-timed points saved to {results.path_for(TOPIC)}; {len(left)} left")


if __name__ == "__main__":
    main()
