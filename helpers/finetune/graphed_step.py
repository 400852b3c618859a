"""The whole QLoRA training step (forward with checkpointing, backward, AdamW) captured in CUDA graphs.

A step of the course's 7B model launches ~2,000 kernels; the host needs longer to launch them than the
device to run them. A CUDA graph records the launches once and replays them in one call. A graph holds
fixed shapes and addresses, so there is one graph per padded batch shape (widths padded up to a multiple
of ``pad_to``: right padding, which a causal model's real tokens never see), the batch is copied into that
graph's input buffers, and the optimizer is AdamW with ``capturable=True`` (its step count on the device).
Every graph draws from one memory pool: each replay's tensors are dead when it ends (the gradients and
the optimizer's state live outside the pool, the loss is copied out after each replay), so the graphs may
run in any order.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..bench import capture_graph
from ..llama.data import PAD_ID
from ..llama.patching import refuse_left_padding


def pad_width(batch: dict[str, torch.Tensor], multiple: int) -> dict[str, torch.Tensor]:
    """``batch`` right-padded to a width that is a multiple of ``multiple`` (pads: PAD_ID, mask 0, label -100)."""
    width = batch["input_ids"].shape[1]
    extra = -width % multiple
    if not extra:
        return batch
    fill = {"input_ids": PAD_ID, "attention_mask": 0, "labels": -100}
    return {k: F.pad(v, (0, extra), value=fill[k]) for k, v in batch.items()}


class GraphedTrainStep:
    """``step(batch)`` trains ``model`` on one batch (on the CPU or the device) and returns its loss (a device
    tensor, not synchronised); the first batch of each padded shape is captured first, an untimed cost, or
    call :meth:`capture` with every batch up front. Training state is the same as after eager AdamW steps
    (``lr``, default betas and weight decay); the LoRA dropout masks come from the same generator, but the
    draws follow the graph's order, so the masks differ from an eager run's.

    The graphs hold the addresses of the LoRA weights, their gradients and AdamW's state: change those tensors
    in place only (``copy_``), never replace them (``load_state_dict``, ``.to()``); ``lr`` is fixed at capture.
    Pass batches on the CPU (a device batch's left-padding check waits for the device), from one stream."""

    MIN_TORCH = (2, 10)  # checkpointing rewinds the RNG inside the capture: legal from 2.10 (pytorch#162505)

    def __init__(self, model: torch.nn.Module, lr: float = 2e-4, pad_to: int = 64, warmup: int = 1) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA device")
        if tuple(int(v) for v in torch.__version__.split(".")[:2]) < self.MIN_TORCH:
            raise RuntimeError(f"capturing a checkpointed training step needs torch >= 2.10, got {torch.__version__}")
        if pad_to < 1 or warmup < 1:
            raise ValueError(f"pad_to and warmup must be >= 1, got pad_to={pad_to}, warmup={warmup}")
        self.model, self.pad_to, self.warmup = model, pad_to, warmup
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.device = self.params[0].device
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, capturable=True)
        self.graphs: dict[tuple[int, ...], tuple[torch.cuda.CUDAGraph, dict, torch.Tensor]] = {}
        self.pool = None
        self.grads: list[torch.Tensor] | None = None  # the gradient buffers the graphs accumulate into

    def _attach_grads(self) -> None:
        """Give each LoRA weight the graphs' gradient buffer again, zeroed, if other code replaced it (an eager
        ``zero_grad(set_to_none=True)``): the graphs write to those addresses whatever ``.grad`` says."""
        if self.grads is not None and any(p.grad is not g for p, g in zip(self.params, self.grads)):
            for p, g in zip(self.params, self.grads):
                p.grad = g
            torch._foreach_zero_(self.grads)

    def _eager(self, batch: dict) -> torch.Tensor:
        loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        return loss.detach()

    def capture(self, batches: list[dict]) -> int:
        """Capture a graph for each padded shape among ``batches`` not captured yet; returns how many.
        The training state is left as it was (the warm-up steps before each capture are undone). Largest
        shape first: the pool's first blocks, sized for the largest step, are then split for the smaller ones
        rather than each larger capture adding blocks of its own."""
        todo: dict[tuple[int, ...], dict] = {}
        for batch in batches:
            batch = pad_width(batch, self.pad_to)
            shape = tuple(batch["input_ids"].shape)
            if shape not in self.graphs:
                todo.setdefault(shape, batch)
        for shape, batch in sorted(todo.items(), key=lambda item: -math.prod(item[0])):
            self._capture(shape, batch)
        return len(todo)

    def _capture(self, shape: tuple[int, ...], batch: dict) -> None:
        refuse_left_padding(batch["attention_mask"].cpu())
        static = {k: v.to(self.device).clone() for k, v in batch.items()}
        self._attach_grads()
        weights = [p.detach().clone() for p in self.params]
        moments = {(i, k): v.clone() for i, p in enumerate(self.params)
                   for k, v in self.optimizer.state.get(p, {}).items()}
        def undo() -> None:  # the warm-up step's update undone (AdamW's first state is zeros, its step count 0)
            self.grads = [p.grad for p in self.params]
            if any(g is None for g in self.grads):
                raise ValueError("a trainable parameter got no gradient in the warm-up step; freeze it or use it")
            with torch.no_grad():
                for i, (p, w) in enumerate(zip(self.params, weights)):
                    p.copy_(w)
                    for k, v in self.optimizer.state[p].items():
                        v.copy_(moments[(i, k)]) if (i, k) in moments else v.zero_()

        # autotuning, cuBLAS workspaces, AdamW's state: all made in the warm-up, before the capture
        graph, loss = capture_graph(lambda: self._eager(static), warmup=self.warmup, after_each=undo,
                                    pool=self.pool, device=self.device)
        self.pool = graph.pool()
        self.graphs[shape] = (graph, static, loss)

    def step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One training step on ``batch`` (right-padded; padded further to a multiple of ``pad_to``); its loss."""
        batch = pad_width(batch, self.pad_to)
        refuse_left_padding(batch["attention_mask"].cpu())
        shape = tuple(batch["input_ids"].shape)
        if shape not in self.graphs:
            self.capture([batch])
        graph, static, loss = self.graphs[shape]
        self._attach_grads()
        for k, v in batch.items():
            static[k].copy_(v, non_blocking=True)
        graph.replay()
        return loss.clone()

    def pool_bytes(self) -> tuple[int, int]:
        """(reserved, allocated) bytes of the graphs' memory pool: what it holds on the device, and the part
        of it that live tensors (the losses, any library workspace kept from a capture) occupy; (0, 0) before
        the first capture."""
        if self.pool is None:
            return 0, 0
        segments = [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == tuple(self.pool)]
        return sum(s["total_size"] for s in segments), sum(s["allocated_size"] for s in segments)
