"""What the two nf4 kernels (``nf4_matvec``: one row of x; ``nf4_matmul_tile``: several rows) share, as
``@triton.jit`` helpers: which weight and tile a program owns, the load of one chunk of packed codes and
scales, the decode of the scales, the order of the eight codes of a word, and the store of the results.

A program ``(i, s)`` owns ``BLOCK_N`` output columns of one weight and the ``s``-th slice of K, walked in
chunks of ``BLOCK_K`` elements (a multiple of the quantisation ``blocksize``, QB). A chunk is, per row of
W, ``G = BLOCK_K / QB`` blocks of ``WPB = QB / 8`` 32-bit words, eight 4-bit codes a word (the layout of
``nf4_format``), and one raw scale per block.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (first: sets TRITON_INTERPRET before the helpers are defined)


@triton.jit
def _program_weight(pid_n, N, N_0, N_1, W, ABSMAX, ABSMAX2, OFFSET, W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1,
                    W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2, BLOCK_N: tl.constexpr, WEIGHTS: tl.constexpr):
    """WEIGHTS (1 to 3) weights of N_0, N_1 and N - N_0 - N_1 rows in one launch: the first programs along
    axis 0 take W, the next W_1, then W_2. Returns program ``pid_n``'s weight (its packed words, scales,
    nested scales, offset), its tile of that weight, the weight's rows and its first row of all N."""
    tile, rows, first_row = pid_n, N_0, 0
    if WEIGHTS > 1:
        if pid_n >= tl.cdiv(N_0, BLOCK_N):
            W, ABSMAX, ABSMAX2, OFFSET = W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1
            tile, rows, first_row = pid_n - tl.cdiv(N_0, BLOCK_N), N_1, N_0
    if WEIGHTS > 2:
        if pid_n >= tl.cdiv(N_0, BLOCK_N) + tl.cdiv(N_1, BLOCK_N):
            W, ABSMAX, ABSMAX2, OFFSET = W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2
            tile = pid_n - tl.cdiv(N_0, BLOCK_N) - tl.cdiv(N_1, BLOCK_N)
            rows, first_row = N - N_0 - N_1, N_0 + N_1
    return W, ABSMAX, ABSMAX2, OFFSET, tile, rows, first_row


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
def _chunk_scales(raw, g, g_ok, CODE2, ABSMAX2, offset, s_rows, n_ok, NESTED: tl.constexpr, NESTED_QB: tl.constexpr):
    """The fp32 scales [BLOCK_N, G] of a chunk from its raw scales (``g``: its blocks along the row, ``g_ok``:
    those within the row): for nested statistics ``CODE2[raw] * ABSMAX2[block // NESTED_QB] + offset``,
    else the stored fp32 absmax."""
    if NESTED:
        s_mask = n_ok[:, None] & g_ok[None, :]
        s_idx = s_rows + g[None, :]
        scale = tl.load(CODE2 + raw.to(tl.int32)) * tl.load(ABSMAX2 + s_idx // NESTED_QB, mask=s_mask, other=0.0)
        scale = scale + offset
    else:
        scale = raw.to(tl.float32)
    return scale


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
def _store_tile(OUT, BIAS, acc, rm, rn, m_ok, n_ok, M, N, rows, first_row, pid_k, PARTIAL: tl.constexpr,
                HAS_BIAS: tl.constexpr):
    """Store ``acc`` ([BLOCK_M, BLOCK_N] fp32, rows ``rm`` of x, columns ``rn`` of the program's weight) into
    the weight's (M, rows) block of OUT, which starts after the blocks of the weights before it (row
    ``first_row`` of all N). PARTIAL: fp32 partial sums into slice ``pid_k`` of an (S, M * N) buffer; else
    plus the bias, cast to OUT's dtype."""
    out_offs = M * first_row + rm[:, None] * rows + rn[None, :]
    out_mask = m_ok[:, None] & n_ok[None, :]
    if PARTIAL:
        tl.store(OUT + pid_k.to(tl.int64) * M * N + out_offs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(BIAS + rn[None, :], mask=n_ok[None, :], other=0.0).to(tl.float32)
        tl.store(OUT + out_offs, acc.to(OUT.dtype.element_ty), mask=out_mask)
