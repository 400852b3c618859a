"""Triton from zero: ``out = a + b`` for 1-D tensors.

Each *program* (one instance of the kernel, run by a group of warps on one SM) handles one block of
``BLOCK`` consecutive elements; ``tl.program_id(0)`` says which block. The last block may hang over
the end of the tensor, so every load and store carries a *mask* that switches the extra lanes off.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import device as _device  # imported first: sets TRITON_INTERPRET before the kernel is defined


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)                      # which block this program owns
    offsets = pid * BLOCK + tl.arange(0, BLOCK)  # the BLOCK element indices of that block
    mask = offsets < n                           # lanes past the end do nothing
    a = tl.load(a_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, a + b, mask=mask)


def vector_add(a: torch.Tensor, b: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``a + b`` computed by :func:`add_kernel`; 1-D contiguous tensors of one dtype and device."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device, got {a.device} and {b.device}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    if a.numel() + block > 2**31:
        raise ValueError(f"{a.numel()} elements: this teaching kernel computes offsets in 32 bits (up to 2**31)")
    if a.device.type != "cuda" and not _device.INTERPRET:
        raise ValueError(f"inputs are on {a.device}; the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1)")
    out = torch.empty_like(a)
    if a.numel():
        add_kernel[(triton.cdiv(a.numel(), block),)](a, b, out, a.numel(), BLOCK=block)
    return out
