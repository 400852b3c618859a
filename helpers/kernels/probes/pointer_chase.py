"""Pointer chasing: one program follows a random cyclic chain of indices, one dependent load at a time.

Each load's address is the value the previous load returned, so no two loads overlap: the time per
step is the latency of the memory level that holds the chain. Nodes sit ``stride`` elements apart
(one 128-byte cache line by default), so a chain of ``n`` nodes spans ``n * stride * 4`` bytes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import device as _device  # noqa: F401  (interpreter switch before @triton.jit)

LINE_ELEMS = 32  # int32 elements per 128-byte cache line


@triton.jit
def pointer_chase_kernel(chain_ptr, state_ptr, trace_ptr, steps, TRACE: tl.constexpr):
    """Start at ``state[0]``, follow ``i = chain[i]`` ``steps`` times, store where it ended in
    ``state[0]``; with TRACE, also store every visited index in ``trace``."""
    i = tl.load(state_ptr)
    for step in range(steps):
        i = tl.load(chain_ptr + i)
        if TRACE:
            tl.store(trace_ptr + step, i)
    tl.store(state_ptr, i)


def random_cycle(n_nodes: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A uniformly random cyclic permutation of ``n_nodes`` (one cycle through every node), as
    ``succ`` with ``succ[node]`` the next node: the distribution of Sattolo's algorithm, built from
    one shuffled visiting order so it is vectorised."""
    if n_nodes < 1:
        raise ValueError(f"n_nodes must be >= 1, got {n_nodes}")
    order = torch.randperm(n_nodes, generator=generator)
    succ = torch.empty(n_nodes, dtype=torch.int64)
    succ[order] = torch.roll(order, -1)
    return succ


def build_chain(working_set_bytes: int, stride: int = LINE_ELEMS, device: str | torch.device = "cpu",
                generator: torch.Generator | None = None) -> torch.Tensor:
    """An int32 buffer of ``working_set_bytes`` holding one random cycle through its nodes: node ``j``
    lives at element ``j * stride`` and holds the element index of its successor."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    node_bytes = 4 * stride
    if working_set_bytes < node_bytes or working_set_bytes % node_bytes:
        raise ValueError(f"working_set_bytes must be a positive multiple of {node_bytes} (one node), "
                         f"got {working_set_bytes}")
    n_nodes = working_set_bytes // node_bytes
    if n_nodes * stride > 2**31 - 1:
        raise ValueError(f"working set of {working_set_bytes} bytes needs indices beyond int32")
    succ = random_cycle(n_nodes, generator)
    chain = torch.zeros(n_nodes * stride, dtype=torch.int32, device=device)
    chain[::stride] = (succ * stride).to(device=device, dtype=torch.int32)
    return chain


def chase(chain: torch.Tensor, steps: int, start: int = 0,
          trace: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Follow ``chain`` for ``steps`` dependent loads from element ``start``; returns the end index
    (a 1-element int32 tensor on the chain's device) and, with ``trace``, every index visited."""
    if not isinstance(chain, torch.Tensor) or chain.dtype != torch.int32 or chain.dim() != 1:
        raise ValueError("chain must be a 1-D int32 tensor (see build_chain)")
    if not chain.is_contiguous():
        raise ValueError("chain must be contiguous")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 0 <= start < chain.numel():
        raise ValueError(f"start must index the chain (0..{chain.numel() - 1}), got {start}")
    state = torch.full((1,), start, dtype=torch.int32, device=chain.device)
    visited = torch.full((steps,), -1, dtype=torch.int32, device=chain.device) if trace else state
    pointer_chase_kernel[(1,)](chain, state, visited, steps, TRACE=trace, num_warps=1)
    return state, (visited if trace else None)
