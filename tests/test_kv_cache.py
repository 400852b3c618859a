"""The serving arithmetic, the page allocator, fragmentation and the kernel timing's records."""
import pytest
import torch

import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)
from helpers.studies import kv_cache
from helpers.llama.memory_caps import GiB
from helpers.llama.models import MODELS, nf4_bytes
from helpers.llama.page_pool import OutOfPages, PagePool


def test_kv_bytes_per_token_of_the_llama_2_sizes():
    """2 (K and V) x layers x KV heads x head size 128 x 2 bytes (bf16); 70B has 8 KV heads for 64 queries."""
    assert MODELS["7b"].kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2 == 524_288
    assert MODELS["13b"].kv_bytes_per_token() == 2 * 40 * 40 * 128 * 2 == 819_200
    assert MODELS["70b"].kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2 == 327_680
    assert MODELS["7b"].kv_bytes_per_token(dtype_bytes=1) == 262_144


def test_tokens_under_a_cap_are_what_is_left_beside_the_weights():
    spec = MODELS["7b"]
    weights = kv_cache.weight_bytes(spec)
    assert weights == nf4_bytes(spec) + 2 * (2 * 32000 * 4096 + 65 * 4096)  # nf4 linears + bf16 embeddings, norms
    assert kv_cache.cache_tokens_under_cap(spec, 40) == (40 * GiB - weights) // 524_288
    assert kv_cache.cache_tokens_under_cap(spec, 40, reserve_bytes=GiB) == (39 * GiB - weights) // 524_288
    assert kv_cache.cache_tokens_under_cap(spec, 3) == 0  # 3 GiB does not hold the 3.6 GiB of weights
    assert kv_cache.cache_tokens_under_cap(MODELS["70b"], 40) < kv_cache.cache_tokens_under_cap(MODELS["70b"], 48)
    rows = kv_cache.arithmetic_table()
    assert [(r["model"], r["cap_gib"]) for r in rows] == [(m, c) for m in ("7b", "13b", "70b") for c in (40, 48)]


def test_pool_allocates_frees_and_reuses_pages():
    pool = PagePool(10, page_tokens=4)
    assert pool.allocate("a", 9) == [0, 1, 2]  # 9 tokens: 3 pages of 4
    assert pool.allocate("b", 4) == [3]
    assert pool.extend("b", 5) == [4] and pool.pages("b") == [3, 4] and pool.length("b") == 5
    assert pool.extend("b", 8) == [] and pool.used_pages == 5 and pool.free_pages == 5
    assert pool.free("a") == [0, 1, 2] and pool.requests == ["b"]
    assert pool.allocate("c", 12) == [0, 1, 2]  # a finished request's pages are handed out first
    assert pool.block_table(["b", "c"]).tolist() == [[3, 4, 0], [0, 1, 2]]
    assert pool.block_table(["b"], width=4).tolist() == [[3, 4, 0, 0]]
    assert pool.lengths(["b", "c"]).tolist() == [8, 12]
    assert pool.block_table(["b"]).dtype == torch.int32
    with pytest.raises(ValueError, match="width = 1"):
        pool.block_table(["b"], width=1)


def test_out_of_pages_and_never_fits_lose_nothing():
    pool = PagePool(4, page_tokens=4, max_pages_per_request=3)
    pool.allocate("a", 8)
    state = lambda: (pool.free_pages, {r: (pool.pages(r), pool.length(r)) for r in pool.requests})  # noqa: E731
    before = state()
    with pytest.raises(OutOfPages, match="request 'b': 12 tokens need 3 pages; it holds 0 and 2 of the pool's 4 are"):
        pool.allocate("b", 12)
    with pytest.raises(ValueError, match="13 tokens need 4 pages of 4; a request can never hold more than 3"):
        pool.allocate("c", 13)
    with pytest.raises(ValueError, match="can never hold more than 3"):
        pool.extend("a", 13)
    with pytest.raises(ValueError, match="already holds"):
        pool.allocate("a", 1)
    with pytest.raises(ValueError, match="shrink"):
        pool.extend("a", 3)
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        pool.allocate("d", 0)
    with pytest.raises(KeyError):
        pool.free("b")
    assert state() == before
    pool.allocate("b", 5)  # what fits still fits: the last two pages
    full = state()
    with pytest.raises(OutOfPages, match="request 'a': 9 tokens need 3 pages; it holds 2 and 0 of the pool's 4"):
        pool.extend("a", 9)
    assert state() == full
    pool.free("b")
    assert pool.extend("a", 9) == [2]  # b's first page, the top of the stack


def test_fragmentation_contiguous_against_paged():
    """A slab of max_len per request against pages of 16 tokens, with lengths cycled until the pool refuses."""
    spec, lengths = MODELS["7b"], [100, 3000, 17]
    tokens = kv_cache.cache_tokens_under_cap(spec, 40)
    contiguous = kv_cache.fragmentation(spec, lengths, 40, page_tokens=4096)
    assert contiguous["scheme"] == "contiguous" and contiguous["requests"] == tokens // 4096
    assert contiguous["bytes_used"] == contiguous["requests"] * 4096 * 524_288
    paged = kv_cache.fragmentation(spec, lengths, 40, page_tokens=16)
    pages = [-(-n // 16) for n in lengths]  # 7, 188, 2 pages
    per_cycle = sum(pages)
    full_cycles, left = divmod(kv_cache.cache_bytes_under_cap(spec, 40) // (16 * 524_288), per_cycle)
    extra = 0
    for p in pages:  # the next cycle, in order, until one does not fit
        if p > left:
            break
        left, extra = left - p, extra + 1
    assert paged["scheme"] == "paged" and paged["requests"] == 3 * full_cycles + extra
    assert paged["bytes_needed"] <= paged["bytes_used"] < paged["bytes_needed"] + paged["requests"] * 16 * 524_288
    assert paged["requests"] > 3 * contiguous["requests"]  # a mean of 1,039 tokens against 4,096
    cut = kv_cache.fragmentation(spec, [5000], 40, page_tokens=16)  # longer than the context: held at 4,096
    assert cut["bytes_needed"] == cut["requests"] * 4096 * 524_288
    assert kv_cache.fragmentation(spec, lengths, 3, 16)["requests"] == 0
    with pytest.raises(ValueError, match="page_tokens"):
        kv_cache.fragmentation(spec, lengths, 40, page_tokens=8192)


def test_capacity_is_arithmetic_over_whole_pages():
    spec = MODELS["13b"]
    record = kv_cache.capacity(spec, 48, context=1000)
    pages = kv_cache.cache_bytes_under_cap(spec, 48) // (16 * 819_200)
    assert record["requests"] == pages // 63 and record["measured"] is False  # 1,000 tokens: 63 pages of 16


def test_time_kernels_records_every_impl_and_its_error():
    records = kv_cache.time_kernels(2, 21, 4, 2, 16, page_tokens=8, dtype=torch.float32, reps=1, cold_bytes=1)
    assert [r["impl"] for r in records] == list(kv_cache.IMPLS)
    for r in records:
        assert {"what", "impl", "batch", "context", "ms", "max_abs_error"} <= set(r) and r["what"] == "kernel"
        assert r["batch"] == 2 and r["context"] == 21 and r["ms"] > 0 and r["max_abs_error"] < 1e-5
