"""What the row-wise Triton kernels share (the fused bias + GELU + LayerNorm, RMSNorm): how a launch is cut
(:class:`Config`), a kernel's measured table with the rule for the widths it lacks (:func:`table_config`,
:func:`forward_rule`, :func:`backward_rule`), the mask of a row block's tile, the number of multiprocessors a grid is
sized by, the small kernel that adds each program's partial column sums (a parameter's gradient) in a fixed order
(:func:`sum_partials`), and the check of a forward's saved row statistics.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernels below)
from . import check_powers_of_two

MAX_BLOCK_FWD = 16384  # widest row held in registers by one program in a forward
MAX_BLOCK_BWD = 8192  # ... and in a backward (fp32 column sums for the parameters' gradients besides the data)


@triton.jit
def tile_mask(rows, cols, M, N, EVEN_N: tl.constexpr):
    """In-bounds elements of a [ROWS, BLOCK_N] tile; without a column test when the block is the row."""
    if EVEN_N:
        m = (rows < M)[:, None] & tl.full([cols.shape[0]], 1, tl.int1)[None, :]
    else:
        m = (rows < M)[:, None] & (cols < N)[None, :]
    return m


@triton.jit
def sum_partials_kernel(PART, OUT, P, N, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT[k, c] = sum over p of PART[k, p, c], always in the same order (deterministic): K sets of P partial rows
    of N columns (fp32) summed into K contiguous rows of N, k = program_id(1) (a grid of K along axis 1)."""
    k = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < N
    base = PART + k.to(tl.int64) * P * N
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        mask = (p < P)[:, None] & col_ok[None, :]
        acc += tl.load(base + p.to(tl.int64)[:, None] * N + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(OUT + k.to(tl.int64) * N + cols, total.to(OUT.dtype.element_ty), mask=col_ok)


def sum_partials(part: torch.Tensor, out: torch.Tensor, p: int, n: int) -> None:
    """``out[k] = part[k].sum(0)`` through :func:`sum_partials_kernel`, deterministic: ``part`` holds K x ``p``
    partial rows of ``n`` fp32 column sums, ``out`` K rows of ``n`` (K = ``out.numel() // n``), both contiguous."""
    block_c = min(256, next_power_of_2(n))
    sum_partials_kernel[(cdiv(n, block_c), out.numel() // n)](part, out, p, n, BLOCK_P=32, BLOCK_C=block_c,
                                                              num_warps=4)


def check_stats(x: torch.Tensor, **stats: torch.Tensor) -> None:
    """Raise ValueError unless every one of ``stats`` (by name) is a forward's row statistics for ``x``: contiguous
    fp32 of shape ``x.shape[:-1]`` on ``x``'s device."""
    for name, t in stats.items():
        if not isinstance(t, torch.Tensor) or t.shape != x.shape[:-1] or t.dtype != torch.float32 \
                or t.device != x.device or not t.is_contiguous():
            got = f"{tuple(t.shape)}, {t.dtype}, {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be the forward's contiguous fp32 statistics of shape "
                             f"{tuple(x.shape[:-1])} on {x.device}; got {got}")


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launch grids on the host: plain integers, where ``triton.cdiv`` (a constexpr function in
    recent Triton) costs microseconds a call on the norms' per-call path."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` for ``n`` >= 0 (0 for 0, as Triton's): ``triton.next_power_of_2`` in
    plain Python (see :func:`cdiv`)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``: the row-wise grids launch a few programs per multiprocessor."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few programs, so that each one loops over several row blocks


# ------------------------------------------------------------------------------ launch settings
@dataclass(frozen=True)
class Config:
    """How a launch is cut: ``block_n`` columns per step (the row fits in one block when
    ``block_n >= N``), ``rows`` rows per block, ``num_warps`` warps per program, at most
    ``programs_per_sm`` programs per multiprocessor, each looping over row blocks. ``prefetch`` loads a
    program's next row block while it computes the current one (with one block a row; ignored when each
    program has one row block); ``stages`` > 1 has Triton software-pipeline the forward's row-block loop
    instead (``tl.range(num_stages=stages)``: the loads of the next ``stages - 1`` blocks go to shared
    memory as asynchronous copies; the forward only)."""

    block_n: int
    rows: int
    num_warps: int
    programs_per_sm: int = 1
    prefetch: bool = True
    stages: int = 1

    def __post_init__(self):
        check_powers_of_two(self, "block_n", "rows", "num_warps")
        if self.programs_per_sm < 1:
            raise ValueError(f"Config.programs_per_sm must be >= 1, got {self.programs_per_sm}")
        if self.stages < 1:
            raise ValueError(f"Config.stages must be >= 1, got {self.stages}")

    def programs(self, m: int, device: torch.device) -> int:
        """Programs in the grid for ``m`` rows on ``device``."""
        blocks = max(1, cdiv(m, self.rows))
        return min(blocks, self.programs_per_sm * sm_count(device))

    def prefetches(self, m: int, device: torch.device) -> bool:
        """Whether the launch prefetches (only worth it when a program has more than one row block)."""
        return self.prefetch and self.programs(m, device) < cdiv(m, self.rows)


def forward_rule(block: int) -> Config:
    """A forward's launch shape for ``block`` columns a step where a kernel's table has none: ~16 elements per
    thread, a few rows a block for narrow rows, a few programs per SM, each looping over row blocks."""
    rows = max(1, min(8, 1024 // block))
    return Config(block, rows, max(1, min(16, block * rows // 512)), programs_per_sm=max(2, min(8, 8192 // block)))


def backward_rule(block: int) -> Config:
    """A backward's launch shape for ``block`` columns a step where a kernel's table has none (see
    :func:`forward_rule`): ~8 elements per thread, at least 4 warps, 2 programs per SM."""
    rows = max(1, min(8, 2048 // block))
    return Config(block, rows, max(4, min(16, block * rows // 256)), programs_per_sm=2)


def table_config(table: dict, block: int, dtype: torch.dtype, rule) -> Config:
    """A kernel's launch for rows of ``dtype`` in blocks of ``block``: its measured ``table``'s entry, keyed by (bits
    per element, block) and holding Config's fields after ``block_n``, else ``rule(block)``."""
    entry = table.get((8 * dtype.itemsize, block))
    return rule(block) if entry is None else Config(block, *entry)
