"""The plain nf4 matrix-vector kernel: rung 1 of notebook 07's ladder, a screen long.

``y = x @ W^T`` for a bitsandbytes nf4 weight ``W`` (N, K), in bitsandbytes' layout (see
``nf4_format``'s docstring): two 4-bit codes per byte along a row of W, the high nibble first; weight
``i`` of the flattened W is ``code[q_i] * absmax[i // blocksize]``. To stay simple the kernel takes
one fp32 scale per block, already decoded: for a weight with nested ("double-quantised") statistics
:func:`block_scales` decodes them once on the host, so the kernel reads 4 bytes of scale per block
where the tuned kernel reads the 1-byte code (``nested_scales=True``, rung 2 of the ladder: the
1-byte codes and their second-level scales decoded in the kernel, as the tuned kernel does). Each
program owns ``BLOCK_N`` outputs of one row of x and walks K in chunks of ``BLOCK_K``: load the packed
bytes, split each into its two codes, look both up in the 16-entry table, multiply by the block's
scale, multiply by x and sum, all in fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import check_triton_device  # the package switches Triton to its interpreter first (no GPU)
from ..nf4_format import NF4Operands, nf4_operands
from ..nf4_gemv import DTYPES

BLOCK_N, BLOCK_K = 16, 256  # outputs a program, weights of K a loop step (a GPU: 16 x 128 bytes a step)


@triton.jit
def _nf4_matvec_kernel(X, PACKED, SCALES, CODE, OUT, N, K, stride_xm, CODE2, ABSMAX2, OFFSET,
                       QB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       NESTED: tl.constexpr, NESTED_QB: tl.constexpr):
    """OUT[m, n] = sum_k X[m, k] * W[n, k] for the BLOCK_N outputs n of program (i, m). NESTED: SCALES holds
    the 1-byte codes of nested statistics, decoded here (CODE2, ABSMAX2, OFFSET), else one fp32 per block."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)     # this program's outputs (rows of W)
    m = tl.program_id(1)                                        # this program's row of x
    j = tl.arange(0, BLOCK_K // 2)                              # byte j holds weights 2j and 2j + 1
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        col = k0 + 2 * j                                        # the column of each byte's first weight
        ok = (n[:, None] < N) & (col[None, :] < K)
        byte = tl.load(PACKED + n[:, None] * (K // 2) + (col // 2)[None, :], mask=ok, other=0).to(tl.int32)
        block = (n[:, None] * K + col[None, :]) // QB           # each weight's quantisation block
        if NESTED:  # the block's 1-byte code into the 256-entry map, times its second-level scale
            q = tl.load(SCALES + block, mask=ok, other=0).to(tl.int32)
            scale = tl.load(CODE2 + q) * tl.load(ABSMAX2 + block // NESTED_QB, mask=ok, other=0.0) + tl.load(OFFSET)
        else:
            scale = tl.load(SCALES + block, mask=ok, other=0.0)
        w_even = tl.load(CODE + (byte >> 4)) * scale            # high nibble: column col
        w_odd = tl.load(CODE + (byte & 15)) * scale             # low nibble: column col + 1
        x_even = tl.load(X + m * stride_xm + col, mask=col < K, other=0.0).to(tl.float32)
        x_odd = tl.load(X + m * stride_xm + col + 1, mask=col < K, other=0.0).to(tl.float32)
        acc += tl.sum(w_even * x_even[None, :] + w_odd * x_odd[None, :], axis=1)
    tl.store(OUT + m * N + n, acc.to(OUT.dtype.element_ty), mask=n < N)


def block_scales(ops: NF4Operands) -> torch.Tensor:
    """One fp32 scale per block of ``ops`` (:func:`nf4_format.nf4_operands`' result): the stored absmax,
    or for nested statistics ``nested_code[q] * nested_absmax[b // nested_blocksize] + offset``."""
    if not isinstance(ops, NF4Operands):
        raise TypeError(f"ops must be nf4_gemv.nf4_operands(weight)'s result, got {type(ops).__name__}")
    if ops.nested_absmax is None:
        return ops.absmax.to(torch.float32)
    block = torch.arange(ops.absmax.numel(), device=ops.absmax.device) // ops.nested_blocksize
    return ops.nested_code[ops.absmax.long()] * ops.nested_absmax[block] + ops.offset


def nf4_matvec(x: torch.Tensor, weight, scales: torch.Tensor | None = None, *,
               block_n: int = BLOCK_N, block_k: int = BLOCK_K, nested_scales: bool = False) -> torch.Tensor:
    """``x @ W^T`` through the plain kernel. ``weight``: what :func:`nf4_format.nf4_operands` takes, or its
    result; ``x``: (M, K) or (K,), fp16, bf16 or fp32; the result has x's leading shape, N columns and x's
    dtype. ``scales``: :func:`block_scales` of the weight, when the caller decoded them once already.
    ``nested_scales``: read a nested weight's 1-byte scale codes and decode them in the kernel instead."""
    ops = weight if isinstance(weight, NF4Operands) else nf4_operands(weight)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"x must be one of {[str(d) for d in DTYPES]}, got {x.dtype}")
    if x.dim() not in (1, 2) or x.shape[-1] != ops.k:
        raise ValueError(f"x must have shape (K,) or (M, K) with K = {ops.k}, got {tuple(x.shape)}")
    if x.device != ops.packed.device:
        raise ValueError(f"x is on {x.device} but the weight is on {ops.packed.device}; they must be on one device")
    check_triton_device(x.device, "x")
    if ops.n * ops.k >= 2**31:
        raise ValueError(f"N * K = {ops.n * ops.k}: the plain kernel indexes weights with 32-bit integers")
    for name, value in (("block_n", block_n), ("block_k", block_k)):
        if value < 2 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 2, got {value}")
    groups = ops.n * ops.k // ops.blocksize
    nested = nested_scales
    if nested:
        if ops.nested_absmax is None:
            raise ValueError("nested_scales=True needs a weight with nested statistics (compress_statistics=True)")
        if scales is not None:
            raise ValueError("nested_scales=True reads the weight's own 1-byte codes: give no scales")
        scales = ops.absmax
    elif scales is None:
        scales = block_scales(ops)
    if not nested and (scales.shape != (groups,) or scales.dtype != torch.float32 or scales.device != x.device):
        raise ValueError(f"scales must be fp32 of shape ({groups},) on {x.device} (block_scales of the weight), "
                         f"got {tuple(scales.shape)} {scales.dtype} on {scales.device}")
    x2 = x.reshape(-1, ops.k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], ops.n, dtype=x.dtype, device=x.device)
    if out.numel():
        _nf4_matvec_kernel[(triton.cdiv(ops.n, block_n), x2.shape[0])](
            x2, ops.packed, scales, ops.code, out, ops.n, ops.k, x2.stride(0),
            *((ops.nested_code, ops.nested_absmax, ops.offset) if nested else (scales, scales, scales)),
            QB=ops.blocksize, BLOCK_N=block_n, BLOCK_K=block_k, NESTED=nested,
            NESTED_QB=ops.nested_blocksize, num_warps=4)
    return out.reshape(*x.shape[:-1], ops.n)
