"""``y = x @ W^T (+ bias)`` for a bitsandbytes nf4 weight ``W``, dequantised on the fly in one Triton kernel:
the launch table and the host functions.

Decoding a 7B model one token at a time is a string of matrix-vector products: every weight is read
once and used for one multiply-add per row of ``x`` (M rows, M small), so the time is the bytes read
divided by the HBM bandwidth. An nf4 weight holds 0.5 byte per element; ``dequantize_4bit`` followed
by a bf16 matmul writes and re-reads 2 bytes per element on top of that. These kernels read the packed
codes and their scales once (the nested scales decoded inside the kernel; the format and its bytes per
weight: ``nf4_format``) and never store a dequantised weight. ``x`` (M x K) is re-read by each program
from the L2 cache.

Program ``(i, s)`` owns outputs ``[i * BLOCK_N, (i + 1) * BLOCK_N)`` for all M rows and the ``s``-th of
``split_k`` slices of K, walked in chunks of ``BLOCK_K`` (a multiple of ``blocksize``; ``nf4_chunks``).
On the GPU the codes are decoded in registers by a few lines of PTX (``nf4_ptx``). Two kernels:

* M = 1, bf16 or fp32 x: ``nf4_matvec``, fp32 multiply-adds on the CUDA cores inside the PTX.
* 1 < M <= ``MAX_M``, and one fp16 row: ``nf4_matmul_tile``, the weights dequantised in x's dtype and fed
  to ``tl.dot`` (tensor cores; M padded to 16, 32 or 64 rows), fp32 accumulation.

In the Triton interpreter (no PTX), on GPUs before sm_80 and for fp32 x the same arithmetic runs as a
lookup per weight (with the PTX's roundings for 16-bit x; the exact fp32 table for fp32 x).

``nf4_matmul_group`` runs up to three weights with the same K in one launch (a layer's q, k and v;
gate and up): one grid over all their rows, each program on one weight, each result its own block.

With ``split_k > 1`` each slice writes fp32 partial sums and a second small kernel adds them in a
fixed order (deterministic), adds the bias and casts. Results are always accumulated in fp32.

Supported: nf4 only, any ``blocksize`` that divides K (bitsandbytes' 32 ... 4096; 64 is its default
and Llama's), K even, M <= ``MAX_M`` rows; larger M: ``dequantize_4bit`` + matmul is compute-bound
anyway. ``x`` may have any strides (its last dimension is made contiguous when it is not).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import device as _device  # imported first: sets TRITON_INTERPRET before the kernels are defined
from ..card_fit import this_card
from . import check_powers_of_two
from .nf4_format import NF4Operands, nf4_operands
from .nf4_matmul_tile import _nf4_matmul_tile_kernel
from .nf4_matvec import _nf4_matmul_row_kernel

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_M = 64  # rows of x one launch handles (the tensor-core path pads M to 16, 32 or 64)
MAX_SPLIT = 4  # K is split at most 4 ways
FP32_TILE_SMEM = 96 * 1024  # the shared memory a block the table's tiles need with fp32 x (tests/test_cross_compile.py)
INTERPRETER_BLOCK_N = 128  # config_for's widest tile in Triton's interpreter (the GPU's table: 16 or 64)
DOT_FP32 = _device.INTERPRET  # the interpreter's tl.dot mishandles bf16 operands: give it their fp32 values

__all__ = ["DTYPES", "MAX_M", "Config", "NF4Operands", "config_for", "nf4_linear", "nf4_linear_group",
           "nf4_matmul", "nf4_matmul_group", "nf4_operands"]


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
    (a multiple of the weight's blocksize), ``num_warps``, ``split_k`` slices of K run by separate
    programs (then summed by a second kernel), ``num_stages``: 1 loads each chunk when it is needed;
    more prefetch the next chunks' words and x through shared memory (asynchronous copies),
    ``prefetch``: load each chunk's words and scales into registers one loop step ahead of their use, and
    ``max_registers``: a cap on the registers a thread may use (PTX ``.maxnreg``; None: the compiler's choice),
    which lets more programs share an SM at the price of values spilled to local memory."""

    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1
    num_stages: int = 1
    prefetch: bool = False
    max_registers: int | None = None

    def __post_init__(self):
        check_powers_of_two(self, "block_n", "block_k", "num_warps")
        if self.block_k < 32:
            raise ValueError(f"Config.block_k must be >= 32 (the smallest blocksize), got {self.block_k}")
        if self.split_k < 1 or self.num_stages < 1:
            raise ValueError(f"Config.split_k and Config.num_stages must be >= 1, got {self.split_k}, "
                             f"{self.num_stages}")
        if self.max_registers is not None and not 24 <= self.max_registers <= 255:
            raise ValueError(f"Config.max_registers must be None or 24 ... 255 (a thread's registers), "
                             f"got {self.max_registers}")


# rows of the padded M -> (block_n, block_k, num_warps, prefetch, min_programs), chosen with
# scripts/nf4_gemv_tune.py on the H200 (graph-timed, every Llama-2-7B shape and the grouped launches):
# 1 row: 16 x 2048, 4 warps, one chunk ahead; K is split only when the grid would leave SMs idle (a split's
# partial sums cost a second kernel). 16 rows: 64 x 256, 4 warps, K split until ~1024 programs. 32, 64: not tuned.
_TABLE = {1: (16, 2048, 4, True, 128), 16: (64, 256, 4, False, 1024), 32: (64, 256, 4, False, 1024),
          64: (64, 128, 8, False, 1024)}


def _block_m(m: int, dtype: torch.dtype) -> int:
    """Rows of x one program holds: 1 on the CUDA-core path (one row of bf16 or fp32 x), else M padded
    for ``tl.dot``. One fp16 row takes the tensor cores too: the one-row table holds bf16 precision
    (``nf4_ptx._row_value``), which an fp16 result would show."""
    return 1 if m == 1 and dtype != torch.float16 else max(16, triton.next_power_of_2(m))


@functools.lru_cache(maxsize=None)
def _smem_per_block() -> int | None:
    card = this_card()
    return card.smem_per_block_bytes if card else None


def config_for(m: int, n: int, k: int, blocksize: int = 64, dtype: torch.dtype = torch.bfloat16,
               smem_per_block: int | None = None) -> Config:
    """The default launch shape for M rows of x (``dtype``) against an (N, K) weight: the table above, ``block_k``
    cut to K (rounded up to a power of two) and at least ``blocksize``, and K split (up to ``MAX_SPLIT``
    ways) while the grid has fewer programs than the table's minimum and each slice keeps two chunks.
    fp32 x on the tensor-core path holds its tiles in 4 bytes an element: on a card with less than
    ``FP32_TILE_SMEM`` of shared memory a block (``smem_per_block``, default this GPU's; a T4's 64 KB)
    ``block_k`` halves. In the interpreter ``block_n`` then widens to ``INTERPRETER_BLOCK_N`` (fewer programs
    to simulate)."""
    block_m = _block_m(max(1, min(m, MAX_M)), dtype)
    block_n, block_k, warps, prefetch, min_programs = _TABLE[block_m]
    smem = _smem_per_block() if smem_per_block is None else smem_per_block
    if dtype == torch.float32 and block_m > 1 and smem is not None and smem < FP32_TILE_SMEM:
        block_k //= 2
    block_k = max(min(block_k, triton.next_power_of_2(k)), blocksize)
    split, programs, chunks = 1, triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    while programs * split < min_programs and split < MAX_SPLIT and chunks >= 4 * split:
        split *= 2
    if _device.INTERPRET:  # the interpreter's cost is per program: wider tiles, the GPU's K split kept
        block_n = max(block_n, INTERPRETER_BLOCK_N)  # one width for every N: the same sums, grouped or not
    return Config(block_n, block_k, warps, split, prefetch=prefetch)


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


def nf4_matmul(x: torch.Tensor, weight, bias: torch.Tensor | None = None, config: Config | None = None, *,
               gate: torch.Tensor | None = None, asm: bool = True) -> torch.Tensor:
    """``x @ W^T + bias`` for an nf4 weight ``W`` of shape (N, K): ``weight`` is a bitsandbytes
    ``Params4bit``, a ``(packed, quant_state)`` pair from ``quantize_4bit``, or :func:`nf4_operands`'
    result (checked once, reused). ``x`` has shape (..., K) with M = prod(...) <= ``MAX_M`` rows and
    dtype fp16, bf16 or fp32; the result has shape (..., N) and x's dtype, accumulated in fp32.
    ``gate`` (x's shape and dtype): the product takes ``F.silu(gate) * x`` (Llama's SwiGLU, rounded as
    PyTorch rounds it) in place of x, made as x is read. ``config`` overrides :func:`config_for`.
    ``asm=False`` looks each code up in the table in memory even where the PTX could run (the same
    roundings; notebook 07's ladder measures what the PTX is worth)."""
    ops = weight if isinstance(weight, NF4Operands) else nf4_operands(weight)
    return _matmul(x, [ops], bias, config, gate, asm)[0]


def nf4_matmul_group(x: torch.Tensor, weights, config: Config | None = None) -> list[torch.Tensor]:
    """``[x @ W_i^T for W_i in weights]`` in one launch, for 1 to 3 nf4 weights that share K, blocksize
    and kind of statistics (a layer's q, k and v projections; gate and up): one grid over all their
    rows, so fewer, larger launches. Each result has shape (..., N_i), is contiguous and has x's dtype.
    The weights are taken as :func:`nf4_matmul` takes them, without bias; all of them use the first
    one's 16-entry code table and nested code map (bitsandbytes uses the same for every nf4 weight)."""
    if not isinstance(weights, (list, tuple)) or not 1 <= len(weights) <= 3:
        raise ValueError(f"weights must be a list of 1 to 3 nf4 weights, got {type(weights).__name__} "
                         f"of {len(weights) if isinstance(weights, (list, tuple)) else '?'}")
    ops = [w if isinstance(w, NF4Operands) else nf4_operands(w) for w in weights]
    key = [(o.k, o.blocksize, o.nested_blocksize, o.nested_absmax is None) for o in ops]
    if len(set(key)) > 1:
        raise ValueError(f"the weights must share K, blocksize and kind of statistics, got (K, blocksize, "
                         f"nested blocksize, not nested) = {key}")
    return _matmul(x, ops, None, config)


@functools.lru_cache(maxsize=None)
def _compute_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _matmul(x: torch.Tensor, weights: list[NF4Operands], bias: torch.Tensor | None, config: Config | None,
            gate: torch.Tensor | None = None, asm: bool = True) -> list[torch.Tensor]:
    """One launch for ``x`` (or ``silu(gate) * x``) against 1 to 3 checked weights: the results, views of
    one buffer."""
    for ops in weights:
        _check_x(x, ops)
    if gate is not None and (not isinstance(gate, torch.Tensor) or gate.shape != x.shape or gate.dtype != x.dtype
                             or gate.device != x.device):
        raise ValueError(f"gate must be a tensor of x's shape {tuple(x.shape)}, dtype {x.dtype} and device "
                         f"{x.device}, got {getattr(gate, 'shape', type(gate).__name__)} "
                         f"{getattr(gate, 'dtype', '')} {getattr(gate, 'device', '')}")
    ops = weights[0]
    _check_bias(bias, ops.n, x.device)
    lead, ns = x.shape[:-1], [w.n for w in weights]
    m, n = math.prod(lead), sum(ns)
    flat = torch.empty(m * n, dtype=x.dtype, device=x.device)
    starts = [m * sum(ns[:i]) for i in range(len(ns))]
    outs = [flat[s:s + m * w.n].view(*lead, w.n) for s, w in zip(starts, weights)]
    if m == 0:
        return outs
    x2 = x.reshape(m, ops.k)
    # the PTX needs sm_80 (packed bf16 arithmetic); fp32 x takes the exact table, looked up per weight
    asm = asm and not _device.INTERPRET and x.dtype != torch.float32 and _compute_capability(x.device) >= (8, 0)
    if x2.stride(1) != 1 or gate is not None:  # with a gate both are read as contiguous rows
        x2 = x2.contiguous()
    gate2 = x2 if gate is None else gate.reshape(m, ops.k).contiguous()
    cfg = config or config_for(m, n, ops.k, ops.blocksize, x.dtype)
    block_m = _block_m(m, x.dtype)
    if block_m > 1 and cfg.block_n < 16:
        raise ValueError(f"Config.block_n must be >= 16 for {m} row(s) of {x.dtype} x (the tensor-core path; "
                         f"tl.dot's smallest tile), got {cfg.block_n}")
    if cfg.block_k % ops.blocksize:
        raise ValueError(f"Config.block_k = {cfg.block_k} must be a multiple of the weight's blocksize "
                         f"{ops.blocksize}")
    chunks = triton.cdiv(ops.k, cfg.block_k)
    per_split = triton.cdiv(chunks, cfg.split_k)
    split = triton.cdiv(chunks, per_split)  # no empty slices
    target = flat if split == 1 else torch.empty(split, m * n, dtype=torch.float32, device=x.device)
    nested = ops.nested_absmax is not None

    def parts(w: NF4Operands) -> list[torch.Tensor]:
        """The per-weight pointers: packed words, scales, nested scales, offset (placeholders if not nested)."""
        return [w.packed.view(torch.int32), w.absmax, w.nested_absmax if nested else w.absmax,
                w.offset if nested else w.absmax]

    w0, more = parts(ops), [parts(w) for w in weights[1:]] + [parts(ops)] * (3 - len(weights))
    grid = (sum(triton.cdiv(w.n, cfg.block_n) for w in weights), split)
    pointers = (x2, gate2, w0[0], ops.code, w0[1], w0[2], ops.nested_code if nested else ops.absmax, w0[3],
                bias if bias is not None else x2, target, *more[0], *more[1])
    flags = dict(QB=ops.blocksize, NESTED_QB=ops.nested_blocksize, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                 NESTED=nested, HAS_BIAS=bias is not None, PARTIAL=split > 1, WEIGHTS=len(weights), ASM=asm,
                 STAGES=cfg.num_stages, PREFETCH=cfg.prefetch, SWIGLU=gate is not None,
                 num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.max_registers is not None and not _device.INTERPRET:
        flags["maxnreg"] = cfg.max_registers
    if block_m == 1:  # one row of x (contiguous), CUDA cores
        _nf4_matmul_row_kernel[grid](*pointers, n, ns[0], ns[1] if len(ns) > 1 else 0, ops.k, per_split, **flags)
    else:  # tensor cores, M padded to block_m rows
        _nf4_matmul_tile_kernel[grid](
            *pointers, m, n, ns[0], ns[1] if len(ns) > 1 else 0, ops.k, x2.stride(0), per_split, BLOCK_M=block_m,
            DOT_FP32=DOT_FP32, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # fp32 x: full precision
            **flags)
    if split > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](
            target, bias if bias is not None else target, flat, m * n, n, split,
            HAS_BIAS=bias is not None, BLOCK=block, num_warps=4)
    return outs


def nf4_linear(x: torch.Tensor, module: torch.nn.Module, config: Config | None = None, *,
               gate: torch.Tensor | None = None) -> torch.Tensor:
    """The forward of a quantised ``bitsandbytes.nn.Linear4bit`` (nf4) through :func:`nf4_matmul`,
    in x's dtype (the module's ``compute_dtype`` plays no part: the kernel accumulates in fp32);
    ``gate``: the forward of ``silu(gate) * x`` (see :func:`nf4_matmul`)."""
    weight = getattr(module, "weight", None)
    if getattr(weight, "quant_state", None) is None:
        raise TypeError(f"module must be a quantised bitsandbytes Linear4bit (move it to a device first), "
                        f"got {type(module).__name__}")
    return nf4_matmul(x, weight, module.bias, config, gate=gate)


def nf4_linear_group(x: torch.Tensor, modules, config: Config | None = None) -> list[torch.Tensor]:
    """The forwards of 1 to 3 quantised ``Linear4bit`` modules without bias on the same x, in one launch
    (:func:`nf4_matmul_group`)."""
    weights = []
    for module in modules:
        weight = getattr(module, "weight", None)
        if getattr(weight, "quant_state", None) is None:
            raise TypeError(f"every module must be a quantised bitsandbytes Linear4bit (move it to a device first), "
                            f"got {type(module).__name__}")
        if module.bias is not None:
            raise ValueError("nf4_linear_group takes modules without bias; use nf4_linear for one with a bias")
        weights.append(weight)
    return nf4_matmul_group(x, weights, config)
