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
Per chunk it loads a ``[BLOCK_N, BLOCK_K / blocksize, blocksize / 8]`` tile of 32-bit words, eight
codes each, and the tile's scales. The instruction budget is tight: at the H200's 4.8 TB/s an SM must
retire a weight in about 4 instructions. A table lookup through memory costs about 5 per weight
(extract the nibble, form a 64-bit address, load), and measured 8-18% of the copy bandwidth. So on
the GPU the codes are decoded in registers by a few lines of PTX (``_lookup_ptx``): ``prmt`` selects
bytes by 4-bit indices, which makes it a table lookup for four codes at once, 19 instructions for the
eight weights of a word (the 16-entry table rides along in eight registers as byte planes). Then:

* M = 1, bf16 or fp32 x: fp32 multiply-adds on the CUDA cores, still inside the PTX (``_dot_ptx``, one
  fp32 sum per word; each block's sum is multiplied by its scale once). A weight becomes an fp32 in one
  more ``prmt``: its 16 looked-up bits on top and the sign byte replicated below (``_row_value``: the
  table to within half a bf16 step, the precision of the bf16 result). x is widened to fp32 where it
  is loaded, once per value, not once per use. The compiled loop (sm_90): 5.6-6.1 instructions per
  weight, against 6.5-7.7 with an fp16 table and x widened per use.
* 1 < M <= ``MAX_M``, and one fp16 row: the weights times their scale, in x's dtype (``_dequant_ptx``),
  the table held in fp16 (within 2^-12 of each nf4 value). bf16 x: each weight times its fp32 scale in
  fp32, rounded once to bf16, as ``dequantize_4bit`` rounds it (a weight differs from bitsandbytes' only
  where the product lies within the table's 2^-12 of a rounding boundary); a bf16 table and a bf16 scale
  multiplied in bf16 would round three times and put 1.5x bitsandbytes' error into every weight. fp16 x:
  one packed fp16 multiply per pair. The weights are fed to ``tl.dot`` (tensor cores; M padded to 16, 32
  or 64 rows), fp32 accumulation: at 16 rows a CUDA-core loop would need ~300 TFLOP/s of fp32 to keep up
  with HBM.

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
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import device as _device  # imported first: sets TRITON_INTERPRET before the kernels are defined
from . import check_powers_of_two
from .rounding import round_to_bf16, silu_mul

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_M = 64  # rows of x one launch handles (the tensor-core path pads M to 16, 32 or 64)
MAX_SPLIT = 4  # K is split at most 4 ways
INTERPRETER_BLOCK_N = 128  # config_for's widest tile in Triton's interpreter (the GPU's table: 16 or 64)
DOT_FP32 = _device.INTERPRET  # the interpreter's tl.dot mishandles bf16 operands: give it their fp32 values


# ----------------------------------------------------------------------------------------- kernels
def _lookup_ptx(word: str, planes: list[str], use) -> str:
    """PTX that looks up the table values of the eight 4-bit codes of register ``word``, four at a time:
    for each half (0: the low 16 bits), the values as 16-bit patterns split in two registers, ``lo``
    (their low bytes) and ``hi`` (their high bytes), followed by the PTX ``use(half)``. Byte j of ``lo``
    and ``hi`` holds the value of nibble j of the half: elements ``_NIBBLE_ELEMENT`` (+ 4 for half 1).

    ``prmt`` picks one byte of 8 by each nibble's low 3 bits (``s``), so the bytes of entries 0-7 and of
    entries 8-15 are looked up separately and merged by each nibble's bit 3 (``t``; a byte mask ``m``
    made by one more ``prmt``; ``lop3`` 0xd8 is ``(a & ~m) | (b & m)``). ``prmt`` reads the low 16 bits
    of its selector, so the second half is the first shifted. ``planes``: the table as eight byte
    planes (see ``_plane``). Registers: s, t, m, a, b, lo, hi."""
    body = f"""
 and.b32 s, {word}, 0x77777777;
 shr.b32 t, {word}, 1;
 and.b32 t, t, 0x44444444;"""
    for half in range(2):
        if half:
            body += "\n shr.b32 s, s, 16;\n shr.b32 t, t, 16;"
        body += f"""
 prmt.b32 m, 0, 0xffffffff, t;
 prmt.b32 a, {planes[0]}, {planes[1]}, s;
 prmt.b32 b, {planes[2]}, {planes[3]}, s;
 lop3.b32 lo, a, b, m, 0xd8;
 prmt.b32 a, {planes[4]}, {planes[5]}, s;
 prmt.b32 b, {planes[6]}, {planes[7]}, s;
 lop3.b32 hi, a, b, m, 0xd8;""" + use(half)
    return body


_NIBBLE_ELEMENT = (1, 0, 3, 2)  # nibble j of a little-endian 16-bit half holds element _NIBBLE_ELEMENT[j]
# prmt selectors that pair the looked-up bytes into two 16-bit values in storage order
_PAIRS = ("0x4051", "0x6273")  # elements (0, 1) and (2, 3) of the four
# prmt selectors that make an fp32 of looked-up value j: its 16 bits on top, the low 16 bits the sign of
# the value replicated (0 for a value >= 0, 0xffff below; ``_row_value`` makes the table for that)
_F32 = ("0x40cc", "0x51dd", "0x62ee", "0x73ff")


def _dequant_ptx(dtype: torch.dtype) -> str:
    """PTX for one 32-bit word of packed codes (``$8``) and its block's scale (``$9``, fp32): its eight
    weights in ``dtype`` (fp16 or bf16), ``$0`` ... ``$7`` in storage order (element 2j is the high nibble
    of byte j); ``$10`` ... ``$17``: the table in fp16 (byte planes). fp16: one packed multiply by the
    scale (rounded to fp16) per pair of weights. bf16: each table value widened to fp32, times the fp32
    scale, the pair rounded once to bf16 (``dequantize_4bit``'s rounding; a bf16 table and scale
    multiplied in bf16 would round each weight three times)."""
    # p: two fp16 table values (low half: the first in storage order), made two weights in place
    if dtype == torch.float16:
        head, scaled = "\n cvt.rn.f16x2.f32 sc, $9, $9;", " mul.rn.f16x2 p, p, sc;"
    else:
        head, scaled = "", (" mov.b32 {h0, h1}, p;\n cvt.f32.f16 f0, h0;\n cvt.f32.f16 f1, h1;\n mul.rn.f32 f0, f0, $9;"
                            "\n mul.rn.f32 f1, f1, $9;\n cvt.rn.bf16x2.f32 p, f1, f0;")

    def store(half: int) -> str:
        return "".join(f"\n prmt.b32 p, lo, hi, {pair};\n{scaled}\n mov.b32 {{${4 * half + 2 * j}, "
                       f"${4 * half + 2 * j + 1}}}, p;" for j, pair in enumerate(_PAIRS))

    return ("{\n .reg .b32 s, t, m, a, b, lo, hi, p, sc;\n .reg .b16 h0, h1;\n .reg .f32 f0, f1;" + head
            + _lookup_ptx("$8", [f"${i}" for i in range(10, 18)], store) + "\n}")


def _dot_ptx() -> str:
    """PTX for the one-row path: ``$0`` (fp32) = the sum of the eight products of one word of codes
    (``$1``) and the eight x values of its columns (``$2`` ... ``$9``, fp32, in storage order), in fp32
    multiply-adds; ``$10`` ... ``$17``: the table as ``_row_value`` makes it (byte planes of its top 16
    bits). A product costs one ``prmt`` (the weight as fp32) and one ``fma``."""

    def multiply_add(half: int) -> str:
        return "".join(f"\n prmt.b32 p, lo, hi, {sel};\n fma.rn.f32 acc, p, ${2 + 4 * half + _NIBBLE_ELEMENT[j]}, "
                       "acc;" for j, sel in enumerate(_F32))

    return ("{\n .reg .b32 s, t, m, a, b, lo, hi, p;\n .reg .f32 acc;\n mov.f32 acc, 0f00000000;"
            + _lookup_ptx("$1", [f"${i}" for i in range(10, 18)], multiply_add) + "\n mov.f32 $0, acc;\n}")


_PTX_BF16 = tl.constexpr(_dequant_ptx(torch.bfloat16))
_PTX_FP16 = tl.constexpr(_dequant_ptx(torch.float16))
_DOT = tl.constexpr(_dot_ptx())


@triton.jit
def _row_value(v):
    """The fp32 the one-row PTX makes of table value ``v``: 16 bits chosen here on top, and below them
    0x0000 for v >= 0 (v rounded to bf16) or 0xffff for v < 0 (the nearest such fp32): within half a
    bf16 step of v either way."""
    bits = v.to(tl.int32, bitcast=True)
    bits = tl.where(bits >= 0, (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536, ((bits - 0x7FFF) & -65536) | 0xFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _plane(CODE, FIRST: tl.constexpr, HIGH: tl.constexpr, DTYPE: tl.constexpr):
    """One byte plane of the table for the PTX: the low (HIGH=0) or high byte of entries FIRST ... FIRST+3,
    in bytes 0 ... 3 of an int32 (kept in a register through the loop). The entries rounded to DTYPE
    (bf16, fp16), or for DTYPE fp32 the top 16 bits of ``_row_value``."""
    word = 0
    for j in tl.static_range(4):
        v = tl.load(CODE + FIRST + j)
        if DTYPE == tl.bfloat16:
            bits = round_to_bf16(v).to(tl.int32, bitcast=True) >> 16
        elif DTYPE == tl.float32:
            bits = _row_value(v).to(tl.int32, bitcast=True) >> 16
        else:
            bits = v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        word = word | (((bits >> (8 * HIGH)) & 0xFF) << (8 * j))
    return word


@triton.jit
def _join8(v0, v1, v2, v3, v4, v5, v6, v7):
    """[..., 2, 2, 2] with element 4c + 2d + e = v_(4c + 2d + e): the eight values of a word in order."""
    return tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))


@triton.jit
def _codes(word):
    """The 4-bit codes of ``word`` (int32), as [..., 2, 2, 2] in storage order (see ``_join8``)."""
    return _join8((word >> 4) & 15, word & 15, (word >> 12) & 15, (word >> 8) & 15,
                  (word >> 20) & 15, (word >> 16) & 15, (word >> 28) & 15, (word >> 24) & 15)


@triton.jit
def _dequant_words(word, scale, CODE, planes, DTYPE: tl.constexpr, ASM: tl.constexpr):
    """The weights of ``word`` ([BLOCK_N, WORDS] int32 words of packed codes) times ``scale`` (fp32,
    same shape), in DTYPE, as [..., 2, 2, 2] (see ``_join8``). ASM: the PTX above (fp16, bf16 on a GPU)
    with ``planes`` (the eight ``_plane`` words of the fp16 table); else a 16-entry table lookup per
    weight with the same roundings (the interpreter, and fp32 results)."""
    if ASM:
        p0, p1, p2, p3, p4, p5, p6, p7 = planes
        args = [word, scale, p0, p1, p2, p3, p4, p5, p6, p7]
        if DTYPE == tl.bfloat16:
            v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                _PTX_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,f" + ",r" * 8, args, dtype=(tl.int16,) * 8, is_pure=True, pack=1)
        else:
            v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                _PTX_FP16, "=h,=h,=h,=h,=h,=h,=h,=h,r,f" + ",r" * 8, args, dtype=(tl.int16,) * 8, is_pure=True, pack=1)
        w = _join8(v0, v1, v2, v3, v4, v5, v6, v7).to(DTYPE, bitcast=True)
    else:
        value = tl.load(CODE + _codes(word))
        s = scale[:, :, None, None, None]
        if DTYPE == tl.bfloat16:  # the PTX's roundings: the table to fp16, the fp32 product rounded once
            w = round_to_bf16(value.to(tl.float16).to(tl.float32) * s)
        elif DTYPE == tl.float16:
            w = value.to(tl.float16).to(tl.float32) * s.to(tl.float16).to(tl.float32)
        else:
            w = value * s
        w = w.to(DTYPE)  # bf16: exact (already rounded); fp16: the product's one rounding, as mul.rn.f16x2
    return w


@triton.jit
def _dot_words(word, x, planes):
    """Per word of codes ([BLOCK_N, WORDS] int32), through ``_dot_ptx``: the fp32 sum of its eight table
    values times x (``x``: the eight fp32 x values of the word's columns, each [1, WORDS]), unscaled."""
    x0, x1, x2, x3, x4, x5, x6, x7 = x
    p0, p1, p2, p3, p4, p5, p6, p7 = planes
    return tl.inline_asm_elementwise(_DOT, "=f,r" + ",f" * 8 + ",r" * 8,
                                     [word, x0, x1, x2, x3, x4, x5, x6, x7, p0, p1, p2, p3, p4, p5, p6, p7],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _widen(v):
    """16-bit floats to fp32 through PTX, so the conversion stays where it is written: the compiler moves
    a cast to after a change of layout (where it would run once per use instead of once per value)."""
    if v.dtype == tl.bfloat16:  # the 16 bits moved up (cvt.f32.bf16 needs sm_90)
        out = tl.inline_asm_elementwise("{ .reg .b16 z; mov.b16 z, 0; mov.b32 $0, {z, $1}; }", "=f,h", [v],
                                        dtype=tl.float32, is_pure=True, pack=1)
    else:
        out = tl.inline_asm_elementwise("cvt.f32.f16 $0, $1;", "=f,h", [v], dtype=tl.float32, is_pure=True, pack=1)
    return out


@triton.jit
def _split8(v):
    """The eight values of [..., 2, 2, 2] (see ``_join8``) in order, each [...]."""
    a, b = tl.split(v)
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    v0, v4 = tl.split(a0)
    v2, v6 = tl.split(a1)
    v1, v5 = tl.split(b0)
    v3, v7 = tl.split(b1)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _load_chunk(w_rows, ABSMAX, s_rows, n_ok, c, last, groups, rg, rv, G: tl.constexpr, WPB: tl.constexpr):
    """Chunk ``c``'s words of codes [BLOCK_N, G * WPB] and its raw scales [BLOCK_N, G] (uint8 codes of
    nested statistics, else the stored absmax); nothing (zeros) for ``c >= last``."""
    end = tl.minimum(groups, last * G)  # blocks from chunk ``last`` on: masked off
    v = c * (G * WPB) + rv             # word index along the row
    word = tl.load(w_rows + v[None, :], mask=n_ok[:, None] & (v < end * WPB)[None, :], other=0)
    g = c * G + rg
    raw = tl.load(ABSMAX + s_rows + g[None, :], mask=n_ok[:, None] & (g < end)[None, :], other=0)
    return word, raw


@triton.jit
def _nf4_matmul_kernel(X, GATE, W, CODE, ABSMAX, ABSMAX2, CODE2, OFFSET, BIAS, OUT,
                       W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1, W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2,
                       M, N, N_0, N_1, K, stride_xm, chunks_per_split,
                       QB: tl.constexpr, NESTED_QB: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       NESTED: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, WEIGHTS: tl.constexpr,
                       ASM: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr, STAGES: tl.constexpr,
                       PREFETCH: tl.constexpr, SWIGLU: tl.constexpr):
    """OUT[m, n] = sum_k X[m, k] * W[n, k] over this program's K slice (see the module docstring).
    SWIGLU: x is ``silu(GATE) * X`` (``silu_mul``), computed as it is loaded.
    WEIGHTS (1 to 3) weights of N_0, N_1 and N - N_0 - N_1 rows, one launch: the first programs along
    axis 0 take W, the next W_1, then W_2; weight i's result is an (M, N_i) block of OUT after the
    blocks of the weights before it."""
    G: tl.constexpr = BLOCK_K // QB    # quantisation blocks per chunk
    WPB: tl.constexpr = QB // 8        # 32-bit words of codes per quantisation block
    DTYPE: tl.constexpr = X.dtype.element_ty
    PLANES: tl.constexpr = tl.float32 if BLOCK_M == 1 else tl.float16  # the table's format in the PTX
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    tile, rows, first_row = pid_n, N_0, 0  # this program's tile of its weight, the weight's rows, its first row
    if WEIGHTS > 1:
        if pid_n >= tl.cdiv(N_0, BLOCK_N):
            W, ABSMAX, ABSMAX2, OFFSET = W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1
            tile, rows, first_row = pid_n - tl.cdiv(N_0, BLOCK_N), N_1, N_0
    if WEIGHTS > 2:
        if pid_n >= tl.cdiv(N_0, BLOCK_N) + tl.cdiv(N_1, BLOCK_N):
            W, ABSMAX, ABSMAX2, OFFSET = W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2
            tile = pid_n - tl.cdiv(N_0, BLOCK_N) - tl.cdiv(N_1, BLOCK_N)
            rows, first_row = N - N_0 - N_1, N_0 + N_1
    rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rg = tl.arange(0, G)
    rv = tl.arange(0, G * WPB)         # the chunk's words along a row
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < rows
    m_ok = rm < M
    groups = K // QB                   # quantisation blocks per row of W
    w_rows = W + rn.to(tl.int64)[:, None] * tl.multiple_of(K // 8, 4)  # K: a multiple of blocksize >= 32
    s_rows = rn[:, None] * groups      # block index of each row's start (the host checks N * K / QB < 2**31)
    x_rows = X + rm.to(tl.int64)[:, None] * stride_xm
    g_rows = GATE + rm.to(tl.int64)[:, None] * stride_xm  # the gate has x's strides
    if NESTED:
        offset = tl.load(OFFSET)
    if ASM:  # the table as byte planes for the PTX
        planes = (_plane(CODE, 0, 0, PLANES), _plane(CODE, 4, 0, PLANES), _plane(CODE, 8, 0, PLANES),
                  _plane(CODE, 12, 0, PLANES), _plane(CODE, 0, 1, PLANES), _plane(CODE, 4, 1, PLANES),
                  _plane(CODE, 8, 1, PLANES), _plane(CODE, 12, 1, PLANES))
    else:  # the lookup path reads the table itself: placeholders
        planes = (pid_n, pid_n, pid_n, pid_n, pid_n, pid_n, pid_n, pid_n)
    r2 = tl.arange(0, 2)
    # one row of x in the order of _join8's values: [G * WPB, 2, 2, 2] -> element 4c + 2d + e of a word
    x_cols = ((rv * 8)[:, None, None, None] + (4 * r2)[None, :, None, None] + (2 * r2)[None, None, :, None]
              + r2[None, None, None, :])
    acc_row = tl.zeros([BLOCK_N, G], dtype=tl.float32)  # per quantisation block of the chunk: summed at the end
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    first = pid_k * chunks_per_split
    last = tl.minimum(first + chunks_per_split, tl.cdiv(K, BLOCK_K))
    if PREFETCH:
        word_next, raw_next = _load_chunk(w_rows, ABSMAX, s_rows, n_ok, first, last, groups, rg, rv, G, WPB)
    for c in tl.range(first, last, num_stages=STAGES):
        g = c * G + rg                 # block index along the row, [G]
        g_ok = g < groups
        if PREFETCH:  # this chunk's words and scales were loaded in the last step; load the next one's
            word, raw = word_next, raw_next
            word_next, raw_next = _load_chunk(w_rows, ABSMAX, s_rows, n_ok, c + 1, last, groups, rg, rv, G, WPB)
        else:
            word, raw = _load_chunk(w_rows, ABSMAX, s_rows, n_ok, c, last, groups, rg, rv, G, WPB)
        s_mask = n_ok[:, None] & g_ok[None, :]
        s_idx = s_rows + g[None, :]
        if NESTED:
            scale = tl.load(CODE2 + raw.to(tl.int32)) * tl.load(ABSMAX2 + s_idx // NESTED_QB, mask=s_mask,
                                                                other=0.0)
            scale = scale + offset
        else:
            scale = raw.to(tl.float32)
        if BLOCK_M == 1:  # CUDA cores: fp32 multiply-adds, each block summed, then scaled once
            x_ok = (c * G * WPB + rv < groups * WPB)[:, None, None, None]
            xv = tl.load(X + c * BLOCK_K + x_cols, mask=x_ok, other=0.0)
            if SWIGLU:
                xv = silu_mul(tl.load(GATE + c * BLOCK_K + x_cols, mask=x_ok, other=0.0), xv)
            if ASM:  # x to fp32 in the layout it was loaded in (a plain cast would be moved after the broadcast)
                x0, x1, x2, x3, x4, x5, x6, x7 = _split8(_widen(xv))
                per_word = _dot_words(word, (x0[None], x1[None], x2[None], x3[None], x4[None], x5[None], x6[None],
                                             x7[None]), planes)
            else:  # a lookup per weight; for 16-bit x the table the PTX makes
                value = tl.load(CODE + _codes(word))
                if DTYPE != tl.float32:
                    value = _row_value(value)
                per_word = tl.sum(tl.sum(tl.sum(value * xv.to(tl.float32)[None], axis=4), axis=3), axis=2)
            acc_row += tl.sum(tl.reshape(per_word, [BLOCK_N, G, WPB]), axis=2) * scale
        else:  # tensor cores: the scaled weights in x's dtype, M padded to BLOCK_M rows
            scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [BLOCK_N, G, WPB]), [BLOCK_N, G * WPB])
            w = tl.reshape(_dequant_words(word, scale, CODE, planes, DTYPE, ASM), [BLOCK_N, BLOCK_K])
            x_ok = m_ok[:, None] & (c * BLOCK_K + rk < K)[None, :]
            xv = tl.load(x_rows + (c * BLOCK_K + rk)[None, :], mask=x_ok, other=0.0)
            if SWIGLU:
                xv = silu_mul(tl.load(g_rows + (c * BLOCK_K + rk)[None, :], mask=x_ok, other=0.0), xv)
            if DOT_FP32:  # same products (16-bit values are exact in fp32), for the interpreter's tl.dot
                w, xv = w.to(tl.float32), xv.to(tl.float32)
            acc = tl.dot(xv, tl.trans(w), acc, input_precision=PRECISION)
    if BLOCK_M == 1:
        acc = tl.sum(acc_row, axis=1)[None, :]
    out_offs = M * first_row + rm[:, None] * rows + rn[None, :]  # this weight's (M, N_i) block
    out_mask = m_ok[:, None] & n_ok[None, :]
    if PARTIAL:
        tl.store(OUT + pid_k.to(tl.int64) * M * N + out_offs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(BIAS + rn[None, :], mask=n_ok[None, :], other=0.0).to(tl.float32)
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
    (a multiple of the weight's blocksize), ``num_warps``, ``split_k`` slices of K run by separate
    programs (then summed by a second kernel), ``num_stages``: 1 loads each chunk when it is needed;
    more prefetch the next chunks' words and x through shared memory (asynchronous copies), and
    ``prefetch``: load each chunk's words and scales into registers one loop step ahead of their use."""

    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1
    num_stages: int = 1
    prefetch: bool = False

    def __post_init__(self):
        check_powers_of_two(self, "block_n", "block_k", "num_warps")
        if self.block_k < 32:
            raise ValueError(f"Config.block_k must be >= 32 (the smallest blocksize), got {self.block_k}")
        if self.split_k < 1 or self.num_stages < 1:
            raise ValueError(f"Config.split_k and Config.num_stages must be >= 1, got {self.split_k}, "
                             f"{self.num_stages}")


# rows of the padded M -> (block_n, block_k, num_warps, prefetch, min_programs), from
# scripts/nf4_gemv_tune.py on the H200 (graph-timed, every Llama-2-7B shape and the grouped launches):
# 1 row: 16 x 2048, 4 warps, one chunk ahead, within 6% of each shape's fastest launch; K is split only when
# the grid would leave SMs idle (a split's partial sums cost a second kernel, slower on every 7B shape).
# 16 rows: 64 x 256, 4 warps, K split until ~1024 programs: the fastest tile on every shape. 32, 64: not measured.
_TABLE = {1: (16, 2048, 4, True, 128), 16: (64, 256, 4, False, 1024), 32: (64, 256, 4, False, 1024),
          64: (64, 128, 8, False, 1024)}


def _block_m(m: int, dtype: torch.dtype) -> int:
    """Rows of x one program holds: 1 on the CUDA-core path (one row of bf16 or fp32 x), else M padded
    for ``tl.dot``. One fp16 row takes the tensor cores too: the one-row table holds bf16 precision
    (``_row_value``), which an fp16 result would show."""
    return 1 if m == 1 and dtype != torch.float16 else max(16, triton.next_power_of_2(m))


def config_for(m: int, n: int, k: int, blocksize: int = 64, dtype: torch.dtype = torch.bfloat16) -> Config:
    """The default launch shape for M rows of x (``dtype``) against an (N, K) weight: the table above, ``block_k``
    cut to K (rounded up to a power of two) and at least ``blocksize``, and K split (up to ``MAX_SPLIT``
    ways) while the grid has fewer programs than the table's minimum and each slice keeps two chunks.
    In the interpreter ``block_n`` then widens to ``INTERPRETER_BLOCK_N`` (fewer programs to simulate)."""
    block_n, block_k, warps, prefetch, min_programs = _TABLE[_block_m(max(1, min(m, MAX_M)), dtype)]
    block_k = max(min(block_k, triton.next_power_of_2(k)), blocksize)
    split, programs, chunks = 1, triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    while programs * split < min_programs and split < MAX_SPLIT and chunks >= 4 * split:
        split *= 2
    if _device.INTERPRET:  # the interpreter's cost is per program: wider tiles, the GPU's K split kept
        block_n = max(block_n, INTERPRETER_BLOCK_N)  # one width for every N: the same sums, grouped or not
    return Config(block_n, block_k, warps, split, prefetch=prefetch)


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
    if packed.data_ptr() % 4:
        raise ValueError("the packed weight must start at a 4-byte boundary (the kernel reads 32-bit words)")
    code = qs.code
    if code.numel() != 16 or not code.is_floating_point():
        raise ValueError(f"quant_state.code must hold the 16 nf4 values, got {tuple(code.shape)} {code.dtype}")
    groups = n * k // bs
    if groups >= 2**31:
        raise ValueError(f"N * K / blocksize = {groups} blocks: the kernel indexes blocks with 32-bit integers")
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
    _nf4_matmul_kernel[(sum(triton.cdiv(w.n, cfg.block_n) for w in weights), split)](
        x2, gate2, w0[0], ops.code, w0[1], w0[2], ops.nested_code if nested else ops.absmax, w0[3],
        bias if bias is not None else x2, target, *more[0], *more[1],
        m, n, ns[0], ns[1] if len(ns) > 1 else 0, ops.k, x2.stride(0), per_split,
        QB=ops.blocksize, NESTED_QB=ops.nested_blocksize, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, NESTED=nested, HAS_BIAS=bias is not None, PARTIAL=split > 1, WEIGHTS=len(weights),
        ASM=asm, DOT_FP32=DOT_FP32, STAGES=cfg.num_stages, PREFETCH=cfg.prefetch, SWIGLU=gate is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # fp32 x: full-precision products
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
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
