"""The one-row nf4 kernel: ``y = x @ W^T`` for one row of bf16 or fp32 ``x`` (a decode step), on the CUDA cores.

Every weight is read once and used for one multiply-add, so the loop must retire each weight in as few
instructions as it can. Per chunk a program loads its words of codes and their scales (``nf4_chunks``),
and per word ``_dot_ptx`` (``nf4_ptx``) decodes the eight codes in registers and sums their products with
x in fp32 multiply-adds, one fp32 sum per word; each quantisation block's sum is multiplied by its scale
once. x is widened to fp32 where it is loaded (``_widen``), once per value, not once per use.

The table the PTX holds is ``_row_value``'s: each nf4 value to within half a bf16 step, the precision of
a bf16 result. fp16 x takes the tensor-core kernel (``nf4_matmul_tile``) even for one row, whose fp16
table an fp16 result would need. Without the PTX (the interpreter, fp32 x, ``asm=False``) each code is
looked up in the table in memory: for 16-bit x the PTX's table, for fp32 x the exact fp32 table.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (first: sets TRITON_INTERPRET before the kernels are defined)
from .nf4_chunks import _chunk, _codes, _program_weight, _row_setup, _slice_chunks, _store_tile
from .nf4_ptx import PTX_DOT, _row_value, _table_planes
from .rounding import silu_mul


@triton.jit
def _dot_words(word, x, planes):
    """Per word of codes ([BLOCK_N, WORDS] int32), through ``_dot_ptx``: the fp32 sum of its eight table
    values times x (``x``: the eight fp32 x values of the word's columns, each [1, WORDS]), unscaled."""
    x0, x1, x2, x3, x4, x5, x6, x7 = x
    p0, p1, p2, p3, p4, p5, p6, p7 = planes
    return tl.inline_asm_elementwise(PTX_DOT, "=f,r" + ",f" * 8 + ",r" * 8,
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
def _nf4_matmul_row_kernel(X, GATE, W, CODE, ABSMAX, ABSMAX2, CODE2, OFFSET, BIAS, OUT,
                           W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1, W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2,
                           N, N_0, N_1, K, chunks_per_split,
                           QB: tl.constexpr, NESTED_QB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           NESTED: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                           WEIGHTS: tl.constexpr, ASM: tl.constexpr, STAGES: tl.constexpr, PREFETCH: tl.constexpr,
                           SWIGLU: tl.constexpr):
    """OUT[0, n] = sum_k X[0, k] * W[n, k] over this program's K slice, for the one row of X (contiguous).
    SWIGLU: x is ``silu(GATE) * X`` (``silu_mul``), computed as it is loaded. WEIGHTS (1 to 3) weights in
    one launch (see ``_program_weight``); weight i's result is a (1, N_i) block of OUT after the blocks
    of the weights before it. ASM: the PTX; else a lookup per weight in CODE."""
    G: tl.constexpr = BLOCK_K // QB    # quantisation blocks per chunk
    WPB: tl.constexpr = QB // 8        # 32-bit words of codes per quantisation block
    W, ABSMAX, ABSMAX2, OFFSET, pid_k, rn, rows, first_row = _program_weight(
        N, N_0, N_1, W, ABSMAX, ABSMAX2, OFFSET, W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1,
        W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2, BLOCK_N, WEIGHTS)
    rg = tl.arange(0, G)
    rv = tl.arange(0, G * WPB)         # the chunk's words along a row
    n_ok = rn < rows
    groups, w_rows, s_rows = _row_setup(W, rn, K, QB)
    offset = tl.load(OFFSET) if NESTED else 0.0
    planes = _table_planes(CODE, tl.float32) if ASM else None  # the table as byte planes for the PTX
    r2 = tl.arange(0, 2)
    # the row of x in the order of _join8's values: [G * WPB, 2, 2, 2] -> element 4c + 2d + e of a word
    x_cols = ((rv * 8)[:, None, None, None] + (4 * r2)[None, :, None, None] + (2 * r2)[None, None, :, None]
              + r2[None, None, None, :])
    acc_row = tl.zeros([BLOCK_N, G], dtype=tl.float32)  # per quantisation block of the chunk: summed at the end
    first, last, word_next, raw_next = _slice_chunks(pid_k, chunks_per_split, K, w_rows, ABSMAX, s_rows, n_ok, groups,
                                                     rg, rv, BLOCK_K, G, WPB, PREFETCH)
    for c in tl.range(first, last, num_stages=STAGES):
        word, scale, word_next, raw_next = _chunk(c, word_next, raw_next, w_rows, ABSMAX, s_rows, n_ok, last, groups,
                                                  rg, rv, CODE2, ABSMAX2, offset, G, WPB, NESTED, NESTED_QB, PREFETCH)
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
            if X.dtype.element_ty != tl.float32:
                value = _row_value(value)
            per_word = tl.sum(tl.sum(tl.sum(value * xv.to(tl.float32)[None], axis=4), axis=3), axis=2)
        acc_row += tl.sum(tl.reshape(per_word, [BLOCK_N, G, WPB]), axis=2) * scale  # each block scaled once
    rm = tl.arange(0, 1)
    _store_tile(OUT, BIAS, tl.sum(acc_row, axis=1)[None, :], rm, rn, rm < 1, n_ok, 1, N, rows, first_row, pid_k,
                PARTIAL, HAS_BIAS)
