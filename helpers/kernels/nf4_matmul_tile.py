"""The multi-row nf4 kernel: ``y = x @ W^T`` for 1 < M <= ``MAX_M`` rows of x (and one row of fp16 x), on
the tensor cores.

At several rows a weight is used once per row: a CUDA-core loop would need M fp32 multiply-adds per weight
read. So per chunk a program dequantises its weights once (``_dequant_words``), in x's dtype, and feeds
them to ``tl.dot`` with x padded to BLOCK_M (16, 32 or 64) rows, accumulating in fp32.

On the GPU the weights come from ``_dequant_ptx`` (``nf4_ptx``), the table held in fp16 (within 2^-12 of
each nf4 value). bf16 x: each weight times its fp32 scale in fp32, rounded once to bf16, as
``dequantize_4bit`` rounds it (a weight differs from bitsandbytes' only where the product lies within the
table's 2^-12 of a rounding boundary); a bf16 table and a bf16 scale multiplied in bf16 would round three
times and put 1.5x bitsandbytes' error into every weight. fp16 x: one packed fp16 multiply per pair.
Without the PTX (the interpreter, fp32 x, ``asm=False``) the same arithmetic runs as a lookup per weight,
with the PTX's roundings for 16-bit x and the exact fp32 table for fp32 x.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (first: sets TRITON_INTERPRET before the kernels are defined)
from .nf4_chunks import _chunk, _codes, _join8, _program_weight, _row_setup, _slice_chunks, _store_tile
from .nf4_ptx import PTX_BF16, PTX_FP16, _table_planes
from .rounding import round_to_bf16, silu_mul


@triton.jit
def _dequant_words(word, scale, CODE, planes, DTYPE: tl.constexpr, ASM: tl.constexpr):
    """The weights of ``word`` ([BLOCK_N, WORDS] int32 words of packed codes) times ``scale`` (fp32,
    same shape), in DTYPE, as [..., 2, 2, 2] (see ``_join8``). ASM: ``_dequant_ptx`` (fp16, bf16 on a GPU)
    with ``planes`` (the eight ``_plane`` words of the fp16 table); else a 16-entry table lookup per
    weight with the same roundings (the interpreter, and fp32 results)."""
    if ASM:
        p0, p1, p2, p3, p4, p5, p6, p7 = planes
        args = [word, scale, p0, p1, p2, p3, p4, p5, p6, p7]
        if DTYPE == tl.bfloat16:
            v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                PTX_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,f" + ",r" * 8, args, dtype=(tl.int16,) * 8, is_pure=True, pack=1)
        else:
            v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
                PTX_FP16, "=h,=h,=h,=h,=h,=h,=h,=h,r,f" + ",r" * 8, args, dtype=(tl.int16,) * 8, is_pure=True, pack=1)
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
def _nf4_matmul_tile_kernel(X, GATE, W, CODE, ABSMAX, ABSMAX2, CODE2, OFFSET, BIAS, OUT,
                            W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1, W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2,
                            M, N, N_0, N_1, K, stride_xm, chunks_per_split,
                            QB: tl.constexpr, NESTED_QB: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            NESTED: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                            WEIGHTS: tl.constexpr, ASM: tl.constexpr, DOT_FP32: tl.constexpr,
                            PRECISION: tl.constexpr, STAGES: tl.constexpr, PREFETCH: tl.constexpr,
                            SWIGLU: tl.constexpr):
    """OUT[m, n] = sum_k X[m, k] * W[n, k] over this program's K slice, M rows of X padded to BLOCK_M.
    SWIGLU: x is ``silu(GATE) * X`` (``silu_mul``), computed as it is loaded. WEIGHTS (1 to 3) weights in
    one launch (see ``_program_weight``); weight i's result is an (M, N_i) block of OUT after the blocks
    of the weights before it. ASM: the PTX; else a lookup per weight in CODE. DOT_FP32: the operands of
    ``tl.dot`` widened to fp32 (the same products; for the interpreter). PRECISION: ``tl.dot``'s."""
    G: tl.constexpr = BLOCK_K // QB    # quantisation blocks per chunk
    WPB: tl.constexpr = QB // 8        # 32-bit words of codes per quantisation block
    DTYPE: tl.constexpr = X.dtype.element_ty
    W, ABSMAX, ABSMAX2, OFFSET, pid_k, rn, rows, first_row = _program_weight(
        N, N_0, N_1, W, ABSMAX, ABSMAX2, OFFSET, W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1,
        W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2, BLOCK_N, WEIGHTS)
    rm = tl.arange(0, BLOCK_M)
    rg = tl.arange(0, G)
    rv = tl.arange(0, G * WPB)         # the chunk's words along a row
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < rows
    m_ok = rm < M
    groups, w_rows, s_rows = _row_setup(W, rn, K, QB)
    x_rows = X + rm.to(tl.int64)[:, None] * stride_xm
    g_rows = GATE + rm.to(tl.int64)[:, None] * stride_xm  # the gate has x's strides
    offset = tl.load(OFFSET) if NESTED else 0.0
    planes = _table_planes(CODE, tl.float16) if ASM else None  # the table as byte planes for the PTX
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    first, last, word_next, raw_next = _slice_chunks(pid_k, chunks_per_split, K, w_rows, ABSMAX, s_rows, n_ok, groups,
                                                     rg, rv, BLOCK_K, G, WPB, PREFETCH)
    for c in tl.range(first, last, num_stages=STAGES):
        word, scale, word_next, raw_next = _chunk(c, word_next, raw_next, w_rows, ABSMAX, s_rows, n_ok, last, groups,
                                                  rg, rv, CODE2, ABSMAX2, offset, G, WPB, NESTED, NESTED_QB, PREFETCH)
        # the scaled weights in x's dtype: one scale per word
        scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [BLOCK_N, G, WPB]), [BLOCK_N, G * WPB])
        w = tl.reshape(_dequant_words(word, scale, CODE, planes, DTYPE, ASM), [BLOCK_N, BLOCK_K])
        x_ok = m_ok[:, None] & (c * BLOCK_K + rk < K)[None, :]
        xv = tl.load(x_rows + (c * BLOCK_K + rk)[None, :], mask=x_ok, other=0.0)
        if SWIGLU:
            xv = silu_mul(tl.load(g_rows + (c * BLOCK_K + rk)[None, :], mask=x_ok, other=0.0), xv)
        if DOT_FP32:  # same products (16-bit values are exact in fp32), for the interpreter's tl.dot
            w, xv = w.to(tl.float32), xv.to(tl.float32)
        acc = tl.dot(xv, tl.trans(w), acc, input_precision=PRECISION)
    _store_tile(OUT, BIAS, acc, rm, rn, m_ok, n_ok, M, N, rows, first_row, pid_k, PARTIAL, HAS_BIAS)
