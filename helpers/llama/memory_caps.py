"""Memory caps: a smaller card emulated on a larger one, and out-of-memory as a result.

On a GPU, ``torch.cuda.set_per_process_memory_fraction`` limits the caching allocator to the emulated card's
memory minus this process's CUDA context (the driver's own allocation, which the allocator never sees but the
card must hold). Without a GPU (smoke scale) the cap is simulated: the bytes of the model plus the activations
autograd saves for the backward pass are counted, and passing the cap raises the same
``torch.cuda.OutOfMemoryError``.
"""
from __future__ import annotations

import contextlib

import torch

GiB = 2**30
SAME_CARD = 0.95  # a card reports a little less than its name's GB: an A100 40GB ~39.4 GiB, an RTX 6000 Ada ~47.5


def cap_on_card(cap_gb: float, card_gib: float) -> float | None:
    """The GiB a cap of ``cap_gb`` runs under on a card of ``card_gib``: the cap where the card holds it; the whole
    card where the card reports a little less (within ``SAME_CARD``: the card the cap stands for, as its driver
    counts it); None where the card is smaller, so that the cap cannot be emulated on it."""
    if cap_gb <= card_gib:
        return cap_gb
    return card_gib if card_gib >= SAME_CARD * cap_gb else None


def cap_line(cap_gb: float, card_name: str, card_gib: float) -> str | None:
    """The line a plan prints for a cap this card changes (None where the cap runs as it is)."""
    runs = cap_on_card(cap_gb, card_gib)
    if runs == cap_gb:
        return None
    if runs is None:
        return f"skipped on {card_name}: a {cap_gb:g} GiB cap, more than this card's {card_gib:.1f} GiB"
    return (f"the {cap_gb:g} GiB cap runs as the whole of this {card_name}'s {card_gib:.1f} GiB: a real card of "
            f"{cap_gb:g} GB reports about that much")


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
    """Limit this process's allocator to a card of ``cap_gb`` GiB (at most this one), the CUDA context counted in."""
    if cap_gb is None:
        return {"alloc_limit_gb": None, "context_gb": None}
    ctx = context_bytes()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory  # this process's GPU
    limit = min(cap_gb * GiB, total) - ctx  # a cap a little above the card (``cap_on_card``): the whole card
    if limit <= 0:
        raise ValueError(f"a cap of {cap_gb} GiB leaves nothing beside the CUDA context ({ctx / GiB:.2f} GiB here): "
                         "a capped GPU run needs a cap above it (the simulated caps of the smoke scale are for CPUs)")
    torch.cuda.set_per_process_memory_fraction(float(min(limit / total, 1.0)))
    return {"alloc_limit_gb": limit / GiB, "context_gb": ctx / GiB}


def is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def peak_memory(device: torch.device, meter: SimulatedMemory | None) -> dict:
    """The run's peak memory in GiB, allocated and reserved: the allocator's on a GPU, ``meter``'s without one."""
    if device.type == "cuda":
        return {"peak_alloc_gb": torch.cuda.max_memory_allocated() / GiB,
                "peak_reserved_gb": torch.cuda.max_memory_reserved() / GiB}
    peak = meter.peak / GiB if meter else None
    return {"peak_alloc_gb": peak, "peak_reserved_gb": peak}
