"""How notebook 04 and its appendices time the fused bias + GELU + LayerNorm kernels: inputs of ``ELEMS``
elements (``M = ELEMS // N`` rows), each call timed by :func:`helpers.bench.time_fn` after the L2 is emptied by
a read (no dirty lines for the timed call to write back), its bandwidth as a share of the copy ceiling."""
from __future__ import annotations

from typing import Callable

import pandas as pd
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


def ladder_frame(records: list[dict]) -> pd.DataFrame:
    """Notebook 04's ladder records (this run's or a committed one's) as a table, each row labelled in ``bar``:
    "eager", "torch.compile", or the rung and its change ("1 plain, library erf", ...)."""
    df = pd.DataFrame(records)
    df["bar"] = [impl if rung is None or pd.isna(rung) else f"{int(rung)} {impl}"
                 for rung, impl in zip(df["rung"], df["impl"])]
    return df


def ladder_steps(records: list[dict], near_copy_pct: float = 98.0) -> list[str]:
    """What each rung of a ladder run bought, for each dtype and width: rung 1 over eager and each rung over the
    one before; the largest step and the tuned kernel over eager and ``torch.compile``; and a line where a rung
    before the tuned kernel already ran at ``near_copy_pct`` % of copy or more (nothing left there to gain)."""
    df = ladder_frame(records)
    rungs = [b for b in dict.fromkeys(df["bar"]) if b[0].isdigit()]
    lines = []
    for (dname, n), sub in df.groupby(["dtype", "N"], sort=False):
        ms, pct = sub.set_index("bar")["ms"], sub.set_index("bar")["pct_of_copy"]
        steps = ", ".join(f"{b.split(' ', 1)[0]}: {ms[a] / ms[b]:.2f}x" for a, b in zip(rungs, rungs[1:]))
        biggest = max(zip(rungs, rungs[1:]), key=lambda ab: ms[ab[0]] / ms[ab[1]])[1]
        tuned = ms[rungs[-1]]
        lines.append(f"{dname} N = {n}: rung 1 is {ms['eager'] / ms[rungs[0]]:.2f}x eager; each rung over the one "
                     f"before: {steps}")
        lines.append(f"  the largest step: {biggest}; the tuned kernel {ms['eager'] / tuned:.2f}x eager, "
                     f"{ms['torch.compile'] / tuned:.2f}x torch.compile")
        top = max(rungs[:-1], key=lambda b: pct[b])
        if pct[top] >= near_copy_pct:
            lines.append(f"  rung {top.split(' ', 1)[0]} already ran at {pct[top]:.0f}% of copy: nothing left for the "
                         f"tuned kernel to gain ({pct[rungs[-1]]:.0f}%)")
    return lines
