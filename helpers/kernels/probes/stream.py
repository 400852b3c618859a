"""Read-only streaming: every program sums its chunk of a buffer ``passes`` times.

The bandwidth-vs-working-set probe (``helpers.studies.memory_hierarchy.bandwidth_sweep``) times this kernel. Loads
use the ``.cg`` cache modifier (cache in L2, not in the SM's L1), so a working set that fits in L2
is served by L2 itself; the running sums are stored, so no pass can be optimised away.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import device as _device  # noqa: F401  (interpreter switch before @triton.jit)


@triton.jit
def stream_sum_kernel(x_ptr, out_ptr, n_elements, chunk, n_chunks, passes, BLOCK: tl.constexpr):
    """Program ``pid`` reads chunk ``pid % n_chunks`` (``chunk`` elements) ``passes`` times and
    stores the sum of everything it read in ``out[pid]``."""
    pid = tl.program_id(0)
    start = (pid % n_chunks).to(tl.int64) * chunk
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(passes):
        for offset in range(0, chunk, BLOCK):
            idx = start + offset + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + idx, mask=idx < n_elements, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def plan(n_elements: int, programs: int, block: int) -> tuple[int, int]:
    """Split ``n_elements`` into at most ``programs`` chunks of a multiple of ``block`` elements:
    returns ``(chunk, n_chunks)``. With fewer chunks than programs, programs share chunks."""
    if n_elements < 1 or programs < 1 or block < 1:
        raise ValueError(f"need n_elements, programs, block >= 1, got {n_elements}, {programs}, {block}")
    per_program = -(-n_elements // programs)
    chunk = -(-per_program // block) * block
    return chunk, -(-n_elements // chunk)


def bytes_read(n_elements: int, programs: int, block: int, passes: int, itemsize: int = 4) -> int:
    """Bytes that one ``stream_sum`` launch loads (programs that share a chunk each count theirs)."""
    chunk, n_chunks = plan(n_elements, programs, block)
    last = n_elements - (n_chunks - 1) * chunk
    per_chunk = [chunk] * (n_chunks - 1) + [last]
    total = sum(per_chunk[pid % n_chunks] for pid in range(programs))
    return total * passes * itemsize


def stream_sum(x: torch.Tensor, passes: int, programs: int, block: int = 4096, num_warps: int = 8,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch ``programs`` programs that each sum their chunk of the float32 vector ``x`` ``passes``
    times; returns the ``programs`` partial sums (so ``out.sum()`` is ``passes`` x the sum of the
    chunks read, shared chunks counted once per program that reads them)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 1:
        raise ValueError(f"x must be a 1-D float32 tensor, got {getattr(x, 'dtype', type(x))} "
                         f"with shape {tuple(getattr(x, 'shape', ()))}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")
    if x.numel() == 0:
        raise ValueError("x is empty")
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    chunk, n_chunks = plan(x.numel(), programs, block)
    if out is None:
        out = torch.empty(programs, device=x.device, dtype=torch.float32)
    elif out.shape != (programs,) or out.dtype != torch.float32 or out.device != x.device:
        raise ValueError(f"out must be a float32 tensor of shape ({programs},) on {x.device}")
    stream_sum_kernel[(programs,)](x, out, x.numel(), chunk, n_chunks, passes, BLOCK=block, num_warps=num_warps)
    return out
