"""Decode attention over a paged KV cache: each request's keys and values live in fixed-size pages of a
shared pool, found through its row of a block table.

A contiguous cache (``decode_attention``) gives every request a slab of ``max_len`` positions, written or
not. A paged cache cuts the memory into pages of ``PAGE`` positions, (num_pages, H_kv, PAGE, D) for K and
the same for V, and gives a request pages only as it grows; its block-table row lists them in order, so
position ``t`` of request ``b`` is row ``t % PAGE`` of page ``block_table[b, t // PAGE]``. The pages of a
request need not be adjacent nor in order, and a freed page serves the next request.

The kernel is ``decode_attention``'s with two changes. The address: program ``(b, g, s)`` takes the
``GROUP`` query heads of request ``b`` that share key/value head ``g`` and the ``s``-th of ``SPLITS``
slices of the block table's capacity (split-K, for long contexts), walks the request's live positions in
blocks of ``BLOCK_T`` (the page of every position looked up in the block table) with an fp32 online
softmax, and the last slice of ``(b, g)`` to finish merges the partials in slice order. And the two
products of a block, q.K^T and p.V, go to the tensor cores (``tl.dot``, fp32 accumulation), the query
rows padded with zeros to 16; p is rounded to the cache's dtype for the second, as FlashAttention does.
``decode_attention`` multiplies on the CUDA cores in fp32, which at a batch of requests cannot keep up
with the bandwidth. Each request has its own length; slices past it write an empty partial. A batch
that fills the GPU by itself is not split (``default_splits``).
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ..device import INTERPRET
from . import check_triton_device
from .decode_attention import BLOCK_T, MAX_SPLITS, _merge_slices, _tickets, reference_attention

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PROGRAMS_PER_SM = 2  # programs a multiprocessor for the default splits (on an H200: the fewest that fill it)


@triton.jit
def _dot(a, b, FP32: tl.constexpr):
    """a @ b accumulated in fp32; with FP32 from fp32 operands, exactly (fp32 inputs; and the interpreter,
    whose bf16 products are wrong)."""
    if FP32:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _paged_decode_attention_kernel(Q, KP, VP, LENS, TABLE, PART_O, PART_ML, TICKETS, OUT, HKV, TABLE_WIDTH, SLICE,
                                   scale, GROUP: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                                   PAGE: tl.constexpr, BLOCK_T: tl.constexpr, SPLITS: tl.constexpr,
                                   FP32_DOT: tl.constexpr):
    bg = tl.program_id(0)              # request b, key/value head g: bg = b * HKV + g
    s = tl.program_id(1)
    b = bg // HKV
    g = bg % HKV
    rq = tl.arange(0, ROWS)            # ROWS >= 16 query rows for tl.dot: the GROUP heads, then rows of zeros
    rd = tl.arange(0, HEAD_DIM)
    rt = tl.arange(0, BLOCK_T)
    q_ok = rq < GROUP
    q = tl.load(Q + (bg * GROUP + rq)[:, None] * HEAD_DIM + rd[None, :], mask=q_ok[:, None], other=0.0)  # [ROWS, D]
    live = tl.load(LENS + b)           # this request's positions 0 ... live - 1 hold keys and values
    start = s * SLICE
    end = tl.minimum(start + SLICE, live)
    table = TABLE + b.to(tl.int64) * TABLE_WIDTH
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    for t0 in range(start, end, BLOCK_T):
        t = t0 + rt
        t_ok = t < end
        page = tl.load(table + t // PAGE, mask=t_ok, other=0).to(tl.int64)                 # [BLOCK_T]
        row = (page * HKV + g) * PAGE + t % PAGE        # row of position t in the (pages, H_kv, PAGE) rows
        offs = row[:, None] * HEAD_DIM + rd[None, :]
        k = tl.load(KP + offs, mask=t_ok[:, None], other=0.0)                               # [BLOCK_T, D]
        v = tl.load(VP + offs, mask=t_ok[:, None], other=0.0)
        scores = _dot(q, tl.trans(k), FP32_DOT) * scale                                     # [ROWS, BLOCK_T] fp32
        scores = tl.where(t_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, FP32_DOT)
        m = m_new
    # rows past GROUP are not outputs: they all write one spare row past the end of OUT
    out = OUT + tl.where(q_ok, bg * GROUP + rq, tl.num_programs(0) * GROUP)[:, None] * HEAD_DIM + rd[None, :]
    if SPLITS == 1:  # the one slice holds positions 0 ... live - 1, live >= 1, so l > 0
        tl.store(out, (acc / l[:, None]).to(OUT.dtype.element_ty))
    else:
        first = bg * SPLITS * ROWS + rq    # row of partials of slice s: first + s * ROWS
        tl.store(PART_O + (first + s * ROWS)[:, None] * HEAD_DIM + rd[None, :], acc)
        tl.store(PART_ML + (first + s * ROWS) * 2, m)
        tl.store(PART_ML + (first + s * ROWS) * 2 + 1, l)
        tl.debug_barrier()  # every thread's partials are written before the ticket (a release) is taken
        if tl.atomic_add(TICKETS + bg, 1) == SPLITS - 1:  # the last slice of (b, g): merge all, in slice order
            _merge_slices(PART_O, PART_ML, out, first, rd, ROWS, HEAD_DIM, SPLITS)
            tl.store(TICKETS + bg, 0)  # ready for the next call


def _check_shapes(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                  lengths: torch.Tensor) -> None:
    if k_pages.dim() != 4 or v_pages.shape != k_pages.shape:
        raise ValueError(f"k_pages and v_pages must both be (num_pages, H_kv, page_tokens, D), got "
                         f"{tuple(k_pages.shape)} and {tuple(v_pages.shape)}")
    _, hkv, page, d = k_pages.shape
    if d & (d - 1) or d < 16:
        raise ValueError(f"head size D = {d} must be a power of two >= 16 (64 and 128 are Llama's)")
    if page < 1 or page & (page - 1):
        raise ValueError(f"page_tokens = {page} must be a power of two")
    if q.dim() != 4 or q.shape[2] != 1 or q.shape[3] != d or q.shape[1] % max(hkv, 1):
        raise ValueError(f"q must be (B, H, 1, D={d}) with H a multiple of H_kv = {hkv}, got {tuple(q.shape)}")
    group = q.shape[1] // hkv
    if group & (group - 1):
        raise ValueError(f"H / H_kv = {group} query heads per key/value head must be a power of two")
    b = q.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] != b:
        raise ValueError(f"block_table must be (B={b}, pages per request), got {tuple(block_table.shape)}")
    if lengths.shape != (b,):
        raise ValueError(f"lengths must be (B={b},), got {tuple(lengths.shape)}")
    for name, t in (("block_table", block_table), ("lengths", lengths)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if q.dtype not in DTYPES or len({q.dtype, k_pages.dtype, v_pages.dtype}) > 1:
        raise TypeError(f"q and the pages must share one dtype of {[str(t) for t in DTYPES]}, got {q.dtype}, "
                        f"{k_pages.dtype}, {v_pages.dtype}")
    tensors = {"q": q, "k_pages": k_pages, "v_pages": v_pages, "block_table": block_table, "lengths": lengths}
    if len({t.device for t in tensors.values()}) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted({str(t.device) for t in tensors.values()})}")
    check_triton_device(q.device, "q")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")


def check_block_table(block_table: torch.Tensor, lengths: torch.Tensor, num_pages: int, page_tokens: int) -> None:
    """Raise ValueError unless every request's length is within 1 ... its capacity (table width x
    ``page_tokens``) and every page its length uses is one of the pool's ``num_pages``. Reads both tensors
    on the host (a synchronisation: not for a CUDA graph's capture)."""
    capacity = block_table.shape[1] * page_tokens
    lens = lengths.tolist()
    for b, n in enumerate(lens):
        if not 1 <= n <= capacity:
            raise ValueError(f"request {b}: length {n} is outside 1 ... {capacity}, the capacity of its block-table "
                             f"row ({block_table.shape[1]} pages of {page_tokens} tokens)")
    table = block_table.cpu()
    for b, n in enumerate(lens):
        used = table[b, :triton.cdiv(n, page_tokens)]
        bad = used[(used < 0) | (used >= num_pages)]
        if bad.numel():
            raise ValueError(f"request {b}: block table points at page {int(bad[0])}, past the pool of "
                             f"{num_pages} pages (0 ... {num_pages - 1})")


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                           lengths: torch.Tensor, splits: int | None = None, check: bool = True) -> torch.Tensor:
    """Attention of one step's queries, (B, H, 1, D), each request ``b`` over its positions 0 ...
    ``lengths[b] - 1``, held in pages ``block_table[b, 0], block_table[b, 1], ...`` of ``k_pages`` and
    ``v_pages``, (num_pages, H_kv, page_tokens, D); H a multiple of H_kv (grouped-query attention),
    scaled by 1/sqrt(D), accumulated in fp32; returns (B, H, 1, D) in q's dtype.

    ``block_table``: (B, W) int32 or int64, the pages of each request in order (entries past a request's
    length are not read); ``lengths``: (B,) int32 or int64, from 1 to W x page_tokens. ``splits``: at most
    this many slices of the W x page_tokens positions, run by separate programs (default:
    ``default_splits``). ``check``: read ``block_table`` and
    ``lengths`` on the host and refuse bad ones (``check_block_table``); pass False to time the kernel or
    to capture it in a CUDA graph, once the caller keeps them in range. Calls on one device must not overlap
    in time (one stream): the slices' ticket counters are shared, as in ``decode_attention``."""
    _check_shapes(q, k_pages, v_pages, block_table, lengths)
    num_pages, hkv, page, d = k_pages.shape
    b, width = block_table.shape
    if check:
        check_block_table(block_table, lengths, num_pages, page)
    group = q.shape[1] // hkv
    rows = max(16, group)  # tl.dot multiplies at least 16 rows
    capacity = width * page
    if splits is None:
        splits = default_splits(b * hkv, capacity, q.device)
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    out = torch.empty(q.numel() + d, dtype=q.dtype, device=q.device)  # one spare row: the kernel's padding rows
    if q.numel() == 0 or width == 0:
        return out[:q.numel()].view(q.shape)
    slice_len = triton.cdiv(triton.cdiv(capacity, splits), BLOCK_T) * BLOCK_T
    splits = triton.cdiv(capacity, slice_len)  # no slice wholly past the capacity
    part_o = torch.empty(b * hkv * splits * rows, d, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(b * hkv * splits * rows, 2, dtype=torch.float32, device=q.device)
    _paged_decode_attention_kernel[(b * hkv, splits)](
        q, k_pages, v_pages, lengths, block_table, part_o, part_ml, _tickets(q.device, b * hkv), out, hkv, width,
        slice_len, 1.0 / math.sqrt(d), GROUP=group, ROWS=rows, HEAD_DIM=d, PAGE=page, BLOCK_T=BLOCK_T, SPLITS=splits,
        FP32_DOT=q.dtype == torch.float32 or INTERPRET, num_warps=4)
    return out[:q.numel()].view(q.shape)


@functools.cache
def _programs_wanted(device: torch.device) -> int:
    """The programs that fill the GPU: ``PROGRAMS_PER_SM`` a multiprocessor (on a CPU: as on an H200)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    return PROGRAMS_PER_SM * sms


def default_splits(heads: int, capacity: int, device: torch.device) -> int:
    """Slices of the sequence for ``heads`` (request, key/value head) pairs of ``capacity`` positions: just
    enough programs to fill the GPU (a large batch needs no split), at most one loop step a slice and
    ``MAX_SPLITS``."""
    return max(1, min(MAX_SPLITS, triton.cdiv(capacity, BLOCK_T), triton.cdiv(_programs_wanted(device), heads)))


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """Caches made contiguous: (..., H_kv, ``length``, D) from ``pages`` (num_pages, H_kv, page_tokens, D)
    through block-table rows ``block_table`` (..., W), every row holding ``length`` positions. What attention
    without a paged kernel must do first: copy the whole cache, every step."""
    page = pages.shape[2]
    gathered = pages[block_table[..., :triton.cdiv(length, page)].long()].movedim(-3, -4)  # (..., H_kv, n, PAGE, D)
    return gathered.reshape(*gathered.shape[:-3], -1, pages.shape[3])[..., :length, :]


def paged_reference(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                    lengths: torch.Tensor) -> torch.Tensor:
    """What ``paged_decode_attention`` computes, in float64: each request's pages gathered, then softmax
    attention over its own length."""
    return torch.cat([reference_attention(q[b:b + 1], gather_pages(k_pages, block_table[b], n)[None],
                                          gather_pages(v_pages, block_table[b], n)[None])
                      for b, n in enumerate(lengths.tolist())])
