"""The multi-GPU mode of the QLoRA harness: one process a GPU, launched by ``torchrun``.

    launch(DistSpec("train", "70b", gpus=2, batch_size=1, cap_gb=40), data_path)

runs ``python -m torch.distributed.run --standalone --nproc-per-node 2 -m helpers.finetune.fsdp_point``
as a subprocess. Each process (rank) builds the same nf4 model (same seed, so the same weights),
attaches the same LoRA adapters and then either

* ``strategy="fsdp"``: shards everything with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``),
  one unit a decoder layer plus the root (embeddings, lm_head). The packed 4-bit weights are stored
  as bf16 (bitsandbytes' ``quant_storage``), so FSDP shards them like any bf16 tensor; bitsandbytes
  restores the quantisation state it keeps on the module when FSDP hands back the gathered weight;
* ``strategy="ddp"``: keeps a whole copy on every GPU and all-reduces the LoRA gradients (plain
  data parallelism: the scaling reference).

Every rank trains on its own slice of each global batch (``batch_size`` texts per GPU) with the
single-GPU harness's data, model, LoRA and memory-cap code, and measures what ``point`` measures.
Rank 0 gathers every rank's numbers into one flat record and writes the results file through
``helpers.results`` (topic ``fsdp``). At smoke scale the ranks are CPU processes joined by gloo.

Memory caps: the whole nf4 model is built on each GPU first (uncapped), then sharded; the cap
(``memory_caps.apply_cap``, CUDA context and NCCL buffers counted in) applies from the first training
step on. A real 2 x A100 40GB run would load each rank's shard instead; the training steps, which
set the peak, are the same.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import results
from ..device import HAS_CUDA, SCALE
from . import runner
from .point_spec import PointSpec

TOPIC = "fsdp"
FOLDER_GPUS = 2  # the two-GPU experiment's records (its 1-GPU references too) live in results/<gpu>x2/fsdp.json
KINDS = ("train", "allreduce")
STRATEGIES = ("fsdp", "ddp")
OOM_EXIT = 75  # a rank that ran out of memory exits with this after writing its record
# NVLink multicast must stay off on the lent machines (it can take a shared host's GPUs down):
# forced in every child environment, whatever the parent has
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class DistSpec:
    """One multi-process measurement. ``batch_size`` is per GPU; ``cap_gb`` per GPU (None: whole card).

    ``kind="allreduce"`` times ``torch.distributed.all_reduce`` of ``sizes_mb`` MiB (fp32) instead.
    """

    kind: str
    model: str = "tiny"
    gpus: int = 2
    batch_size: int = 1
    cap_gb: float | None = None
    strategy: str = "fsdp"
    lora_r: int = 16
    attn: str = "sdpa"
    grad_ckpt: bool = True
    max_len: int | None = None
    warmup_steps: int = 2
    timed_steps: int = 3
    seed: int = 0
    sizes_mb: tuple[float, ...] = field(default=(1, 16, 64, 256, 1024))
    iters: int = 10
    # PyTorch's expandable segments: blocks grow in place instead of new fixed-size segments, so
    # FSDP's all-gather buffers of many sizes do not strand memory (the cap counts reserved bytes)
    expandable_segments: bool = False

    def point(self) -> PointSpec:
        """The single-GPU point with the same per-GPU settings (its checks are reused)."""
        return PointSpec("train", self.model, self.batch_size, self.cap_gb, lora_r=self.lora_r, attn=self.attn,
                         grad_ckpt=self.grad_ckpt, max_len=self.max_len, warmup_steps=self.warmup_steps,
                         timed_steps=self.timed_steps)

    def key(self) -> str:
        if self.kind == "allreduce":
            return f"allreduce/gpus={self.gpus}/sizes={','.join(f'{s:g}' for s in self.sizes_mb)}/iters={self.iters}"
        return (f"{self.strategy}/gpus={self.gpus}/" + self.point().key().split("/", 1)[1]
                + ("/expandable" if self.expandable_segments else ""))

    def validate(self, gpus_available: int | None, card_gb: float | None = None) -> None:
        """Raise ValueError naming the problem. ``gpus_available``: this machine's GPUs (None: CPU processes)."""
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"gpus must be an integer >= 1, got {self.gpus!r}")
        if gpus_available is not None and self.gpus > gpus_available:
            raise ValueError(f"the run asks for {self.gpus} GPUs; this machine has {gpus_available}")
        if self.kind == "allreduce":
            if not self.sizes_mb or min(self.sizes_mb) <= 0:
                raise ValueError(f"sizes_mb must be positive sizes, got {self.sizes_mb}")
            if self.iters < 1:
                raise ValueError(f"iters must be >= 1, got {self.iters}")
            return
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        self.point().validate(card_gb)

    @classmethod
    def from_json(cls, text: str) -> "DistSpec":
        fields = json.loads(text)
        if "sizes_mb" in fields:
            fields["sizes_mb"] = tuple(fields["sizes_mb"])
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def machine_gpus() -> tuple[int | None, float | None]:
    """(GPU count, memory of the first in GiB) of this machine; (None, None) without CUDA.

    Read through NVML in the launching process, so it holds no CUDA context of its own."""
    if not HAS_CUDA:
        return None, None
    from .sweep import card_gb

    return torch.cuda.device_count(), card_gb()


def check(spec: DistSpec, scale: str = SCALE) -> None:
    """Validate ``spec`` for this machine: a full-scale run needs as many CUDA GPUs as it asks for."""
    if scale == "full" and not HAS_CUDA:
        raise RuntimeError("a full-scale multi-GPU run needs CUDA GPUs; this machine has none "
                           "(run at smoke scale: COURSE_SCALE=smoke, CPU processes joined by gloo)")
    count, card = machine_gpus()
    spec.validate(count, card)


def child_env(spec: DistSpec | None = None) -> dict[str, str]:
    """The environment of the launched processes: ours, the repository importable, multicast off,
    the allocator's expandable segments on when ``spec`` asks for them."""
    env = dict(os.environ)
    env.update(MULTICAST_OFF)
    if spec is not None and spec.expandable_segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(
            [c for c in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if c and "expandable_segments" not in c]
            + ["expandable_segments:True"])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(results.REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def command(spec: DistSpec, data_path: Path | None, out_dir: Path) -> list[str]:
    """The torchrun command line that runs ``spec``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.gpus}",
           "-m", "helpers.finetune.fsdp_point", "--spec", spec.to_json(), "--out-dir", str(out_dir)]
    return cmd + (["--data", str(data_path)] if data_path is not None else [])


def launch(spec: DistSpec, data_path: Path | None = None, *, timeout_s: float | None = None,
           progress: Callable[[str], None] | None = None) -> list[dict]:
    """Run ``spec`` on ``spec.gpus`` processes (GPUs, or CPU processes at smoke scale); its records
    (one for a training run, one a size for an all-reduce probe), as rank 0 saved them.

    A rank that runs out of memory ends the run (torchrun stops the others): the record then says
    ``status: "oom"`` with that rank's numbers. Any other failure raises RuntimeError with the log's tail.
    ``progress`` gets the ranks' reports (a training step done) as they come.
    """
    check(spec)
    if spec.kind == "train" and data_path is None:
        raise ValueError("a training run needs data_path (tokenized data from data.prepare().save())")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        proc = runner.run_child(command(spec, data_path, out_dir), progress, child_env(spec), timeout=timeout_s)
        done = out_dir / "records.json"
        if proc.returncode == 0 and done.exists():
            return json.loads(done.read_text())
        ooms = sorted(out_dir.glob("oom-rank*.json"))
        if ooms:
            return save_records(json.loads(ooms[0].read_text()))
        raise runner.failure(spec.key(), proc, lines=25)


def same_setting(a: dict, b: dict) -> bool:
    """Two training records that differ at most in GPU count and strategy (a scaling pair)."""
    keys = ("model", "batch_size", "cap_gb", "lora_r", "attn", "max_len", "grad_ckpt")
    return (all(a.get(k) == b.get(k) for k in keys)  # records from before the allocator setting existed: off
            and bool(a.get("expandable_segments")) == bool(b.get("expandable_segments")))


def with_scaling(records: list[dict]) -> list[dict]:
    """``records`` with ``scaling_efficiency`` = tokens/s on N GPUs / (N x tokens/s on 1 GPU, same
    per-GPU batch and settings); None where there is no 1-GPU reference or the run did not train."""
    out = []
    for r in records:
        eff = None
        if r.get("kind") == "train" and r.get("status") == "ok" and r["gpus"] > 1:
            refs = [q for q in records if q.get("kind") == "train" and q.get("status") == "ok" and q["gpus"] == 1
                    and same_setting(q, r)]
            if refs:
                eff = r["tokens_per_s"] / (r["gpus"] * refs[0]["tokens_per_s"])
        out.append({**r, "scaling_efficiency": eff} if r.get("kind") == "train" else r)
    return out


FULL_TIMED_STEPS = 10  # timed steps of every training run of the full plan


def timed_step_count(record: dict) -> int | None:
    """The steps a training record timed: its ``timed_steps``, or the count in its point key
    (``.../steps=W+T``) for records from before that field existed."""
    if record.get("timed_steps"):
        return int(record["timed_steps"])
    found = re.search(r"/steps=\d+\+(\d+)", record.get("point", ""))
    return int(found.group(1)) if found else None


def scaling_spread(records: list[dict], min_steps: int = FULL_TIMED_STEPS) -> list[dict]:
    """Every scaling pair of ``records`` (a run on N GPUs and its 1-GPU reference): the efficiency, its range
    from the two runs' step-time spreads, and whether it is ``decided``: both runs timed at least
    ``min_steps`` steps and recorded their spread (``step_s_min``, ``step_s_max``). Otherwise ``why`` says
    what is missing: an efficiency from a few steps cannot tell 1.02 from 0.98."""
    rows = []
    for r in with_scaling(records):
        if r.get("scaling_efficiency") is None:
            continue
        ref = next(q for q in records if q.get("kind") == "train" and q.get("status") == "ok" and q["gpus"] == 1
                   and same_setting(q, r))
        steps = (timed_step_count(r), timed_step_count(ref))
        spread = all(q.get("step_s_min") and q.get("step_s_max") for q in (r, ref))
        eff = r["scaling_efficiency"]
        low = high = None
        if spread:  # tokens/s is tokens / step time: the slowest N-GPU step against the fastest 1-GPU step, and back
            low = eff * r["step_s"] / r["step_s_max"] * ref["step_s_min"] / ref["step_s"]
            high = eff * r["step_s"] / r["step_s_min"] * ref["step_s_max"] / ref["step_s"]
        too_few = [n for n in steps if n is None or n < min_steps]
        why = ("" if spread and not too_few else
               f"{steps[0]} and {steps[1]} timed steps (at least {min_steps} needed)" if too_few else
               "no step-time spread recorded")
        rows.append({"model": r["model"], "strategy": r["strategy"], "gpus": r["gpus"], "batch_size": r["batch_size"],
                     "efficiency": eff, "low": low, "high": high, "timed_steps": steps[0],
                     "reference_timed_steps": steps[1], "decided": not why, "why": why})
    return rows


def save_records(records: list[dict]) -> list[dict]:
    """Add ``records`` to the results file (replacing earlier runs of the same points), scaling
    efficiencies recomputed; ``records`` as saved, each with the file's path."""
    try:
        old = load_records().records
    except FileNotFoundError:
        old = []
    points = {r["point"] for r in records}
    saved = with_scaling([r for r in old if r.get("point") not in points] + records)
    path = results.save(TOPIC, saved, gpus=FOLDER_GPUS)
    return [{**r, "results_file": str(path)} for r in saved if r["point"] in points]


def load_records(scale: str = SCALE) -> results.Result:
    """The results file of this machine's GPU model and this scale (``results/<gpu>x2/fsdp.json``)."""
    return results.load(TOPIC, gpu=results.gpu_slug(count=FOLDER_GPUS), scale=scale)


SEED_SETTINGS = {"attn": "eager", "max_len": 1024, "lora_r": 16}  # notebook 06's main settings (the seed's stack)


def full_plan() -> list[DistSpec]:
    """The notebook's runs on two GPUs, in the order that answers the issue first: 70B sharded under
    2 x 40 GB at growing batches with the default allocator and with expandable segments, 70B at
    batch 1 uncapped (its peak is the smallest card it needs), 7B on one GPU and on two (data
    parallel and sharded: the scaling pair), the all-reduce probe. Every training run times 10 steps after
    two of warm-up, so that its spread (``step_s_min``, ``step_s_max``) can be reported beside the median."""
    seed = dict(SEED_SETTINGS, warmup_steps=2, timed_steps=FULL_TIMED_STEPS)
    return ([DistSpec("train", "70b", 2, b, 40, "fsdp", **seed) for b in (1, 2, 4, 8, 16)]
            + [DistSpec("train", "70b", 2, 1, None, "fsdp", **seed)]
            + [DistSpec("train", "7b", g, 4, None, s, **seed) for g, s in ((1, "ddp"), (2, "ddp"), (2, "fsdp"))]
            + [DistSpec("allreduce", gpus=2, sizes_mb=(1, 4, 16, 64, 256, 1024), iters=20)]
            + [DistSpec("train", "70b", 2, b, 40, "fsdp", expandable_segments=True, **seed) for b in (1, 2, 4, 8, 16)]
            + [DistSpec("train", "70b", 2, 1, None, "fsdp", expandable_segments=True, **seed)])


def smoke_plan() -> list[DistSpec]:
    """The same code paths at smoke scale: CPU processes joined by gloo, the tiny Llama, short texts,
    a simulated 0.05 GiB cap; the sharded run on two processes (default allocator and expandable
    segments, which CPU processes ignore) and its one-process reference."""
    tiny = dict(lora_r=16, attn="sdpa", max_len=32, warmup_steps=1, timed_steps=2)
    return ([DistSpec("train", "tiny", g, 1, 0.05, "fsdp", **tiny) for g in (2, 1)]
            + [DistSpec("allreduce", gpus=2, sizes_mb=(0.1, 1), iters=3)]
            + [DistSpec("train", "tiny", 2, 1, 0.05, "fsdp", expandable_segments=True, **tiny)])


def record_point(record: dict) -> str:
    """The key of the run a saved record belongs to: an all-reduce probe saves one record a size."""
    return record["point"].split("/size=")[0]


def _store() -> runner.Store:
    """The finished runs: the results file alone (rank 0 saves each run's records to it)."""
    def load() -> list[dict]:
        return load_records().records

    def save(records: list[dict]) -> None:
        results.save(TOPIC, with_scaling(records), gpus=FOLDER_GPUS)

    return runner.Store(None, TOPIC, load=load, save=save, point_of=record_point)


def run_plan(specs: list[DistSpec], data_path: Path | None = None, *, budget_s: float | None = None,
             progress: bool = True) -> list[dict]:
    """Run the runs of ``specs`` not in the results file yet; every record of the file afterwards.

    Resumable: a run already saved is not run again, so a plan longer than one device call's limit
    finishes over several calls (``budget_s``: start no new run after this many seconds). A larger
    batch than one that ran out of memory, same settings, is recorded as out of memory without
    running (``measured: False``). The runs go one at a time, in the plan's order (``runner.run``)."""
    for spec in specs:
        check(spec)
    if any(s.kind == "train" for s in specs) and data_path is None:
        from ..llama.data import data_file

        data_path = data_file()

    def launched(spec: DistSpec, gpu: str | None, report: Callable[[str], None]) -> None:
        launch(spec, data_path, progress=report)  # rank 0 saves its records: the runner reads them back

    def skipped(spec: DistSpec, below_record: dict, below: DistSpec) -> dict:
        return {**runner.not_run(spec, below_record, below), "global_batch": spec.batch_size * spec.gpus}

    plan = runner.Plan(specs, _store, run_point=launched, group=DistSpec.key, skipped=skipped,
                       desc="multi-GPU runs", unit="run")
    runner.run(plan, budget_s=budget_s, progress=progress)
    return load_records().records
