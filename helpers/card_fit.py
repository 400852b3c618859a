"""What fits on a card: the limits the course's sizing rules read, for this GPU or for a named stand-in.

A notebook sizes its work with ``this_card()``; the tests pass each card of ``CARDS`` to the same plan
functions, so a choice that would not fit a 16 GB T4 or a 24 GB L4 is caught on a CPU. What does not fit is
skipped with one printed line (``skip_line``), never by an out-of-memory traceback.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

GiB = 2**30


@dataclass(frozen=True)
class CardLimits:
    """The limits of one card that decide what the course can run on it."""

    name: str
    memory_bytes: int  # what the driver reports (torch's total_memory): a little under the marketing GB
    capability: tuple[int, int]  # compute capability, e.g. (9, 0) for Hopper
    smem_per_block_bytes: int  # the most shared memory one block may opt into
    sms: int

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    @property
    def arch(self) -> str:
        """Triton's target name for the card, e.g. "sm_90"."""
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def supported(self) -> bool:
        """sm_75 (Turing) and newer: the CUDA 13 builds of torch dropped older cards."""
        return self.capability >= (7, 5)

    @property
    def triton_tensor_cores(self) -> bool:
        """Whether Triton's ``tl.dot`` runs on tensor cores here (sm_80 and up); on sm_75 it does not."""
        return self.capability >= (8, 0)

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware: sm_80 and up (sm_75 emulates it, correct but slow)."""
        return self.capability >= (8, 0)

    def slow_triton_reason(self) -> str | None:
        """Why the course's Triton kernels run slower on this card, one clause naming it; None from sm_80 up."""
        if self.triton_tensor_cores:
            return None
        return f"{self.name} ({self.arch}): Triton's tl.dot has no tensor cores here and bf16 is emulated"

    def fits(self, bytes_needed: float, share: float = 0.85) -> bool:
        """Whether ``bytes_needed`` fits in ``share`` of the card's memory (the rest: CUDA context, allocator slack)."""
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        return bytes_needed <= share * self.memory_bytes

    def skip_line(self, what: str, bytes_needed: float, share: float = 0.85) -> str:
        """One line saying that ``what`` is skipped on this card, and why."""
        return (f"skipped on {self.name}: {what} needs about {bytes_needed / GiB:.1f} GiB, more than "
                f"{share:.0%} of this card's {self.memory_gib:.1f} GiB")


def limits_from_properties(props) -> CardLimits:
    """A card's limits from ``torch.cuda.get_device_properties`` (or any object with the same fields)."""
    smem = getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block
    return CardLimits(props.name, int(props.total_memory), (props.major, props.minor), int(smem),
                      int(props.multi_processor_count))


def this_card() -> CardLimits | None:
    """This run's GPU, or None without one."""
    if not torch.cuda.is_available():
        return None
    return limits_from_properties(torch.cuda.get_device_properties(torch.cuda.current_device()))


def _card(name: str, gib: float, capability: tuple[int, int], smem_kb: int, sms: int) -> CardLimits:
    return CardLimits(name, int(gib * GiB), capability, smem_kb * 1024, sms)


# The cards the sizing rules are tested on: memory as the driver reports it (about), the opt-in shared memory
# per block of the architecture (CUDA programming guide, "Technical Specifications per Compute Capability").
CARDS: dict[str, CardLimits] = {c.name: c for c in (
    _card("Tesla T4", 14.6, (7, 5), 64, 40),
    _card("NVIDIA A10", 22.1, (8, 6), 99, 72),
    _card("NVIDIA L4", 22.0, (8, 9), 99, 58),
    _card("NVIDIA GeForce RTX 4090", 23.6, (8, 9), 99, 128),
    _card("NVIDIA A100-SXM4-40GB", 39.4, (8, 0), 163, 108),
    _card("NVIDIA RTX 6000 Ada Generation", 47.5, (8, 9), 99, 142),
    _card("NVIDIA A100-SXM4-80GB", 79.1, (8, 0), 163, 108),
    _card("NVIDIA H100 80GB HBM3", 79.2, (9, 0), 227, 132),
    _card("NVIDIA H200", 139.8, (9, 0), 227, 132),
)}
