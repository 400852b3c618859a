"""Where the course runs: the device, the scale ("full" on a GPU, "smoke" elsewhere), and the
Triton interpreter switch.

Import this module before any ``@triton.jit`` is defined: without a GPU it sets
``TRITON_INTERPRET=1``, which Triton reads when a kernel is decorated.
"""
from __future__ import annotations

import os
from typing import TypeVar

import torch

T = TypeVar("T")

HAS_CUDA: bool = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE: torch.device = torch.device("cuda" if HAS_CUDA else "cpu")

_SCALES = ("full", "smoke")


def _scale_from_env() -> str:
    scale = os.environ.get("COURSE_SCALE", "").strip().lower()
    if not scale:
        return "full" if HAS_CUDA else "smoke"
    if scale not in _SCALES:
        raise ValueError(f"COURSE_SCALE must be one of {_SCALES}, got {scale!r}")
    return scale


SCALE: str = _scale_from_env()


def pick(full: T, smoke: T) -> T:
    """The value for this run's scale: ``full`` on a GPU, ``smoke`` on a CPU (or as COURSE_SCALE says)."""
    return full if SCALE == "full" else smoke


def require_cuda(what: str) -> None:
    """Raise a clear error when ``what`` needs a CUDA GPU and this machine has none."""
    if not HAS_CUDA:
        raise RuntimeError(f"{what} needs a CUDA GPU; this machine has none (torch.cuda.is_available() is False).")


def gpu_name() -> str:
    """The GPU's marketing name as the driver reports it, or "cpu"."""
    return torch.cuda.get_device_name() if HAS_CUDA else "cpu"


def describe() -> str:
    """One line saying where this run executes and at which scale."""
    where = f"GPU {gpu_name()}" if HAS_CUDA else "CPU only (no CUDA GPU)"
    mode = "Triton kernels run in the interpreter" if INTERPRET else "Triton kernels compile for the GPU"
    return f"{where}; scale={SCALE}; {mode}"
