"""An nf4 weight dequantised in one Triton pass, and the linear layer QLoRA trains through.

A training step multiplies thousands of rows by each weight, so the matmul itself is compute-bound and
belongs to cuBLAS: the weight is dequantised to the compute dtype first, used, and dropped (the
decoding kernels of ``nf4_gemv`` fuse the two because there the bytes are what costs). bitsandbytes
does that in two launches for a weight with nested statistics (its uint8 block scales to fp32, then
the codes), each behind several layers of Python; the same ``Linear4bit`` runs three times a step
under gradient checkpointing (forward, recomputed forward, backward). The QLoRA step is paced by the
host (notebook 07), so here the storage layout of ``nf4_format`` (see its docstring) is decoded in one
launch, nested scales included, and the layer is one ``autograd.Function``.

``nf4_dequantize(ops, dtype)``: ``W[i] = code[q_i] * absmax[i // blocksize]`` computed in fp32 and
rounded once to ``dtype``, as ``bitsandbytes.functional.dequantize_4bit`` does (with nested scales,
``absmax[b] = nested_code[qabsmax[b]] * nested_absmax[b // nested_blocksize] + offset``).
``dequant_linear(x, ops, bias)``: ``x @ W^T + bias`` with autograd; the backward dequantises again
(``dx = dy @ W``) rather than keeping ``W``, as bitsandbytes does, so no more memory is held.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import device as _device  # imported first: sets TRITON_INTERPRET before the kernels are defined
from . import check_triton_device
from .nf4_format import NF4Operands
from .rounding import round_to_bf16

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_BYTES = 1024  # packed bytes (2048 weights) a program
INTERPRETER_BLOCK_BYTES = 16384  # Triton's interpreter pays per program and operation, hardly per byte


@triton.jit
def _nf4_dequantize_kernel(PACKED, CODE, ABSMAX, NESTED_ABSMAX, NESTED_CODE, OFFSET, OUT, n_bytes,
                           QB: tl.constexpr, NESTED_QB: tl.constexpr, NESTED: tl.constexpr, BLOCK: tl.constexpr,
                           ROUND_BF16: tl.constexpr):
    """Program p decodes packed bytes [p * BLOCK, (p + 1) * BLOCK): the high nibble of byte j is weight 2j,
    the low nibble weight 2j + 1; both lie in block 2j // QB (QB is even). ROUND_BF16: round to nearest
    before the conversion, which truncates in the interpreter."""
    pid = tl.program_id(0).to(tl.int64)
    j = pid * BLOCK + tl.arange(0, BLOCK)
    ok = j < n_bytes
    byte = tl.load(PACKED + j, mask=ok, other=0).to(tl.int32)
    block = j // (QB // 2)
    if NESTED:
        q = tl.load(ABSMAX + block, mask=ok, other=0).to(tl.int32)
        scale = tl.load(NESTED_CODE + q) * tl.load(NESTED_ABSMAX + block // NESTED_QB, mask=ok, other=0)
        scale = scale + tl.load(OFFSET)
    else:
        scale = tl.load(ABSMAX + block, mask=ok, other=0.0)
    high = tl.load(CODE + (byte >> 4)) * scale
    low = tl.load(CODE + (byte & 15)) * scale
    w = tl.reshape(tl.join(high, low), [2 * BLOCK])  # (BLOCK, 2) row-major: high, low, high, low, ...
    if ROUND_BF16:
        w = round_to_bf16(w)
    i = pid * 2 * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(OUT + i, w.to(OUT.dtype.element_ty), mask=i < 2 * n_bytes)


def nf4_dequantize(ops: NF4Operands, dtype: torch.dtype = torch.bfloat16,
                   block_bytes: int | None = None) -> torch.Tensor:
    """The dense (N, K) weight of :func:`helpers.kernels.nf4_format.nf4_operands`' result, in ``dtype``
    (fp16, bf16 or fp32), from one kernel launch; ``block_bytes``: packed bytes a program decodes (a power
    of two; ``BLOCK_BYTES`` on a GPU, ``INTERPRETER_BLOCK_BYTES`` in the interpreter by default)."""
    if not isinstance(ops, NF4Operands):
        raise TypeError(f"ops must be nf4_gemv.nf4_operands(weight)'s result, got {type(ops).__name__}")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be one of {[str(d) for d in DTYPES]}, got {dtype}")
    block = block_bytes or (INTERPRETER_BLOCK_BYTES if _device.INTERPRET else BLOCK_BYTES)
    if block < 16 or block & (block - 1):
        raise ValueError(f"block_bytes must be a power of two >= 16, got {block_bytes}")
    check_triton_device(ops.packed.device, "the weight")
    out = torch.empty(ops.n, ops.k, dtype=dtype, device=ops.packed.device)
    n_bytes = ops.packed.numel()
    if n_bytes == 0:
        return out
    nested = ops.nested_absmax is not None
    _nf4_dequantize_kernel[(triton.cdiv(n_bytes, block),)](
        ops.packed, ops.code, ops.absmax, ops.nested_absmax if nested else ops.absmax,
        ops.nested_code if nested else ops.code, ops.offset if nested else ops.code, out, n_bytes,
        QB=ops.blocksize, NESTED_QB=ops.nested_blocksize, NESTED=nested, BLOCK=block,
        ROUND_BF16=_device.INTERPRET and dtype == torch.bfloat16, num_warps=4)
    return out


class _DequantLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, ops: NF4Operands, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.ops = ops
        return F.linear(x, nf4_dequantize(ops, x.dtype), bias)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        dx = dy @ nf4_dequantize(ctx.ops, dy.dtype) if ctx.needs_input_grad[0] else None
        dbias = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.needs_input_grad[2] else None
        return dx, None, dbias


def dequant_linear(x: torch.Tensor, ops: NF4Operands, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` for the nf4 weight ``ops`` (N, K) dequantised to x's dtype, differentiable in
    ``x`` and ``bias`` (the nf4 weight is frozen). x: (..., K) fp16, bf16 or fp32, on the weight's device."""
    if not isinstance(x, torch.Tensor) or x.dtype not in DTYPES:
        raise TypeError(f"x must be a tensor of one of {[str(d) for d in DTYPES]}, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 1 or x.shape[-1] != ops.k:
        raise ValueError(f"x must have shape (..., K) with K = {ops.k} (the weight's in-features), "
                         f"got {tuple(x.shape)}")
    if x.device != ops.packed.device:
        raise ValueError(f"x is on {x.device} but the weight is on {ops.packed.device}; they must be on one device")
    if bias is not None and (bias.shape != (ops.n,) or bias.dtype != x.dtype):
        raise ValueError(f"bias must have shape ({ops.n},) and x's dtype {x.dtype}, "
                         f"got {tuple(bias.shape)} {bias.dtype}")
    return _DequantLinear.apply(x, ops, bias)
