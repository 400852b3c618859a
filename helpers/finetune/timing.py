"""The timed training steps every measurement of the QLoRA experiment shares, the device synchronised around
each step and the GPU monitor sampling them."""
from __future__ import annotations

import contextlib
import time

import torch

from ..children import report_progress
from ..llama.memory_caps import SimulatedMemory


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_steps(model: torch.nn.Module, batches: list[dict], device: torch.device, warmup_steps: int,
                meter: SimulatedMemory | None) -> tuple[list[float], dict, list[float]]:
    """Train one AdamW step per batch; time each step after ``warmup_steps`` (device synchronised on both
    sides) while the GPU monitor samples them. Returns the step times [s], the monitor's summary and
    every step's loss. The model is put in training mode: checkpointing recomputes only there."""
    model.train()
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
        report_progress(f"step {i + 1} of {len(batches)}")
    monitor.__exit__(None, None, None)
    return times, (monitor.summary() if hasattr(monitor, "samples") else {}), losses


def _monitor(device: torch.device):
    if device.type == "cuda":
        from ..monitor import GpuMonitor

        return GpuMonitor(interval_s=0.1)
    return contextlib.nullcontext()
