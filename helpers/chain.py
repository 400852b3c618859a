"""The naive ``x + bias -> GELU -> LayerNorm`` chain in eager PyTorch, what each of its kernels must
move through memory, and small profiling helpers (notebooks 03 and 04)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .bench import peak_memory_bytes as peak_extra_memory  # noqa: F401  (notebook 03 calls it by this name)
from .device import HAS_CUDA


def eager_chain(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None = None,
                ln_bias: torch.Tensor | None = None, eps: float = 1e-5, approximate: str = "none") -> torch.Tensor:
    """``LayerNorm(GELU(x + bias))`` over the last dimension, as three eager PyTorch kernels."""
    return F.layer_norm(F.gelu(x + bias, approximate=approximate), (x.shape[-1],), weight, ln_bias, eps)


def reference64(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None = None,
                ln_bias: torch.Tensor | None = None, eps: float = 1e-5, approximate: str = "none") -> torch.Tensor:
    """:func:`eager_chain` in float64 on the CPU: the reference every check compares against."""
    def up(t):
        return None if t is None else t.detach().to("cpu", torch.float64)
    return eager_chain(up(x), up(bias), up(weight), up(ln_bias), eps, approximate)


def _check_sizes(m: int, n: int, elem: int) -> None:
    if m < 0 or n < 1 or elem not in (2, 4, 8):
        raise ValueError(f"need m >= 0, n >= 1 and an element size of 2, 4 or 8 bytes; got {m}, {n}, {elem}")


def eager_forward_bytes(m: int, n: int, elem: int) -> dict[str, int]:
    """The bytes each eager forward kernel must move, at least (each input read once, each output
    written once): ``add`` reads x and bias, writes x + bias; ``gelu`` reads and writes a tensor;
    ``layer_norm`` reads and writes a tensor, reads weight and bias, writes mean and rstd (fp32)."""
    _check_sizes(m, n, elem)
    t = m * n * elem
    return {"add": 2 * t + n * elem, "gelu": 2 * t, "layer_norm": 2 * t + 2 * n * elem + 2 * m * 4}


def eager_backward_bytes(m: int, n: int, elem: int) -> dict[str, int]:
    """The least bytes of each eager backward kernel: ``layer_norm_backward`` reads dy and its input,
    writes dx (the weight/bias gradients reuse those reads), ``gelu_backward`` reads the gradient and
    its input, writes a gradient; ``bias_grad`` sums the gradient over rows (one read)."""
    _check_sizes(m, n, elem)
    t = m * n * elem
    return {"layer_norm_backward": 3 * t + 3 * n * elem + 2 * m * 4, "gelu_backward": 3 * t, "bias_grad": t + n * elem}


def fused_forward_bytes(m: int, n: int, elem: int) -> int:
    """One fused forward pass: read x, write y, read the three parameter vectors, write mean and rstd."""
    _check_sizes(m, n, elem)
    return 2 * m * n * elem + 3 * n * elem + 2 * m * 4


def fused_backward_bytes(m: int, n: int, elem: int) -> int:
    """One fused backward pass: read x and dy, write dx, read mean/rstd and parameters, write three gradients."""
    _check_sizes(m, n, elem)
    return 3 * m * n * elem + 2 * m * 4 + 5 * n * elem


def profile_kernels(fn: Callable[[], object], reps: int = 5) -> list[dict]:
    """Run ``fn`` ``reps`` times under ``torch.profiler`` and list what ran, slowest first:
    ``{"name", "calls", "us_per_call"}``. On a GPU these are the CUDA kernels and their device
    time; on the CPU the ``aten::`` operators and their CPU time."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    fn()  # warm-up outside the profile
    activities = [torch.profiler.ProfilerActivity.CPU]
    if HAS_CUDA:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(reps):
            fn()
        if HAS_CUDA:
            torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        if HAS_CUDA:
            if evt.device_type != torch.autograd.DeviceType.CUDA or evt.self_device_time_total <= 0:
                continue
            total = evt.self_device_time_total
        else:
            if not evt.key.startswith("aten::") or evt.self_cpu_time_total <= 0:
                continue
            total = evt.self_cpu_time_total
        rows.append({"name": evt.key, "calls": evt.count // reps, "us_per_call": total / max(evt.count, 1)})
    return sorted(rows, key=lambda r: -r["us_per_call"] * r["calls"])
