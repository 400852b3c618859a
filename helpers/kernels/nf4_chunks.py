"""What the two nf4 kernels (``nf4_matvec``: one row of x; ``nf4_matmul_tile``: several rows) share, as
``@triton.jit`` helpers: which weight, rows and slice of K a program owns, its rows' pointers, the head of
the chunk loop (the load of one chunk of packed codes and scales, one step ahead with PREFETCH, and the
decode of the scales), the order of the eight codes of a word, and the store of the results.

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
def _program_weight(N, N_0, N_1, W, ABSMAX, ABSMAX2, OFFSET, W_1, ABSMAX_1, ABSMAX2_1, OFFSET_1,
                    W_2, ABSMAX_2, ABSMAX2_2, OFFSET_2, BLOCK_N: tl.constexpr, WEIGHTS: tl.constexpr):
    """WEIGHTS (1 to 3) weights of N_0, N_1 and N - N_0 - N_1 rows in one launch: the first programs along
    axis 0 take W, the next W_1, then W_2. Returns program ``(pid_n, pid_k)``'s weight (its packed words,
    scales, nested scales, offset), ``pid_k`` (its slice of K), its BLOCK_N rows ``rn`` of that weight, the
    weight's rows and its first row of all N."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
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
    rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    return W, ABSMAX, ABSMAX2, OFFSET, pid_k, rn, rows, first_row


@triton.jit
def _row_setup(W, rn, K, QB: tl.constexpr):
    """For the program's rows ``rn`` of its weight: the quantisation blocks per row of W, the pointers to
    each row's packed words [BLOCK_N, 1] and each row's first block index [BLOCK_N, 1]."""
    groups = K // QB                   # quantisation blocks per row of W
    w_rows = W + rn.to(tl.int64)[:, None] * tl.multiple_of(K // 8, 4)  # K: a multiple of blocksize >= 32
    s_rows = rn[:, None] * groups      # block index of each row's start (the host checks N * K / QB < 2**31)
    return groups, w_rows, s_rows


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
def _slice_chunks(pid_k, chunks_per_split, K, w_rows, ABSMAX, s_rows, n_ok, groups, rg, rv, BLOCK_K: tl.constexpr,
                  G: tl.constexpr, WPB: tl.constexpr, PREFETCH: tl.constexpr):
    """Slice ``pid_k``'s chunks ``[first, last)`` of K (``chunks_per_split`` a slice) and what ``_chunk``
    takes as the prefetched chunk in the first loop step: PREFETCH: chunk ``first``'s words and raw scales
    (``_load_chunk``); else placeholders that ``_chunk`` hands back untouched."""
    first = pid_k * chunks_per_split
    last = tl.minimum(first + chunks_per_split, tl.cdiv(K, BLOCK_K))
    if PREFETCH:
        word, raw = _load_chunk(w_rows, ABSMAX, s_rows, n_ok, first, last, groups, rg, rv, G, WPB)
    else:
        word, raw = first, first
    return first, last, word, raw


@triton.jit
def _chunk(c, word_next, raw_next, w_rows, ABSMAX, s_rows, n_ok, last, groups, rg, rv, CODE2, ABSMAX2, offset,
           G: tl.constexpr, WPB: tl.constexpr, NESTED: tl.constexpr, NESTED_QB: tl.constexpr, PREFETCH: tl.constexpr):
    """One loop step's weights: chunk ``c``'s words [BLOCK_N, G * WPB] and fp32 scales [BLOCK_N, G], and the
    prefetched next chunk. PREFETCH: chunk ``c`` is ``word_next, raw_next`` (loaded in the last step, or by
    ``_slice_chunks``) and chunk ``c + 1`` is loaded for the next step; else chunk ``c`` is loaded now and
    ``word_next, raw_next`` come back as they went in."""
    g = c * G + rg                     # block index along the row, [G]
    g_ok = g < groups
    if PREFETCH:
        word, raw = word_next, raw_next
        word_next, raw_next = _load_chunk(w_rows, ABSMAX, s_rows, n_ok, c + 1, last, groups, rg, rv, G, WPB)
    else:
        word, raw = _load_chunk(w_rows, ABSMAX, s_rows, n_ok, c, last, groups, rg, rv, G, WPB)
    scale = _chunk_scales(raw, g, g_ok, CODE2, ABSMAX2, offset, s_rows, n_ok, NESTED, NESTED_QB)
    return word, scale, word_next, raw_next


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
