"""Decode attention over a paged KV cache, against float64 softmax attention over each request's own positions."""
import math

import pytest
import torch

import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)
from helpers.kernels.decode_attention import BLOCK_T, MAX_SPLITS, decode_attention
from helpers.kernels.paged_decode_attention import (check_block_table, default_splits, gather_pages,
                                                    paged_decode_attention)
from helpers.llama.page_pool import PagePool
from helpers.kernels.paged_decode_attention import paged_reference
from helpers.studies.kv_cache import random_block_table, to_pages
from numerics import rel_err

DEV = helpers.DEVICE
TOL = {torch.float32: 2e-6, torch.bfloat16: 1.6e-2}  # as for the contiguous kernel (tests/test_decode_attention.py)


def reference(q, k_pages, v_pages, table, lengths):
    """Each request's attention in float64 over its positions, gathered one by one from its pages."""
    group = q.shape[1] // k_pages.shape[1]
    page = k_pages.shape[2]
    out = []
    for b, n in enumerate(lengths.tolist()):
        rows = [(int(table[b, t // page]), t % page) for t in range(n)]
        k, v = (torch.stack([p.double().cpu()[i, :, j] for i, j in rows], 1).repeat_interleave(group, 0)
                for p in (k_pages, v_pages))  # (H, n, D)
        qb = q[b, :, 0].double().cpu()[:, None, :]  # (H, 1, D)
        out.append(torch.softmax(qb @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v)
    return torch.stack(out)


def pool_with(lengths, page, hkv, d, dtype, extra_pages=3):
    """A pool of pages in NaN (a page or position read by mistake shows), pages in a random order, each
    request's positions written with random keys and values."""
    n_pages = [-(-n // page) for n in lengths]
    total = sum(n_pages) + extra_pages
    k_pages, v_pages = (torch.full((total, hkv, page, d), float("nan"), dtype=dtype, device=DEV) for _ in range(2))
    order = torch.randperm(total).tolist()
    width = max(n_pages)
    table = torch.zeros(len(lengths), width, dtype=torch.int32)
    for b, (n, used) in enumerate(zip(lengths, n_pages)):
        mine, order = order[:used], order[used:]
        table[b, :used] = torch.tensor(mine)
        for t in range(n):
            for pages in (k_pages, v_pages):
                pages[mine[t // page], :, t % page] = torch.randn(hkv, d).to(dtype)
    return k_pages, v_pages, table.to(DEV), torch.tensor(lengths, dtype=torch.int32, device=DEV)


CASES = [  # (lengths, page, H, H_kv, D, splits)
    ([1, 16, 17, 33], 16, 4, 2, 16, None),  # page boundaries: one position, a full page, one past, two pages + 1
    ([5, 40, 23], 8, 4, 4, 32, 3),          # odd lengths, one head a key/value head, uneven slices
    ([50], 4, 8, 1, 16, 1),                 # one slice, eight query heads on one key/value head
    ([3, 64, 1, 29], 32, 2, 1, 64, 4),      # short requests beside a long one: their slices past them empty
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths,page,h,hkv,d,splits", CASES)
def test_ragged_batches_match_float64(lengths, page, h, hkv, d, splits, dtype, poisoned):
    k_pages, v_pages, table, lens = pool_with(lengths, page, hkv, d, dtype)
    q = torch.randn(len(lengths), h, 1, d).to(DEV, dtype)
    out = paged_decode_attention(q, k_pages, v_pages, table, lens, splits)
    assert out.shape == q.shape and out.dtype == dtype
    ref = reference(q, k_pages, v_pages, table, lens)
    assert rel_err(out, ref) < TOL[dtype]
    assert rel_err(paged_reference(q, k_pages, v_pages, table, lens), ref) < 1e-12  # the notebook's reference too


def test_equals_the_contiguous_kernel_at_equal_lengths():
    """The same caches, contiguous and in shuffled pages: the two kernels agree to fp32 rounding."""
    b, hkv, length, d, page = 3, 2, 45, 32, 8
    k, v = (torch.randn(b, hkv, length, d).to(DEV) for _ in range(2))
    q = torch.randn(b, 4, 1, d).to(DEV)
    table = random_block_table(b, -(-length // page), torch.Generator(DEV).manual_seed(0))
    k_pages, v_pages = to_pages(k, table, page), to_pages(v, table, page)
    assert torch.equal(gather_pages(k_pages, table, length), k)
    paged = paged_decode_attention(q, k_pages, v_pages, table, torch.full((b,), length, device=DEV))
    contiguous = decode_attention(q, k, v, torch.tensor([length - 1], device=DEV))
    assert rel_err(paged, contiguous) < TOL[torch.float32]


def test_a_freed_page_serves_the_next_request():
    """Request A finishes; C takes A's pages (the pool's stack hands them out first) and writes its own
    keys and values over A's: C's attention reads C's, and B, untouched, still reads its own."""
    page, hkv, d = 8, 2, 16
    pool = PagePool(6, page)
    k_pages, v_pages = (torch.randn(6, hkv, page, d).to(DEV) for _ in range(2))
    pool.allocate("A", 12)
    pool.allocate("B", 10)
    freed = pool.free("A")
    pool.allocate("C", 16)
    assert sorted(pool.pages("C")) == sorted(freed)
    for pages in (k_pages, v_pages):
        pages[pool.pages("C")] = torch.randn(2, hkv, page, d).to(DEV)
    q = torch.randn(2, 4, 1, d).to(DEV)
    table, lens = pool.block_table(["B", "C"], device=DEV), pool.lengths(["B", "C"], device=DEV)
    out = paged_decode_attention(q, k_pages, v_pages, table, lens)
    assert rel_err(out, reference(q, k_pages, v_pages, table, lens)) < TOL[torch.float32]


def test_growing_a_request_page_by_page_matches_float64():
    """A decode loop: each step the request grows by one token (a new page every ``page`` steps)."""
    page, hkv, d = 4, 1, 16
    pool = PagePool(8, page)
    k_pages, v_pages = (torch.randn(8, hkv, page, d).to(DEV) for _ in range(2))
    pool.allocate(0, 1)
    for n in (1, 4, 5, 9):
        pool.extend(0, n)
        q = torch.randn(1, 2, 1, d).to(DEV)
        table, lens = pool.block_table([0], device=DEV), pool.lengths([0], device=DEV)
        out = paged_decode_attention(q, k_pages, v_pages, table, lens, splits=2)
        assert rel_err(out, reference(q, k_pages, v_pages, table, lens)) < TOL[torch.float32]
    assert len(pool.pages(0)) == 3


def test_bad_input_is_a_clear_error():
    k_pages, v_pages, table, lens = pool_with([5, 9], 4, 2, 16, torch.float32, extra_pages=0)
    q = torch.randn(2, 4, 1, 16, device=DEV)
    past = table.clone()
    past[1, 2] = k_pages.shape[0]
    with pytest.raises(ValueError, match="request 1: block table points at page 5, past the pool of 5 pages"):
        paged_decode_attention(q, k_pages, v_pages, past, lens)
    with pytest.raises(ValueError, match=r"request 0: length 13 is outside 1 \.\.\. 12"):
        paged_decode_attention(q, k_pages, v_pages, table, torch.tensor([13, 9], dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="length 0"):
        check_block_table(table, torch.tensor([0, 9]), k_pages.shape[0], 4)
    with pytest.raises(TypeError, match="block_table must be int32 or int64"):
        paged_decode_attention(q, k_pages, v_pages, table.float(), lens)
    with pytest.raises(TypeError, match="share one dtype"):
        paged_decode_attention(q.half(), k_pages, v_pages, table, lens)
    with pytest.raises(ValueError, match="block_table must be"):
        paged_decode_attention(q, k_pages, v_pages, table[:1], lens)
    with pytest.raises(ValueError, match="lengths must be"):
        paged_decode_attention(q, k_pages, v_pages, table, lens[:1])
    with pytest.raises(ValueError, match="multiple of H_kv"):
        paged_decode_attention(q[:, :3], k_pages, v_pages, table, lens)
    with pytest.raises(ValueError, match="k_pages and v_pages"):
        paged_decode_attention(q, k_pages, v_pages[:, :1], table, lens)
    with pytest.raises(ValueError, match="one device"):
        paged_decode_attention(q, k_pages, v_pages, table, lens.to("meta"))
    with pytest.raises(ValueError, match="contiguous"):
        paged_decode_attention(q, k_pages, v_pages, table.t().contiguous().t(), lens)
    with pytest.raises(ValueError, match="splits"):
        paged_decode_attention(q, k_pages, v_pages, table, lens, splits=0)


@pytest.mark.skipif(not helpers.INTERPRET, reason="the order is the interpreter's to set; a GPU picks its own")
def test_the_last_slice_to_finish_merges_whatever_the_order(program_order, poisoned):
    """Slices run in reverse and shuffled: the one that takes the last ticket merges every partial, in
    slice order, so the result is the same bit for bit (see tests/test_decode_attention.py)."""
    k_pages, v_pages, table, lens = pool_with([7, 30, 2], 4, 2, 16, torch.float32)
    q = torch.randn(3, 4, 1, 16).to(DEV)
    program_order("grid")
    in_order = paged_decode_attention(q, k_pages, v_pages, table, lens, splits=4)
    for order in ("reversed", "shuffled"):
        program_order(order)
        out = paged_decode_attention(q, k_pages, v_pages, table, lens, splits=4)
        assert torch.equal(out, in_order), order
    assert rel_err(in_order, reference(q, k_pages, v_pages, table, lens)) < TOL[torch.float32]


def test_default_splits_fill_the_gpu_and_no_more():
    """One request of a long context is split; a batch that fills the GPU by itself is not; a slice holds
    at least one loop step and there are at most MAX_SPLITS."""
    cpu = torch.device("cpu")
    assert default_splits(32, 4096, cpu) > 1
    assert default_splits(64 * 32, 4096, cpu) == 1
    assert default_splits(1, 2 * BLOCK_T, cpu) == 2
    assert default_splits(1, 1 << 20, cpu) == MAX_SPLITS


@pytest.mark.gpu
def test_on_a_gpu_at_llama_shapes_and_replayed_in_a_cuda_graph():
    """Llama-2 7B's heads in bf16, a ragged batch up to the whole context (split along it), the kernel
    captured once in a CUDA graph and replayed after the lengths change in place: it reads them from the
    device, as a graphed decoder needs."""
    page, hkv, d, width = 16, 32, 128, 4096 // 16
    table = torch.randperm(4 * width, device=DEV).reshape(4, width).to(torch.int32)  # pages out of order
    k_pages, v_pages = (torch.randn(4 * width, hkv, page, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(4, 32, 1, d, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor([1, 300, 4096, 1000], dtype=torch.int32, device=DEV)
    out = paged_decode_attention(q, k_pages, v_pages, table, lens)
    assert rel_err(out, paged_reference(q, k_pages, v_pages, table, lens)) < TOL[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed = paged_decode_attention(q, k_pages, v_pages, table, lens, check=False)
    for new in ([17, 4095, 2, 640], [4096, 1, 33, 1000]):
        lens.copy_(torch.tensor(new, dtype=torch.int32, device=DEV))
        graph.replay()
        assert rel_err(graphed, paged_reference(q, k_pages, v_pages, table, lens)) < TOL[torch.bfloat16], new
