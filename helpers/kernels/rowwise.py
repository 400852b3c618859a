"""What the row-wise Triton kernels share (the fused bias + GELU + LayerNorm, RMSNorm): the mask of a row
block's tile, the number of multiprocessors a grid is sized by, and the small kernel that adds each
program's partial column sums (a parameter's gradient) in a fixed order.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernels below)


@triton.jit
def tile_mask(rows, cols, M, N, EVEN_N: tl.constexpr):
    """In-bounds elements of a [ROWS, BLOCK_N] tile; without a column test when the block is the row."""
    if EVEN_N:
        m = (rows < M)[:, None] & tl.full([cols.shape[0]], 1, tl.int1)[None, :]
    else:
        m = (rows < M)[:, None] & (cols < N)[None, :]
    return m


@triton.jit
def sum_partials_kernel(PART, OUT_B, OUT_W, OUT_LB, P, N, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT_k[c] = sum over p of PART[k, p, c], always in the same order (deterministic)."""
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
    if k == 0:
        tl.store(OUT_B + cols, total.to(OUT_B.dtype.element_ty), mask=col_ok)
    elif k == 1:
        tl.store(OUT_W + cols, total.to(OUT_W.dtype.element_ty), mask=col_ok)
    else:
        tl.store(OUT_LB + cols, total.to(OUT_LB.dtype.element_ty), mask=col_ok)


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
