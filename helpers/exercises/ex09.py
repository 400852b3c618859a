"""Exercises of notebook 09 (serving): the KV cache's bytes a token, a request's cache gathered from its pages,
and a decode-attention step that reads its keys and values through the block table."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import device
from ..llama import models
from ..kernels.paged_decode_attention import gather_pages, paged_reference
from .checks import TOLERANCE, Case, CodeCheck, NumberCheck, on_device


def _kv_bytes_13b() -> tuple[float, str]:
    spec = models.MODELS["13b"]
    head_dim = spec.hidden_size // spec.num_attention_heads
    value = spec.kv_bytes_per_token()
    return value, (f"2 (a key and a value) x {spec.num_hidden_layers} layers x {spec.num_key_value_heads} key/value "
                   f"heads x {head_dim} (hidden size {spec.hidden_size} / {spec.num_attention_heads} heads) x 2 bytes "
                   f"(bf16) = {value:,} bytes: ModelSpec.kv_bytes_per_token")


KV_BYTES_13B = NumberCheck("09.1", "bytes of bf16 KV cache one token takes in Llama-2-13B", _kv_bytes_13b,
                           tolerance=0.01, relative=True, unit="bytes")


def gather_request(pages: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Solution of 09.2: position ``t`` of the request is row ``t % page_tokens`` of page
    ``table_row[t // page_tokens]``; returns (H_kv, length, D) in the pages' dtype."""
    return gather_pages(pages, table_row, length).contiguous()


def _gather_inputs(case: Case, generator: torch.Generator) -> tuple:
    num_pages, hkv, page, d = case.params["pool"]
    length = case.params["length"]
    pages = torch.randn(num_pages, hkv, page, d, generator=generator).to(case.dtype)
    used = -(-length // page)
    row = torch.randperm(num_pages, generator=generator)[:used]
    row = torch.cat([row, torch.tensor([num_pages])])  # one entry past the length, no page of the pool: never read
    return on_device(pages), on_device(row), length


def _gather_reference(pages, table_row, length) -> torch.Tensor:
    pages, row = pages.detach().cpu().double(), table_row.cpu().tolist()
    page = pages.shape[2]
    return torch.stack([pages[row[t // page], :, t % page] for t in range(length)], dim=1)  # one position at a time


GATHER_REQUEST = CodeCheck(
    "09.2", "gather_request(pages, table_row, length): one request's cache, contiguous, from its pages",
    solution=gather_request, make_inputs=_gather_inputs, reference=_gather_reference,
    cases=[Case(f"{p[0]} pages of {p[2]}, {n} token{'s' * (n > 1)}", dtype, {"pool": p, "length": n})
           for p, n in (((6, 2, 4, 8), 9), ((8, 1, 8, 16), 8), ((5, 3, 2, 4), 1), ((12, 2, 4, 8), 30))
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype,), contiguous=True,
    hints={"value": "Wrong values. Position t is in page table_row[t // page_tokens] (the table, not page t // "
                    "page_tokens itself: pages are handed out in any order), at row t % page_tokens of it. "
                    "pages[i] is (H_kv, page_tokens, D): put the heads first before you join the pages.",
           "shape": "Return (H_kv, length, D): the pages a request holds cover a whole number of pages; cut "
                    "the positions past its length.",
           "raised": "Read the message above. A request holds only the first n = ceil(length / page_tokens) "
                     "entries of its table row: index pages with table_row[:n]."})


@triton.jit
def _paged_attention_kernel(Q, KP, VP, TABLE, LENS, OUT, H, HKV, TABLE_WIDTH, scale,
                            PAGE: tl.constexpr, HEAD_DIM: tl.constexpr):
    b = tl.program_id(0)                                  # request
    h = tl.program_id(1)                                  # query head
    g = h // (H // HKV)                                   # the key/value head it reads
    rt = tl.arange(0, PAGE)                               # the rows of one page
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (b * H + h) * HEAD_DIM + rd).to(tl.float32)                      # [HEAD_DIM]
    length = tl.load(LENS + b)
    m = -float("inf")                                     # running maximum of the scores
    l = 0.0                                               # running sum of exp(score - m)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)          # running sum of exp(score - m) * v
    for p in range(0, tl.cdiv(length, PAGE)):             # the request's p-th page ...
        page = tl.load(TABLE + b * TABLE_WIDTH + p).to(tl.int64)  # ... is this page of the pool
        t = p * PAGE + rt                                 # the positions it holds
        ok = t < length                                   # the last page may be partly filled
        rows = (page * HKV + g) * PAGE + rt               # rows of the (pages, H_kv, PAGE) rows of D values
        k = tl.load(KP + rows[:, None] * HEAD_DIM + rd[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(VP + rows[:, None] * HEAD_DIM + rd[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        scores = tl.where(ok, tl.sum(q[None, :] * k, axis=1) * scale, -float("inf"))  # [PAGE]
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp(m - m_new)                         # rescales what was summed under the old maximum
        w = tl.exp(scores - m_new)                        # 0 past the length
        l = l * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * v, axis=0)
        m = m_new
    tl.store(OUT + (b * H + h) * HEAD_DIM + rd, (acc / l).to(OUT.dtype.element_ty))


def paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                    lengths: torch.Tensor) -> torch.Tensor:
    """Solution of 09.3: one decode step's attention, q (B, H, 1, D), request ``b`` over its positions 0 ...
    ``lengths[b] - 1``, held in pages ``block_table[b, 0], block_table[b, 1], ...`` of ``k_pages`` and
    ``v_pages`` (num_pages, H_kv, page_tokens, D); scaled by 1/sqrt(D), fp32 online softmax page by page,
    one program a (request, query head); returns (B, H, 1, D) in q's dtype. Contiguous inputs; D and
    page_tokens powers of two; H a multiple of H_kv."""
    b, h, _, d = q.shape
    _, hkv, page, _ = k_pages.shape
    out = torch.empty_like(q)
    _paged_attention_kernel[(b, h)](q, k_pages, v_pages, block_table, lengths, out, h, hkv, block_table.shape[1],
                                    1 / math.sqrt(d), PAGE=page, HEAD_DIM=d)
    return out


def _paged_inputs(case: Case, generator: torch.Generator) -> tuple:
    """Pages handed out in random order from a pool of at least B x W pages; each block-table row has entries
    past its request's length, pointing at other pages of the pool (reading them gives wrong values, not a
    crash). Every key's first value is near ``shift`` and every query's is ``-shift``, so the scores are near
    ``-SCORE``: exp() of them underflows to 0 in fp32 unless the running maximum is subtracted first (a running
    maximum started at 0 fails too), and a position past the length that scores 0 instead of -inf outweighs them
    all."""
    h, hkv, page, d = case.params["heads"]
    lengths = case.params["lengths"]
    used = [-(-n // page) for n in lengths]
    width = max(used) + 1
    num_pages = max(sum(used) + 3, len(lengths) * width)
    order = torch.randperm(num_pages, generator=generator)
    table = torch.randint(num_pages, (len(lengths), width), generator=generator)
    for r, n in enumerate(used):
        table[r, :n] = order[sum(used[:r]):sum(used[:r]) + n]
    k_pages, v_pages = (torch.randn(num_pages, hkv, page, d, generator=generator) for _ in range(2))
    q = torch.randn(len(lengths), h, 1, d, generator=generator)
    shift = math.sqrt(SCORE * math.sqrt(d))
    k_pages[..., 0] = shift + 0.2 * k_pages[..., 0]
    q[..., 0] = -shift
    return (on_device(q.to(case.dtype)), on_device(k_pages.to(case.dtype)), on_device(v_pages.to(case.dtype)),
            on_device(table.int()), on_device(torch.tensor(lengths, dtype=torch.int32)))


SCORE = 110.0  # exp(-110) is 0 in fp32, whose smallest value is about e^-103

PAGED_ATTENTION = CodeCheck(
    "09.3", "paged_attention(q, k_pages, v_pages, block_table, lengths): one decode step over a paged cache",
    solution=paged_attention, make_inputs=_paged_inputs,
    reference=lambda *args: paged_reference(*(a.detach().cpu() for a in args)),
    cases=[Case(f"{len(n)} requests of {','.join(map(str, n))}; {h} heads ({hkv} kv) of {d}; pages of {p}", dtype,
                {"heads": (h, hkv, p, d), "lengths": n})
           for (h, hkv, p, d), n in device.pick(
               full=[((8, 2, 16, 64), [1, 37, 100, 16, 250]), ((4, 4, 8, 128), [17, 3, 64])],
               smoke=[((4, 2, 4, 16), [1, 10, 8]), ((2, 2, 8, 16), [13, 3])])
           # bf16 on a GPU only: the interpreter's fp32 -> bf16 conversion truncates (up to 2x bf16's rounding)
           for dtype in device.pick(full=(torch.float32, torch.float16, torch.bfloat16),
                                    smoke=(torch.float32, torch.float16))],
    out_dtypes=lambda case: (case.dtype,),
    # fp32 scores near -110 carry its rounding of the products (errors up to about 1.5e-5 at D = 128): looser
    # than TOLERANCE's fp32, tighter than fp16's
    tolerance=lambda case: 1e-4 if case.dtype == torch.float32 else TOLERANCE[case.dtype],
    hints={"value": "Wrong values. Is page p of request b the pool's page block_table[b, p] (the table, not p "
                    "itself: pages are handed out in any order), and are its rows 0 ... PAGE - 1 those of head g? "
                    "Do positions at or past lengths[b] score -inf (a partly filled last page holds another "
                    "request's old keys)? Does each page's update rescale what was summed before (l and acc) when "
                    "the running maximum grows? Only float16 fails: convert the loads to fp32 before the products.",
           "unwritten": "NaN in the result. Either some (request, head) outputs were never written (one program "
                        "a request and query head: a grid of two dimensions), or the sum of exp() came out 0: the "
                        "scores here are near -110 and exp(-110) is 0 in fp32. Start the running maximum at -inf "
                        "and subtract it before every tl.exp. Or rows outside the pool were read: a page's rows "
                        "are 0 ... PAGE - 1, not the positions t.",
           "raised": "The interpreter (Triton on the CPU) raised. Common causes: a block-table entry used as an "
                     "offset without .to(tl.int64); a mask of the wrong shape (k is [PAGE, HEAD_DIM]: mask it "
                     "with ok[:, None]); a tl.arange whose length is not a power of two.",
           "dtype": "Return q's dtype: .to(OUT.dtype.element_ty) in the store."})

CHECKS = (KV_BYTES_13B, GATHER_REQUEST, PAGED_ATTENTION)
