"""How notebook 04 and its appendices time the fused bias + GELU + LayerNorm kernels: inputs of ``ELEMS``
elements (``M = ELEMS // N`` rows), each call timed by :func:`helpers.bench.time_fn` after the L2 is emptied by
a read (no dirty lines for the timed call to write back), its bandwidth as a share of the copy ceiling."""
from __future__ import annotations

from typing import Callable

import torch

from ..bench import Timing, time_fn
from ..device import DEVICE, pick

ELEMS = pick(full=1 << 26, smoke=1 << 12)  # 64M elements on a GPU: far beyond the L2 at every dtype
TIMING = pick(full={}, smoke={"warmup_ms": 0, "rep_ms": 1, "min_reps": 1})  # smoke: run once, time nothing


def setup(n: int, dtype: torch.dtype, elems: int = ELEMS) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor]:
    """``(M, x, bias, weight, ln_bias)``: random ``x`` of ``M x n`` with ``M = elems // n``, three vectors of ``n``."""
    if n < 1 or elems < n:
        raise ValueError(f"need 1 <= n <= elems, got n = {n}, elems = {elems}")
    m = elems // n
    x = torch.randn(m, n, device=DEVICE, dtype=dtype)
    b, w, lb = (torch.randn(n, device=DEVICE, dtype=dtype) for _ in range(3))
    return m, x, b, w, lb


def time_it(fn: Callable[[], object]) -> Timing:
    """``fn()`` timed by :func:`helpers.bench.time_fn` (CUDA events, median; the CPU's clock at smoke scale),
    the L2 emptied by reading 256 MB before each run."""
    return time_fn(fn, flush_l2="read", **TIMING)


def pct_of_copy(nbytes: float, ms: float, copy_gbps: float) -> float:
    """``nbytes`` moved in ``ms`` milliseconds, as a percentage of the copy bandwidth ``copy_gbps`` [GB/s]."""
    if ms <= 0 or copy_gbps <= 0:
        raise ValueError(f"need ms > 0 and copy_gbps > 0, got {ms}, {copy_gbps}")
    return 100 * nbytes / (ms * 1e-3) / 1e9 / copy_gbps
