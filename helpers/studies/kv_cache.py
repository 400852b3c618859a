"""Serving many requests: the KV cache's bytes, the pages that hold it, and the paged kernel's timing.

* Arithmetic: bytes of cache a token takes for each Llama-2 size (``ModelSpec.kv_bytes_per_token``), and
  how many tokens fit beside the nf4 weights under a memory cap.
* ``PagePool``: the allocator of a paged cache. It hands out fixed-size pages by id (the tensors that
  hold them are the kernel's business), keeps each request's block-table row, and takes pages back when
  a request finishes. A request it cannot hold now is refused with ``OutOfPages``; one it could never
  hold with ``ValueError``; either way nothing it holds changes.
* Fragmentation: the requests of a length distribution admitted in order until the pool refuses one,
  with each request's cache contiguous at its maximum length (one page of ``max_len`` tokens) or in
  small pages.
* ``time_kernels``: the paged decode-attention kernel against the contiguous one and SDPA, at equal
  lengths, as ``kernel`` records.
* ``serving_plan``: notebook 09's sizes on a card (``helpers.card_fit``): the decode sweep's batches, the pool of
  continuous batching and the caps measured, each within what the card holds beside the weights;
  ``step_bandwidth``: the bandwidth a decode step's roofline uses on this GPU.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from .. import bench, datasheets, results
from ..card_fit import CardLimits
from ..datasheets import CAPS
from ..device import DEVICE
from ..kernels.decode_attention import decode_attention, reference_attention
from ..llama.memory_caps import GiB, cap_line, cap_on_card
from ..llama.models import MODELS, ModelSpec, nf4_bytes
from ..llama.page_pool import PAGE_TOKENS, OutOfPages, PagePool
from ..kernels.paged_decode_attention import gather_pages, paged_decode_attention

CAPS_GIB: tuple[float, ...] = tuple(c for c in CAPS if c is not None)  # the two cards notebook 06 emulates


# --- arithmetic ---------------------------------------------------------------------------------------

def weight_bytes(spec: ModelSpec) -> int:
    """Bytes the model's weights hold when serving: the nf4 linears and, in bf16, the rest (embeddings,
    lm_head, norms)."""
    return nf4_bytes(spec) + 2 * (spec.params() - spec.linear_params())


def cache_bytes_under_cap(spec: ModelSpec, cap_gib: float, reserve_bytes: int = 0) -> int:
    """Bytes left for the KV cache under a cap of ``cap_gib`` GiB once the weights and ``reserve_bytes``
    (CUDA context, activations) are in; 0 if none is."""
    return max(0, int(cap_gib * GiB) - weight_bytes(spec) - reserve_bytes)


def cache_tokens_under_cap(spec: ModelSpec, cap_gib: float, reserve_bytes: int = 0) -> int:
    """Tokens of bf16 KV cache (all requests together) that fit beside the weights under the cap."""
    return cache_bytes_under_cap(spec, cap_gib, reserve_bytes) // spec.kv_bytes_per_token()


def arithmetic_table(names: Iterable[str] = ("7b", "13b", "70b"), caps: Iterable[float] = CAPS_GIB) -> list[dict]:
    """Per model and cap: KV bytes a token, weight bytes, cache bytes and tokens that fit beside them."""
    rows = []
    for name, cap in itertools.product(names, caps):
        spec = MODELS[name]
        rows.append({"model": name, "layers": spec.num_hidden_layers, "heads": spec.num_attention_heads,
                     "kv_heads": spec.num_key_value_heads,
                     "head_dim": spec.hidden_size // spec.num_attention_heads,
                     "kv_bytes_per_token": spec.kv_bytes_per_token(), "weight_bytes": weight_bytes(spec),
                     "cap_gib": cap, "cache_bytes": cache_bytes_under_cap(spec, cap),
                     "cache_tokens": cache_tokens_under_cap(spec, cap)})
    return rows


# --- fragmentation ------------------------------------------------------------------------------------

def admit(pool: PagePool, lengths: Sequence[int]) -> list[int]:
    """Admit requests of ``lengths`` (cycled through, in order) into ``pool`` until it refuses one;
    returns the lengths admitted. A length the pool could never hold raises ValueError."""
    if not lengths:
        raise ValueError("no lengths to admit")
    admitted: list[int] = []
    for i, n in enumerate(itertools.cycle(lengths)):
        try:
            pool.allocate(i, n)
        except OutOfPages:
            return admitted
        admitted.append(n)
    raise AssertionError("unreachable: itertools.cycle never ends")


def fragmentation(spec: ModelSpec, lengths: Sequence[int], cap_gib: float, page_tokens: int,
                  max_len: int | None = None, reserve_bytes: int = 0) -> dict:
    """The requests of ``lengths`` that fit at once under the cap, each holding its whole length (prompt
    plus answer) in pages of ``page_tokens`` tokens; ``page_tokens == max_len`` is the contiguous scheme
    (every request one slab of ``max_len``, the model's context by default). Lengths are cut at ``max_len``
    (a request cannot outgrow the context). ``bytes_used``: the pages the admitted requests hold;
    ``bytes_needed``: their tokens."""
    max_len = max_len or spec.max_position_embeddings
    if not 1 <= page_tokens <= max_len:
        raise ValueError(f"page_tokens must be in 1 ... max_len = {max_len}, got {page_tokens}")
    per_token = spec.kv_bytes_per_token()
    pages = cache_bytes_under_cap(spec, cap_gib, reserve_bytes) // (page_tokens * per_token)
    base = {"what": "fragmentation", "model": spec.name, "scheme": "contiguous" if page_tokens == max_len else "paged",
            "page_tokens": page_tokens, "max_len": max_len, "cap_gib": cap_gib}
    if pages == 0:
        return {**base, "requests": 0, "bytes_used": 0, "bytes_needed": 0}
    pool = PagePool(pages, page_tokens, max_pages_per_request=-(-max_len // page_tokens))
    admitted = admit(pool, [min(n, max_len) for n in lengths])
    return {**base, "requests": len(admitted), "bytes_used": pool.used_pages * page_tokens * per_token,
            "bytes_needed": sum(admitted) * per_token}


def capacity(spec: ModelSpec, cap_gib: float, context: int, page_tokens: int = PAGE_TOKENS,
             reserve_bytes: int = 0) -> dict:
    """Requests of ``context`` tokens each that a paged cache holds at once under the cap: arithmetic
    (``measured`` False), an upper bound until a decoder runs under the cap."""
    pages = cache_bytes_under_cap(spec, cap_gib, reserve_bytes) // (page_tokens * spec.kv_bytes_per_token())
    return {"what": "capacity", "model": spec.name, "cap_gib": cap_gib, "context": context, "page_tokens": page_tokens,
            "requests": pages // -(-context // page_tokens), "measured": False}



def random_block_table(batch: int, pages_per_request: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, pages_per_request) int32 on the generator's device: the pages 0 ... batch x pages_per_request
    - 1 in a random order."""
    order = torch.randperm(batch * pages_per_request, generator=generator, device=generator.device)
    return order.reshape(batch, pages_per_request).to(torch.int32)


def to_pages(cache: torch.Tensor, block_table: torch.Tensor, page_tokens: int) -> torch.Tensor:
    """Contiguous caches (B, H_kv, L, D) copied into the pages (B x W, H_kv, page_tokens, D) that
    ``block_table`` (B, W) names, W = ceil(L / page_tokens); the last page's tail is zeros."""
    b, hkv, length, d = cache.shape
    n = block_table.shape[1]
    if n != -(-length // page_tokens):
        raise ValueError(f"{length} positions fill {-(-length // page_tokens)} pages of {page_tokens}, not {n}")
    padded = F.pad(cache, (0, 0, 0, n * page_tokens - length))
    pages = torch.empty(b * n, hkv, page_tokens, d, dtype=cache.dtype, device=cache.device)
    pages[block_table.flatten().long()] = padded.reshape(b, hkv, n, page_tokens, d).transpose(1, 2).flatten(0, 1)
    return pages


IMPLS = ("paged", "contiguous", "sdpa", "gather + sdpa")


COLD_BYTES = 256 * 2**20  # caches a timed graph reads in turn: over five times an H200's L2, so each call reads HBM


def time_kernels(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, page_tokens: int = PAGE_TOKENS,
                 dtype: torch.dtype = torch.bfloat16, seed: int = 0, reps: int = 20,
                 cold_bytes: int = COLD_BYTES) -> list[dict]:
    """One decode step's attention for ``batch`` requests of ``context`` tokens each, four ways: the paged
    kernel (pages in random order), the contiguous kernel (``decode_attention``), SDPA over a contiguous
    cache, and SDPA after gathering the pages into one (what a server without a paged kernel does).
    Timed as a decoder runs them (``bench.time_in_graph``: one CUDA graph, so the host's launch time is
    out of the timing) over enough copies of the step's tensors, one a layer, that their caches exceed
    ``cold_bytes``: each call reads its cache from memory, not from the L2. ``ms``: per call, the median
    of ``reps`` replays; ``max_abs_error``: the first copy's, against float64."""
    device = DEVICE
    generator = torch.Generator(device=device).manual_seed(seed)
    cache_bytes = 2 * batch * kv_heads * context * head_dim * dtype.itemsize
    copies = [_step_tensors(batch, context, heads, kv_heads, head_dim, page_tokens, dtype, generator)
              for _ in range(max(1, -(-cold_bytes // cache_bytes)))]
    gqa = kv_heads != heads

    def calls(t: dict[str, torch.Tensor]) -> dict[str, Callable[[], torch.Tensor]]:
        return {
            "paged": lambda: paged_decode_attention(t["q"], t["k_pages"], t["v_pages"], t["table"], t["lengths"],
                                                    check=False),
            "contiguous": lambda: decode_attention(t["q"], t["k"], t["v"], t["pos"]),
            "sdpa": lambda: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], enable_gqa=gqa),
            "gather + sdpa": lambda: F.scaled_dot_product_attention(
                t["q"], gather_pages(t["k_pages"], t["table"], context),
                gather_pages(t["v_pages"], t["table"], context), enable_gqa=gqa),
        }

    first = copies[0]
    reference = reference_attention(first["q"], first["k"], first["v"])
    paged_decode_attention(first["q"], first["k_pages"], first["v_pages"], first["table"], first["lengths"])  # checked
    per_copy = [calls(t) for t in copies]
    records = []
    for impl, fn in per_copy[0].items():
        error = (fn().double() - reference).abs().max().item()
        timing = bench.time_in_graph([c[impl] for c in per_copy], reps=reps)
        records.append({"what": "kernel", "impl": impl, "batch": batch, "context": context, "heads": heads,
                        "kv_heads": kv_heads, "head_dim": head_dim, "page_tokens": page_tokens,
                        "dtype": str(dtype).removeprefix("torch."), "ms": timing.ms, "ms_p20": timing.ms_p20,
                        "ms_p80": timing.ms_p80, "timer": timing.timer, "copies": len(copies), "max_abs_error": error})
    return records


def _step_tensors(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, page_tokens: int,
                  dtype: torch.dtype, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One layer's decode-step tensors: the queries, a contiguous cache, the same cache in pages (a random
    block table), the lengths for the paged kernel and the position for the contiguous one."""
    device = DEVICE
    q = torch.randn(batch, heads, 1, head_dim, generator=generator, device=device, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, context, head_dim, generator=generator, device=device, dtype=dtype)
            for _ in range(2))
    table = random_block_table(batch, -(-context // page_tokens), generator)
    return {"q": q, "k": k, "v": v, "table": table, "k_pages": to_pages(k, table, page_tokens),
            "v_pages": to_pages(v, table, page_tokens),
            "lengths": torch.full((batch,), context, dtype=torch.int32, device=device),
            "pos": torch.tensor([context - 1], device=device)}


# --- what a card holds ----------------------------------------------------------------------------------

FIT_SHARE = 0.85  # the share of the card a plan fills (``CardLimits.fits``'s default)
HEADROOM_BYTES = 2 * GiB  # beside weights and cache: a step's activations, graphs and logits (``measured_capacity``)


@dataclass(frozen=True)
class ServingPlan:
    """Notebook 09's sizes on one card, and a printed line for each thing the card changed or skipped."""

    kernel_points: list[tuple[int, int, int, int]]  # section 3's (batch, context, heads, kv_heads) that fit
    batches: dict[int, list[int]]  # context -> the decode sweep's batch sizes whose caches fit
    pool_pages: int  # continuous batching's pool: what the first cap leaves for the cache, at most what fits here
    caps: dict[float, float]  # section 6: cap -> the GiB it runs under here (``memory_caps.cap_on_card``)
    lines: list[str]


def cache_room_bytes(card: CardLimits, spec: ModelSpec) -> float:
    """Bytes of KV cache ``card`` holds beside ``spec``'s weights: ``FIT_SHARE`` of it, less the weights and
    ``HEADROOM_BYTES``."""
    return FIT_SHARE * card.memory_bytes - weight_bytes(spec) - HEADROOM_BYTES


def kernel_point_bytes(batch: int, context: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                       cold_bytes: int = COLD_BYTES) -> int:
    """What ``time_kernels`` holds at one point: each copy's cache twice (contiguous and in pages), and two caches'
    worth more for the gathered copy and the transients of building the pages."""
    cache = 2 * batch * kv_heads * context * head_dim * dtype.itemsize
    copies = max(1, -(-cold_bytes // cache))
    return (2 * copies + 2) * cache


def sweep_cache_bytes(spec: ModelSpec, batch: int, context: int, steps: int) -> int:
    """The cache of the decode sweep's step: ``batch`` requests of ``context`` tokens and ``steps`` + 1 more."""
    return batch * (context + steps + 1) * spec.kv_bytes_per_token()


def serving_plan(card: CardLimits | None, kernel_points: Sequence[tuple[int, int, int, int]], head_dim: int,
                 dtype: torch.dtype, contexts: Sequence[int], batches: Sequence[int], steps: int,
                 spec: ModelSpec = MODELS["7b"], page_tokens: int = PAGE_TOKENS,
                 caps: Sequence[float] = CAPS_GIB) -> ServingPlan:
    """What notebook 09 runs on ``card`` (None: the CPU, where nothing is left out and no cap is measured): the
    kernel timings whose tensors fit (``kernel_point_bytes`` within ``FIT_SHARE`` of the card, no model loaded
    yet), the decode sweep's batches whose caches fit (``sweep_cache_bytes`` within ``cache_room_bytes``), a pool
    of the pages the first cap leaves for the cache or fewer where this card holds fewer, and the caps it can
    emulate."""
    page_bytes = page_tokens * spec.kv_bytes_per_token()
    pages_under_cap = cache_tokens_under_cap(spec, caps[0]) // page_tokens
    if card is None:
        return ServingPlan(list(kernel_points), {c: list(batches) for c in contexts}, pages_under_cap, {}, [])
    lines = []
    kernels = []
    for point in kernel_points:
        need = kernel_point_bytes(point[0], point[1], point[3], head_dim, dtype)
        if card.fits(need, FIT_SHARE):
            kernels.append(point)
        else:
            lines.append(card.skip_line(f"timing {point[0]} requests of {point[1]:,} tokens ({point[2]} heads, "
                                        f"{point[3]} key/value heads)", need, FIT_SHARE))
    room = cache_room_bytes(card, spec)
    fits = {}
    for context in contexts:
        fits[context] = [b for b in batches if sweep_cache_bytes(spec, b, context, steps) <= room]
        left_out = [b for b in batches if b not in fits[context]]
        if left_out:
            lines.append(f"skipped on {card.name}: context {context:,} at batches {left_out}, whose caches need "
                         f"more than the {room / GiB:.1f} GiB this card holds beside the weights")
    pool_pages = min(pages_under_cap, max(0, int(room // page_bytes)))
    if pool_pages < pages_under_cap:
        need = pages_under_cap * page_bytes / GiB
        lines.append(f"the {caps[0]:g} GiB cap's {pages_under_cap:,} pages need {need:.1f} GiB; this {card.name} "
                     f"holds {pool_pages:,} beside the weights: the pool gets those")
    run_caps = {}
    for cap in caps:
        runs = cap_on_card(cap, card.memory_gib)
        if runs is not None:
            run_caps[cap] = runs
        if line := cap_line(cap, card.name, card.memory_gib):
            lines.append(line)
    return ServingPlan(kernels, fits, pool_pages, run_caps, lines)


def step_bandwidth(gpu_name: str) -> tuple[float, str]:
    """GB/s for a decode step's roofline on the GPU ``gpu_name``, and where it comes from: its datasheet row; for
    a GPU without one, the copy bandwidth notebook 00 saved for it (results topic "ceilings"), else one measured
    now."""
    row = datasheets.lookup(gpu_name)
    if row is not None:
        return row.bandwidth_gbps, f"the {row.name}'s datasheet"
    try:
        copy = next(r for r in results.load("ceilings", gpu=results.gpu_slug(gpu_name)).records if r["what"] == "copy")
        return copy["gbps"], f"no datasheet row for {gpu_name}: the copy bandwidth notebook 00 measured on it"
    except (FileNotFoundError, StopIteration):
        return bench.copy_bandwidth()["gbps"], f"no datasheet row for {gpu_name}: the copy bandwidth measured here"
