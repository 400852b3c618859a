"""The training step every measurement of the QLoRA experiment shares (forward, backward, AdamW over the LoRA
weights) and the timed loop around it: the device synchronised around each step, the GPU monitor sampling them.

``run_timed_steps`` is the sweep's, the re-timing's, the two-GPU runs' and the kernels comparison's timed
training; ``train_step`` and ``time_steps`` are its two halves, for a caller that times another step (a graph
replay) or profiles the same one."""
from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from ..children import report_progress
from ..llama.memory_caps import SimulatedMemory

LR = 2e-4  # AdamW's learning rate in every measurement


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def train_step(model: torch.nn.Module, meter: SimulatedMemory | None = None) -> Callable[[dict], torch.Tensor]:
    """A function that trains ``model`` one step on a batch (on the model's device): forward (counted by
    ``meter``'s simulated memory when given), backward, AdamW (a new optimizer, ``LR``) over the trainable
    weights, gradients freed; it returns the step's loss (detached, not synchronised)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)

    def step(batch: dict) -> torch.Tensor:
        with meter.step() if meter else contextlib.nullcontext():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def time_steps(step: Callable[[dict], object], batches: list[dict], device: torch.device, skip: int, *,
               place: Callable[[dict], dict] | None = None, monitor: bool = False) -> tuple[list[float], list, dict]:
    """``step(batch)`` for each batch, the device synchronised on both sides of each; ``place(batch)`` first,
    outside the timing (None: the batch as it is). Returns the wall times [s] of all but the first ``skip``
    steps, every step's result, and (``monitor``) the GPU monitor's summary of the timed steps ({} without)."""
    times: list[float] = []
    out: list = []
    sampler = contextlib.nullcontext()
    for i, batch in enumerate(batches):
        if place is not None:
            batch = place(batch)
        if monitor and i == skip:
            sampler = _monitor(device)
            sampler.__enter__()
        sync(device)
        t0 = time.perf_counter()
        out.append(step(batch))
        sync(device)
        if i >= skip:
            times.append(time.perf_counter() - t0)
        report_progress(f"step {i + 1} of {len(batches)}")
    sampler.__exit__(None, None, None)
    return times, out, (sampler.summary() if hasattr(sampler, "samples") else {})


def run_timed_steps(model: torch.nn.Module, batches: list[dict], device: torch.device, warmup_steps: int,
                    meter: SimulatedMemory | None) -> tuple[list[float], dict, list[float]]:
    """Train one AdamW step per batch (:func:`train_step`); time each step after ``warmup_steps`` (device
    synchronised on both sides, each batch moved to the device before) while the GPU monitor samples them.
    Returns the step times [s], the monitor's summary and every step's loss. The model is put in training
    mode: checkpointing recomputes only there."""
    model.train()
    times, losses, summary = time_steps(train_step(model, meter), batches, device, warmup_steps,
                                        place=lambda batch: to_device(batch, device), monitor=True)
    return times, summary, [float(loss) for loss in losses]


def _monitor(device: torch.device):
    if device.type == "cuda":
        from ..monitor import GpuMonitor

        return GpuMonitor(interval_s=0.1)
    return contextlib.nullcontext()
