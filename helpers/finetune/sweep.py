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
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .. import children, results
from ..datasheets import CAPS
from ..device import HAS_CUDA, SCALE, pick
from ..llama.data import TokenizedData, data_file
from ..llama.memory_caps import GiB
from ..llama.models import MODELS
from .point_spec import PointSpec

TOPIC = "finetune"
BATCH_SIZES = (1, 2, 4, 8, 16, 20, 25, 32)
NEW_TOKENS = (64, 128, 256, 512)
SEED_MAX_LEN = 1024

# (point, data file, GPU id or None, a function that takes the point's progress reports) -> its records
Runner = Callable[[PointSpec, Path, "str | None", Callable[[str], None]], list[dict]]


def full_plan() -> list[PointSpec]:
    """The notebook's sweep at full scale, in the order that answers the seed's claims first.

    The seed's stack: eager attention (transformers 4.31 had no fused attention for Llama) and texts
    cut at 1,024 tokens (trl's SFTTrainer default when ``max_seq_length`` is not given, as in the
    seed's script). First the two emulated cards for every model, then 70B at LoRA ranks 8 and 2
    under the 40 GB cap (the seed's A100 attempts), then the whole card, one 7B point without
    gradient checkpointing, and 7B with today's fused attention (sdpa).
    """
    seed = {"attn": "eager", "max_len": SEED_MAX_LEN}
    models = ("7b", "13b", "70b")
    return (plan(models, caps=(40, 48), **seed)
            + [PointSpec("train", "70b", 1, 40, lora_r=r, **seed) for r in (8, 2)]
            + plan(models, caps=(None,), **seed)
            + [PointSpec("train", "7b", 4, None, grad_ckpt=False, **seed)]
            + plan(("7b",), caps=(None,), attn="sdpa", max_len=SEED_MAX_LEN))


def plan(models: Iterable[str] = ("7b", "13b", "70b"), batch_sizes: Iterable[int] = BATCH_SIZES,
         caps: Iterable[float | None] = tuple(CAPS), *, generate: bool = True, **spec_fields) -> list[PointSpec]:
    """The points of a sweep, in the order they run: per model, per cap, batch sizes growing, then generation."""
    points = []
    for model in models:
        for cap in caps:
            points += [PointSpec("train", model, batch, cap, **spec_fields) for batch in batch_sizes]
            if generate:
                gen_fields = {k: v for k, v in spec_fields.items() if k in ("lora_r", "attn", "new_tokens")}
                points.append(PointSpec("generate", model, 1, cap, **{"new_tokens": NEW_TOKENS, **gen_fields}))
    return points


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
        proc = children.run(cmd, on_progress=progress, cwd=results.REPO_ROOT, env=env)  # dies with this process
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise RuntimeError(f"point {spec.key()} failed (exit {proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def default_store(topic: str = TOPIC) -> Path:
    """The progress file of ``topic``, one per scale and GPU: git-ignored under ``build/``, or beside the results
    where ``COURSE_RESULTS_DIR`` moves them (so that the two never come from different places)."""
    moved = os.environ.get("COURSE_RESULTS_DIR")
    root = Path(moved) if moved else results.REPO_ROOT / "build"
    return root / f"{topic.replace('_', '-')}-progress" / f"{SCALE}-{results.gpu_slug()}.jsonl"


class Store:
    """Finished points: the progress file (appended a line a point) merged with the results file of ``topic``."""

    def __init__(self, path: Path, topic: str = TOPIC) -> None:
        self.path = Path(path)
        self.topic = topic
        self.done: dict[str, list[dict]] = {}
        try:  # what earlier runs saved (on the GPU machine the results file is what travels between calls)
            for record in results.load(topic, scale=SCALE).records:
                self.done.setdefault(record["point"], []).append(record)
        except FileNotFoundError:
            pass
        in_results = dict(self.done)
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a kill: that point did not finish
                        continue
                    self.done[entry["point"]] = entry["records"]
        self.lock = threading.Lock()
        if any(in_results.get(point) != recs for point, recs in self.done.items()):
            results.save(topic, self.records())  # a run killed between its two writes: the results file catches up

    def add(self, point: str, records: list[dict]) -> None:
        """Append a finished point to the progress file and rewrite the results file (thread-safe)."""
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({"point": point, "records": records}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.done[point] = records
            results.save(self.topic, self.records())

    def records(self) -> list[dict]:
        return [r for recs in self.done.values() for r in recs]


def _oom_below(point: PointSpec, done: dict[str, list[dict]]) -> PointSpec | None:
    """A finished smaller-batch point of the same model, cap and settings that ran out of memory."""
    if point.kind != "train":
        return None
    for smaller in range(1, point.batch_size):
        recs = done.get(replace(point, batch_size=smaller).key())
        if recs and recs[0]["status"] == "oom":
            return replace(point, batch_size=smaller)
    return None


def groups(points: list[PointSpec]) -> list[list[PointSpec]]:
    """``points`` split into groups that differ only in batch size (plan order kept): one worker's unit."""
    out: dict[str, list[PointSpec]] = {}
    for p in points:
        out.setdefault(replace(p, batch_size=1).key(), []).append(p)
    return list(out.values())


def run_sweep(points: list[PointSpec], *, data_path: Path | None = None, store_path: Path | None = None,
              runner: Runner = subprocess_runner, budget_s: float | None = None, progress: bool = True,
              gpus: Sequence[str] | None = None) -> list[dict]:
    """Run the points not yet finished, saving after each; returns every finished record.

    ``budget_s``: start no new point after this many seconds (so one call stays inside a time limit;
    run again to continue); 0 starts none and returns what is saved. ``gpus``: GPU ids to run on, one
    point on each at a time (None: the default device, one point at a time). Points are checked before
    any runs.
    """
    from tqdm.auto import tqdm

    validate(points)
    if budget_s is not None and budget_s < 0:
        raise ValueError(f"budget_s must be >= 0, got {budget_s}")
    if gpus is not None and (not gpus or len(set(gpus)) != len(gpus)):
        raise ValueError(f"gpus must be distinct GPU ids, got {list(gpus)}")
    data_path = Path(data_path) if data_path else data_file()
    TokenizedData.load(data_path)  # readable before any point starts
    store = Store(store_path or default_store())
    todo = queue.Queue()
    for group in groups([p for p in points if p.key() not in store.done]):
        todo.put(group)
    start = time.perf_counter()
    bar = tqdm(total=len(points), initial=len(points) - sum(len(g) for g in todo.queue), desc="fine-tuning sweep",
               unit="point", disable=not progress)
    failures: list[BaseException] = []

    def work(gpu: str | None) -> None:
        while not failures:
            try:
                group = todo.get_nowait()
            except queue.Empty:
                return
            for point in group:
                if failures or (budget_s is not None and time.perf_counter() - start >= budget_s):
                    return
                bar.set_postfix_str(point.key())
                below = _oom_below(point, store.done)
                if below is not None:
                    first = store.done[below.key()][0]
                    records = [{**first, "point": point.key(), "batch_size": point.batch_size, "measured": False,
                                "oom_message": f"not run: batch {below.batch_size} already ran out of memory"}]
                else:
                    try:
                        def report(text: str, key: str = point.key()) -> None:
                            bar.set_postfix_str(f"{key}: {text}")

                        records = [{**r, "measured": True} for r in runner(point, data_path, gpu, report)]
                    except BaseException as error:  # stop the other workers too, re-raised below
                        failures.append(error)
                        return
                store.add(point.key(), records)
                bar.update(1)

    try:
        if gpus is None:
            work(None)
        else:
            threads = [threading.Thread(target=work, args=(gpu,), daemon=True) for gpu in gpus]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        bar.close()
    if failures:
        raise failures[0]
    return store.records()


def pending(points: list[PointSpec], store_path: Path | None = None) -> list[PointSpec]:
    """The points of ``points`` not finished yet."""
    done = Store(store_path or default_store()).done
    return [p for p in points if p.key() not in done]


def cli() -> argparse.ArgumentParser:
    """The sweep's command line; its defaults follow the scale (notebook 06's plan at each)."""
    parser = argparse.ArgumentParser(description=f"Run (or resume) the QLoRA fine-tuning sweep (scale {SCALE}: "
                                     "defaults to " + pick(full="the Llama-2 models", smoke="the tiny Llama") + ").")
    parser.add_argument("--full-plan", action="store_true", help="the notebook's whole sweep (other options ignored)")
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
    points = full_plan() if args.full_plan else plan(
        args.models, args.batch_sizes, caps, generate=not args.no_generate, lora_r=args.lora_r, attn=args.attn,
        max_len=args.max_len or None, new_tokens=tuple(args.new_tokens))
    records = run_sweep(points, budget_s=args.budget_s, gpus=args.gpus)
    left = pending(points)
    print(f"{len(records)} records saved to {results.path_for(TOPIC)}; {len(left)} of {len(points)} points left")


if __name__ == "__main__":
    main()
