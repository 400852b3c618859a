"""``y = x @ W^T (+ bias)`` for a bitsandbytes nf4 weight ``W``, dequantised on the fly in one Triton kernel.

Decoding a 7B model one token at a time is a string of matrix-vector products: every weight is read
once and used for one multiply-add per row of ``x`` (M rows, M small), so the time is the bytes read
divided by the HBM bandwidth. An nf4 weight holds 0.5 byte per element; ``dequantize_4bit`` followed
by a bf16 matmul writes and re-reads 2 bytes per element on top of that. This kernel reads the packed
codes and their scales once and never stores a dequantised weight.

Storage (bitsandbytes' ``quantize_4bit``, checked against ``dequantize_4bit``):

* ``W`` of shape (N, K) is flattened row-major and cut into blocks of ``blocksize`` (64) elements;
  element ``i`` of the flat array is ``code[q_i] * absmax[i // blocksize]`` (fp32 product).
* Two 4-bit indices share a byte: the HIGH nibble is element ``2j``, the LOW nibble element ``2j + 1``.
  The bytes may sit in a tensor of another dtype (``quant_storage=torch.bfloat16``); they are read as uint8.
* ``quant_state.code``: the 16 nf4 values (fp32, sorted, from -1 to 1).
* ``absmax``: one fp32 per block, or, with ``compress_statistics=True`` ("nested"), one uint8 index per
  block into ``state2.code`` (bitsandbytes' 256-entry dynamic map), scaled by an fp32 ``state2.absmax``
  per ``state2.blocksize`` (256) blocks, plus one fp32 ``offset``:
  ``absmax[b] = state2.code[qabsmax[b]] * state2.absmax[b // 256] + offset``.

Bytes read per weight: 0.5 for the codes, plus the scales. The nested scales are decoded inside the
kernel (one uint8 per 64 weights plus 4 bytes per 16384 weights): 0.5 + 1/64 + 4/16384 = 0.516 byte
per weight. Flattening them first into one fp32 per block would cost 4/64 byte, 0.5625 byte per weight
(9% more traffic, and a second copy of the scales to keep). A non-nested weight has fp32 scales and is
read as it is (0.5625 byte per weight). ``x`` (M x K) is re-read by each program from the L2 cache.

Kernel: program ``(i, s)`` owns outputs ``[i * BLOCK_N, (i + 1) * BLOCK_N)`` for all M rows and the
``s``-th of ``split_k`` slices of K, walked in chunks of ``BLOCK_K`` (a multiple of ``blocksize``).
Per chunk it loads a ``[BLOCK_N, BLOCK_K / blocksize, blocksize / 2]`` tile of packed bytes and looks
both nibbles of every byte up in the 16-entry code table: 64 bytes, one L1 cache line, so the 32
lookups of a warp are served in one pass. (A 256-entry byte -> value-pair table needs one lookup per
byte instead of two, but its 2 KiB span 16 lines: a warp's 32 random bytes touch about 14 of them,
one pass each. Measured on the H200, that version moved 8-14% of the copy bandwidth at M = 1.) A
chain of 15 selects per element would cost more instructions than the lookup. ``x`` is loaded
contiguously and split into even and odd elements, which meet the high and low nibbles. Then:

* M = 1: fp32 multiply-adds on the CUDA cores; each 64-element block is summed first and multiplied by
  its scale once (one multiply per block, not per weight).
* 1 < M <= ``MAX_M``: the scaled weights are rounded to x's dtype (what dequantise + matmul does too)
  and fed to ``tl.dot`` (tensor cores; M is padded to 16, 32 or 64 rows) with fp32 accumulation:
  at 16 rows a CUDA-core loop would need ~300 TFLOP/s of fp32 to keep up with HBM.

With ``split_k > 1`` each slice writes fp32 partial sums and a second small kernel adds them in a
fixed order (deterministic), adds the bias and casts. Results are always accumulated in fp32.

Supported: nf4 only, any ``blocksize`` that divides K (bitsandbytes' 32 ... 4096; 64 is its default
and Llama's), K even, M <= ``MAX_M`` rows; larger M: ``dequantize_4bit`` + matmul is compute-bound
anyway. ``x`` may have any strides (its last dimension is made contiguous when it is not).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import device as _device  # imported first: sets TRITON_INTERPRET before the kernels are defined
from . import check_powers_of_two

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_M = 64  # rows of x one launch handles (the tensor-core path pads M to 16, 32 or 64)
MIN_PROGRAMS = 132  # split K until the grid has about this many programs: one per SM of an H200
DOT_FP32 = _device.INTERPRET  # the interpreter's tl.dot mishandles bf16 operands: give it their fp32 values


# ----------------------------------------------------------------------------------------- kernels
@triton.jit
def _nf4_matmul_kernel(X, W, CODE, ABSMAX, ABSMAX2, CODE2, OFFSET, BIAS, OUT,
                       M, N, K, stride_xm, chunks_per_split,
                       QB: tl.constexpr, NESTED_QB: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       NESTED: tl.constexpr, HAS_BIAS: tl.constexpr, DOT: tl.constexpr, PARTIAL: tl.constexpr,
                       DOT_FP32: tl.constexpr, PRECISION: tl.constexpr):
    """OUT[m, n] = sum_k X[m, k] * W[n, k] over this program's K slice (see the module docstring)."""
    G: tl.constexpr = BLOCK_K // QB    # quantisation blocks per chunk
    HQB: tl.constexpr = QB // 2        # bytes per quantisation block
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rg = tl.arange(0, G)
    rb = tl.arange(0, HQB)
    n_ok = rn < N
    m_ok = rm < M
    groups = K // QB                   # quantisation blocks per row of W
    w_rows = W + rn.to(tl.int64)[:, None, None] * (K // 2)
    s_rows = rn.to(tl.int64)[:, None] * groups
    x_rows = X + rm.to(tl.int64)[:, None, None, None] * stride_xm
    # element offsets of one chunk of x, [G, HQB, 2]: the last axis is (high nibble, low nibble)
    x_cols = (rg * QB)[:, None, None] + (2 * rb)[None, :, None] + tl.arange(0, 2)[None, None, :]
    if NESTED:
        offset = tl.load(OFFSET)
    if DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    first = pid_k * chunks_per_split
    last = tl.minimum(first + chunks_per_split, tl.cdiv(K, BLOCK_K))
    for c in range(first, last):
        g = c * G + rg                 # block index along the row, [G]
        g_ok = g < groups
        byte = tl.load(w_rows + (g * HQB)[None, :, None] + rb[None, None, :],
                       mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
        byte = byte.to(tl.int32)
        w_hi = tl.load(CODE + (byte >> 4))   # the nf4 values of both nibbles, from the 16-entry table
        w_lo = tl.load(CODE + (byte & 15))
        s_mask = n_ok[:, None] & g_ok[None, :]
        s_idx = s_rows + g[None, :]
        if NESTED:
            q = tl.load(ABSMAX + s_idx, mask=s_mask, other=0)
            scale = tl.load(CODE2 + q.to(tl.int32)) * tl.load(ABSMAX2 + s_idx // NESTED_QB, mask=s_mask,
                                                              other=0.0)
            scale = scale + offset
        else:
            scale = tl.load(ABSMAX + s_idx, mask=s_mask, other=0.0).to(tl.float32)
        xv = tl.load(x_rows + (c * BLOCK_K + x_cols)[None, :, :, :],
                     mask=m_ok[:, None, None, None] & g_ok[None, :, None, None], other=0.0)
        x_hi, x_lo = tl.split(xv)      # [BLOCK_M, G, HQB] each
        if DOT:
            a_hi = tl.reshape(w_hi * scale[:, :, None], [BLOCK_N, BLOCK_K // 2]).to(X.dtype.element_ty)
            a_lo = tl.reshape(w_lo * scale[:, :, None], [BLOCK_N, BLOCK_K // 2]).to(X.dtype.element_ty)
            x_hi = tl.reshape(x_hi, [BLOCK_M, BLOCK_K // 2])
            x_lo = tl.reshape(x_lo, [BLOCK_M, BLOCK_K // 2])
            if DOT_FP32:  # same products (16-bit values are exact in fp32), for the interpreter's tl.dot
                a_hi, a_lo = a_hi.to(tl.float32), a_lo.to(tl.float32)
                x_hi, x_lo = x_hi.to(tl.float32), x_lo.to(tl.float32)
            acc = tl.dot(x_hi, tl.trans(a_hi), acc, input_precision=PRECISION)
            acc = tl.dot(x_lo, tl.trans(a_lo), acc, input_precision=PRECISION)
        else:
            block_sums = tl.sum(w_hi * x_hi.to(tl.float32) + w_lo * x_lo.to(tl.float32), axis=2)  # [BLOCK_N, G]
            acc += tl.sum(block_sums * scale, axis=1)
    if DOT:
        out_offs = rm[:, None] * N + rn[None, :]
        out_mask = m_ok[:, None] & n_ok[None, :]
        bias_offs = rn[None, :]
        bias_mask = n_ok[None, :]
    else:
        out_offs = rn
        out_mask = n_ok
        bias_offs = rn
        bias_mask = n_ok
    if PARTIAL:
        tl.store(OUT + pid_k.to(tl.int64) * M * N + out_offs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(BIAS + bias_offs, mask=bias_mask, other=0.0).to(tl.float32)
        tl.store(OUT + out_offs, acc.to(OUT.dtype.element_ty), mask=out_mask)


@triton.jit
def _sum_splits_kernel(PART, BIAS, OUT, MN, N, SPLIT_K, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """OUT = sum over s of PART[s] (+ bias), always in the same order (deterministic)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(PART + s * MN + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(BIAS + offs % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=ok)


# ------------------------------------------------------------------------------ launch settings
@dataclass(frozen=True)
class Config:
    """How a launch is cut: ``block_n`` outputs per program, ``block_k`` elements of K per loop step
    (a multiple of the weight's blocksize), ``num_warps`` and ``num_stages`` (software pipelining of
    the loads), and ``split_k`` slices of K run by separate programs (then summed by a second kernel).
    One stage by default: on the tensor-core path Triton's pipeliner would turn every 4-byte table
    lookup into an asynchronous copy through shared memory (the sm_90 code of a 64 x 128 tile grows
    from 880 to 1,520 instructions, 148 of them such copies); the one-row path is not pipelined."""

    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1
    num_stages: int = 1

    def __post_init__(self):
        check_powers_of_two(self, "block_n", "block_k", "num_warps")
        if self.block_k < 32:
            raise ValueError(f"Config.block_k must be >= 32 (the smallest blocksize), got {self.block_k}")
        if self.split_k < 1 or self.num_stages < 1:
            raise ValueError(f"Config.split_k and Config.num_stages must be >= 1, got {self.split_k}, "
                             f"{self.num_stages}")


# rows of the padded M -> (block_n, block_k, num_warps). 1 and 16: the fastest on every Llama-2-7B
# shape in scripts/nf4_gemv_tune.py's grid on the H200, measured with the 256-entry pair table
# (see the module docstring) and to be re-measured for the 16-entry lookup; 32 and 64: not measured.
_TABLE = {1: (32, 256, 8), 16: (64, 128, 4), 32: (32, 256, 4), 64: (32, 128, 8)}


def _block_m(m: int) -> int:
    """Rows of x one program holds: 1 on the CUDA-core path, else M padded for ``tl.dot``."""
    return 1 if m == 1 else max(16, triton.next_power_of_2(m))


def config_for(m: int, n: int, k: int, blocksize: int = 64) -> Config:
    """The default launch shape for M rows of x against an (N, K) weight: the table above, ``block_k``
    cut to K (rounded up to a power of two) and at least ``blocksize``, and K split while the grid has
    fewer than ``MIN_PROGRAMS`` programs and each slice keeps at least two chunks."""
    block_n, block_k, warps = _TABLE[_block_m(max(1, min(m, MAX_M)))]
    block_k = max(min(block_k, triton.next_power_of_2(k)), blocksize)
    split, programs, chunks = 1, triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    while programs * split < MIN_PROGRAMS and chunks >= 4 * split:
        split *= 2
    return Config(block_n, block_k, warps, split)


# ------------------------------------------------------------------------------------ operands
class NF4Operands(NamedTuple):
    """What the kernel reads for one weight: views of bitsandbytes' tensors (no copies). ``absmax``
    is one fp32 per block, or, for nested statistics, one uint8 per block (then ``nested_absmax``,
    ``nested_code`` and ``offset`` are set, else None)."""

    packed: torch.Tensor           # uint8, N * K / 2 bytes, row-major, high nibble first
    absmax: torch.Tensor
    nested_absmax: torch.Tensor | None  # fp32, one per ``nested_blocksize`` blocks
    nested_code: torch.Tensor | None    # fp32, 256 entries
    offset: torch.Tensor | None         # fp32, one element
    code: torch.Tensor             # fp32, the 16 nf4 values
    n: int
    k: int
    blocksize: int
    nested_blocksize: int


def _weight_parts(weight) -> tuple[torch.Tensor, object]:
    """(packed storage, quant state) from a ``Params4bit`` or a ``(packed, quant_state)`` pair."""
    if isinstance(weight, tuple) and len(weight) == 2:
        packed, state = weight
    else:
        packed, state = weight, getattr(weight, "quant_state", None)
    if not isinstance(packed, torch.Tensor) or state is None or not hasattr(state, "absmax"):
        raise TypeError("weight must be a bitsandbytes Params4bit (with a quant_state) or a (packed, quant_state) "
                        f"pair, got {type(weight).__name__}")
    return packed.data, state


def nf4_operands(weight) -> NF4Operands:
    """Check a bitsandbytes nf4 weight (``Params4bit`` or ``(packed, quant_state)``) and return the
    tensors the kernel reads. Raises ValueError/TypeError naming what the kernel cannot take.
    :func:`nf4_matmul` accepts the result: prepare each weight once (the checks cost host time)."""
    packed, qs = _weight_parts(weight)
    if qs.quant_type != "nf4":
        raise ValueError(f"only nf4 weights are supported, got quant_type={qs.quant_type!r}")
    if getattr(qs, "packing_format_for_cpu", False):
        raise ValueError("the weight was repacked for bitsandbytes' CPU kernel (Linear4bit.forward in eval mode "
                         "on a CPU with AVX512-BF16); this kernel reads bitsandbytes' standard layout")
    if qs.shape is None or len(qs.shape) != 2:
        raise ValueError(f"the weight must be 2-D (N, K), got shape {qs.shape}")
    n, k = qs.shape
    bs = qs.blocksize
    if k % 2:
        raise ValueError(f"K = {k} is odd: two 4-bit codes share a byte along K, so K must be even")
    if bs < 32 or bs & (bs - 1) or k % bs:
        raise ValueError(f"blocksize = {bs} must be a power of two >= 32 that divides K = {k}")
    if not packed.is_contiguous():
        raise ValueError("the packed weight must be contiguous")
    packed = packed.view(torch.uint8).reshape(-1)
    if packed.numel() != n * k // 2:
        raise ValueError(f"the packed weight has {packed.numel()} bytes, expected N * K / 2 = {n * k // 2}")
    code = qs.code
    if code.numel() != 16 or not code.is_floating_point():
        raise ValueError(f"quant_state.code must hold the 16 nf4 values, got {tuple(code.shape)} {code.dtype}")
    groups = n * k // bs
    absmax = qs.absmax.reshape(-1)
    if absmax.numel() != groups:
        raise ValueError(f"quant_state.absmax has {absmax.numel()} entries, expected N * K / blocksize = {groups}")
    parts = [packed, absmax, code]
    if qs.nested:
        s2 = qs.state2
        if absmax.dtype != torch.uint8 or s2.code.numel() != 256 or s2.absmax.dtype != torch.float32:
            raise ValueError("a nested quant_state must hold uint8 absmax codes, a 256-entry state2.code and fp32 "
                             f"state2.absmax; got {absmax.dtype}, {s2.code.numel()} entries, {s2.absmax.dtype}")
        offset = torch.as_tensor(qs.offset, dtype=torch.float32, device=absmax.device).reshape(1)
        nested = (s2.absmax.reshape(-1), s2.code.to(torch.float32), offset)
        nested_bs = s2.blocksize
        parts += list(nested)
    else:
        if not absmax.is_floating_point():
            raise ValueError(f"quant_state.absmax must be floating point, got {absmax.dtype}")
        nested, nested_bs = (None, None, None), 1
    devices = {t.device for t in parts}
    if len(devices) > 1:
        raise ValueError(f"the weight's tensors are on several devices: {sorted(map(str, devices))}")
    return NF4Operands(packed, absmax, *nested, code.to(torch.float32).contiguous(), n, k, bs, nested_bs)


# -------------------------------------------------------------------------------- host functions
def _check_x(x: torch.Tensor, ops: NF4Operands) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"x must be one of {[str(d) for d in DTYPES]}, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != ops.k:
        raise ValueError(f"x must have shape (..., K) with K = {ops.k} (the weight's in-features), "
                         f"got {tuple(x.shape)}")
    if x.device != ops.packed.device:
        raise ValueError(f"x is on {x.device} but the weight is on {ops.packed.device}; they must be on one device")
    if x.device.type != "cuda" and not _device.INTERPRET:
        raise ValueError(f"x is on {x.device}; the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1)")
    m = x.numel() // ops.k
    if m > MAX_M:
        raise ValueError(f"x has M = {m} rows; this kernel is for M <= {MAX_M} (decoding). For more rows, "
                         "dequantise once (bitsandbytes.functional.dequantize_4bit) and use a matmul")


def _check_bias(bias: torch.Tensor | None, n: int, device: torch.device) -> None:
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if bias.shape != (n,) or bias.dtype not in DTYPES:
        raise ValueError(f"bias must be a float tensor of shape ({n},), got {tuple(bias.shape)} {bias.dtype}")
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device} but x is on {device}; they must be on one device")


def nf4_matmul(x: torch.Tensor, weight, bias: torch.Tensor | None = None, config: Config | None = None
               ) -> torch.Tensor:
    """``x @ W^T + bias`` for an nf4 weight ``W`` of shape (N, K): ``weight`` is a bitsandbytes
    ``Params4bit``, a ``(packed, quant_state)`` pair from ``quantize_4bit``, or :func:`nf4_operands`'
    result (checked once, reused). ``x`` has shape (..., K) with M = prod(...) <= ``MAX_M`` rows and
    dtype fp16, bf16 or fp32; the result has shape (..., N) and x's dtype, accumulated in fp32.
    ``config`` overrides :func:`config_for`."""
    ops = weight if isinstance(weight, NF4Operands) else nf4_operands(weight)
    _check_x(x, ops)
    _check_bias(bias, ops.n, x.device)
    lead = x.shape[:-1]
    out = torch.empty(*lead, ops.n, dtype=x.dtype, device=x.device)
    m = math.prod(lead)
    if m == 0:
        return out
    x2 = x.reshape(m, ops.k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    cfg = config or config_for(m, ops.n, ops.k, ops.blocksize)
    if cfg.block_k % ops.blocksize:
        raise ValueError(f"Config.block_k = {cfg.block_k} must be a multiple of the weight's blocksize "
                         f"{ops.blocksize}")
    block_m = _block_m(m)
    if block_m > 1 and cfg.block_n < 16:
        raise ValueError(f"Config.block_n = {cfg.block_n}: the tensor-core path (M > 1) needs block_n >= 16")
    chunks = triton.cdiv(ops.k, cfg.block_k)
    per_split = triton.cdiv(chunks, cfg.split_k)
    split = triton.cdiv(chunks, per_split)  # no empty slices
    target = out if split == 1 else torch.empty(split, m, ops.n, dtype=torch.float32, device=x.device)
    nested = ops.nested_absmax is not None
    _nf4_matmul_kernel[(triton.cdiv(ops.n, cfg.block_n), split)](
        x2, ops.packed, ops.code, ops.absmax,
        ops.nested_absmax if nested else ops.absmax, ops.nested_code if nested else ops.absmax,
        ops.offset if nested else ops.absmax, bias if bias is not None else x2, target,
        m, ops.n, ops.k, x2.stride(0), per_split,
        QB=ops.blocksize, NESTED_QB=ops.nested_blocksize, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NESTED=nested,
        HAS_BIAS=bias is not None, DOT=block_m > 1, PARTIAL=split > 1, DOT_FP32=DOT_FP32,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # fp32 x: full-precision products
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * ops.n, block),)](
            target, bias if bias is not None else target, out, m * ops.n, ops.n, split,
            HAS_BIAS=bias is not None, BLOCK=block, num_warps=4)
    return out


def nf4_linear(x: torch.Tensor, module: torch.nn.Module, config: Config | None = None) -> torch.Tensor:
    """The forward of a quantised ``bitsandbytes.nn.Linear4bit`` (nf4) through :func:`nf4_matmul`,
    in x's dtype (the module's ``compute_dtype`` plays no part: the kernel accumulates in fp32)."""
    weight = getattr(module, "weight", None)
    if getattr(weight, "quant_state", None) is None:
        raise TypeError(f"module must be a quantised bitsandbytes Linear4bit (move it to a device first), "
                        f"got {type(module).__name__}")
    return nf4_matmul(x, weight, module.bias, config)
