"""One measurement of the sweep, meant to run in a process of its own:

    python -m helpers.finetune.point --spec '{"kind": "train", "model": "7b", ...}' --data D --out O

A ``train`` point builds the model, attaches LoRA, runs warm-up and timed training steps and
measures step time, tokens/s, peak memory and (on a GPU) utilisation; a ``generate`` point times
``generate()`` at batch 1 with the adapter attached. Both write their records to ``--out``. Running
out of memory is a result: the point records ``status: "oom"`` and exits normally.

Memory caps: on a GPU, ``torch.cuda.set_per_process_memory_fraction`` limits the caching allocator
to the emulated card's memory minus this process's CUDA context (the driver's own allocation,
which the allocator never sees but the card must hold). Without a GPU (smoke scale) the cap is
simulated: the bytes of the model plus the activations autograd saves for the backward pass are
counted, and passing the cap raises the same ``torch.cuda.OutOfMemoryError``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .. import results
from .data import TokenizedData, make_batches
from .lora import LoraSettings, attach_lora, check_checkpointing
from .models import MODELS, build_model, model_bytes

GiB = 2**30
KINDS = ("train", "generate")
ATTN = ("sdpa", "eager")


@dataclass(frozen=True)
class PointSpec:
    """What one point measures. ``cap_gb``: the emulated card's memory in GiB (None: the whole card)."""

    kind: str
    model: str
    batch_size: int = 1
    cap_gb: float | None = None
    lora_r: int = 16
    attn: str = "sdpa"  # attention kernel: "sdpa" (today's default) or "eager" (the seed's transformers 4.31)
    grad_ckpt: bool = True  # gradient checkpointing (QLoRA recipes turn it on)
    max_len: int | None = None  # truncate texts to this many tokens (None: the data's full lengths)
    warmup_steps: int = 2  # the first holds the longest texts: the epoch's peak memory
    timed_steps: int = 3
    new_tokens: tuple[int, ...] = field(default=(64, 128, 256, 512))

    def key(self) -> str:
        """A stable name: two specs with the same key measure the same thing (cap 40 and 40.0 alike)."""
        cap = "none" if self.cap_gb is None else f"{self.cap_gb:g}"
        if self.kind == "generate":
            return f"generate/{self.model}/cap={cap}/r={self.lora_r}/{self.attn}/new={','.join(map(str, self.new_tokens))}"
        return (f"train/{self.model}/b={self.batch_size}/cap={cap}/r={self.lora_r}/{self.attn}/len={self.max_len}"
                f"/steps={self.warmup_steps}+{self.timed_steps}" + ("" if self.grad_ckpt else "/no-ckpt"))

    def validate(self, card_gb: float | None) -> None:
        """Raise ValueError naming the problem; ``card_gb``: this GPU's memory in GiB (None: no GPU)."""
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch size must be an integer >= 1, got {self.batch_size!r}")
        LoraSettings(r=self.lora_r)
        if self.attn not in ATTN:
            raise ValueError(f"attn must be one of {ATTN}, got {self.attn!r}")
        if self.cap_gb is not None:
            if self.cap_gb <= 0:
                raise ValueError(f"memory cap must be > 0 GiB, got {self.cap_gb}")
            if card_gb is not None and self.cap_gb > card_gb:
                raise ValueError(f"memory cap {self.cap_gb} GiB is larger than this card ({card_gb:.1f} GiB)")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 or None, got {self.max_len}")
        if self.warmup_steps < 1 or self.timed_steps < 1:
            raise ValueError("need at least one warm-up and one timed step")
        if self.kind == "generate" and (not self.new_tokens or min(self.new_tokens) < 1):
            raise ValueError(f"new_tokens must be positive counts, got {self.new_tokens}")

    @classmethod
    def from_json(cls, text: str) -> "PointSpec":
        fields = json.loads(text)
        if "new_tokens" in fields:
            fields["new_tokens"] = tuple(fields["new_tokens"])
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class SimulatedMemory:
    """CPU stand-in for the GPU allocator: counts model bytes plus the tensors autograd saves.

    Used as a context manager around the forward pass; ``peak`` holds the largest total seen, and
    passing ``limit`` raises ``torch.cuda.OutOfMemoryError`` as the real allocator would.
    """

    def __init__(self, base_bytes: int, limit: int | None) -> None:
        self.base, self.limit, self.saved, self.peak = base_bytes, limit, 0, base_bytes

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.saved += tensor.numel() * tensor.element_size()
        self.peak = max(self.peak, self.base + self.saved)
        if self.limit is not None and self.base + self.saved > self.limit:
            raise torch.cuda.OutOfMemoryError(f"simulated: {(self.base + self.saved) / GiB:.3f} GiB needed, "
                                              f"cap {self.limit / GiB:.3f} GiB")
        return tensor

    @contextlib.contextmanager
    def step(self):
        self.saved = 0
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield


def context_bytes() -> int:
    """Device memory this process holds outside PyTorch's allocator (CUDA context, cuBLAS handles)."""
    a = torch.ones(256, 256, device="cuda")
    (a @ a).sum().item()  # loads cuBLAS: its workspace is part of what every real run carries
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def apply_cap(cap_gb: float | None) -> dict:
    """Limit this process's allocator to a card of ``cap_gb`` GiB, the CUDA context counted in."""
    if cap_gb is None:
        return {"alloc_limit_gb": None, "context_gb": None}
    ctx = context_bytes()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory  # this process's GPU
    limit = cap_gb * GiB - ctx
    torch.cuda.set_per_process_memory_fraction(float(limit / total))
    return {"alloc_limit_gb": limit / GiB, "context_gb": ctx / GiB}


def is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def base_record(spec: PointSpec, device: torch.device) -> dict:
    """The fields every record of a point carries, including the commit and time of the run that measured
    it: a sweep resumed over several sessions keeps each point's own provenance."""
    run = results.provenance()
    return {"point": spec.key(), "model": spec.model, "lora_r": spec.lora_r, "cap_gb": spec.cap_gb,
            "attn": spec.attn, "device": device.type, "git_commit": run["git_commit"], "measured_at": run["timestamp"]}


def run_train(spec: PointSpec, data: TokenizedData, device: torch.device) -> list[dict]:
    """Build, attach LoRA, train ``warmup_steps + timed_steps`` steps; one record, "ok" or "oom"."""
    record = {"kind": "train", **base_record(spec, device), "batch_size": spec.batch_size}
    batches = make_batches(data.token_ids, spec.batch_size, spec.warmup_steps + spec.timed_steps, spec.max_len)
    timed = batches[spec.warmup_steps:]
    record.update(max_seq_len=max(b["input_ids"].shape[1] for b in batches),
                  mean_seq_len=statistics.fmean(float(b["attention_mask"].sum(1).float().mean()) for b in timed),
                  mean_padded_len=statistics.fmean(b["input_ids"].shape[1] for b in timed))
    if device.type == "cuda":
        record.update(apply_cap(spec.cap_gb))
        torch.cuda.reset_peak_memory_stats()
    stage = "build"
    meter = None
    try:
        model, source = build_model(spec.model, device, vocab_size=data.vocab_size, attn=spec.attn)
        model = attach_lora(model, LoraSettings(r=spec.lora_r), gradient_checkpointing=spec.grad_ckpt)
        record["weights"] = source
        stage = "train"
        record["checkpointing"] = check_checkpointing(model, batches[0]["input_ids"][:1, :16].to(device))
        if device.type == "cpu":
            limit = None if spec.cap_gb is None else int(spec.cap_gb * GiB)
            meter = SimulatedMemory(model_bytes(model), limit)
        times, monitor_summary, losses = timed_steps(model, batches, device, spec.warmup_steps, meter)
    except Exception as error:
        if not is_oom(error):
            raise
        record.update(status="oom", oom_stage=stage, oom_message=str(error).splitlines()[0][:200],
                      **_peaks(device, meter))
        return [record]
    real_tokens = sum(int(b["attention_mask"].sum()) for b in timed)
    record.update(status="ok", step_s=statistics.median(times), tokens_per_s=real_tokens / sum(times),
                  samples_per_s=spec.batch_size * len(times) / sum(times), loss=losses[-1],
                  gpu_util_pct=monitor_summary.get("util_pct_mean"), mem_pct=monitor_summary.get("mem_pct_max"),
                  **_peaks(device, meter))
    return [record]


def timed_steps(model: torch.nn.Module, batches: list[dict], device: torch.device, warmup_steps: int,
                meter: SimulatedMemory | None) -> tuple[list[float], dict, list[float]]:
    """Train one AdamW step per batch; time each step after ``warmup_steps`` (device synchronised on both
    sides) while the GPU monitor samples them. Returns the step times [s], the monitor's summary and
    every step's loss."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    times: list[float] = []
    losses: list[float] = []
    monitor = contextlib.nullcontext()
    for i, batch in enumerate(batches):
        batch = {k: v.to(device) for k, v in batch.items()}
        if i == warmup_steps:
            monitor = _monitor(device)
            monitor.__enter__()
        sync(device)
        t0 = time.perf_counter()
        with meter.step() if meter else contextlib.nullcontext():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup_steps:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))  # after the synchronisation: costs no extra wait
    monitor.__exit__(None, None, None)
    return times, (monitor.summary() if hasattr(monitor, "samples") else {}), losses


def _monitor(device: torch.device):
    if device.type == "cuda":
        from ..monitor import GpuMonitor

        return GpuMonitor(interval_s=0.1)
    return contextlib.nullcontext()


def _peaks(device: torch.device, meter: SimulatedMemory | None) -> dict:
    if device.type == "cuda":
        return {"peak_alloc_gb": torch.cuda.max_memory_allocated() / GiB,
                "peak_reserved_gb": torch.cuda.max_memory_reserved() / GiB}
    peak = meter.peak / GiB if meter else None
    return {"peak_alloc_gb": peak, "peak_reserved_gb": peak}


def run_point(spec: PointSpec, data_path: Path) -> list[dict]:
    """Run one point in this process (on the GPU when there is one)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    card = torch.cuda.get_device_properties(0).total_memory / GiB if device.type == "cuda" else None
    spec.validate(card)
    data = TokenizedData.load(data_path)
    if spec.kind == "generate":
        from .generate import run_generate

        return run_generate(spec, data, device)
    return run_train(spec, data, device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="the point as JSON (PointSpec fields)")
    parser.add_argument("--data", required=True, type=Path, help="tokenized data written by data.prepare().save()")
    parser.add_argument("--out", required=True, type=Path, help="where to write the records (JSON list)")
    args = parser.parse_args(argv)
    records = run_point(PointSpec.from_json(args.spec), args.data)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(records))
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
