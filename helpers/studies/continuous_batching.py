"""Continuous batching over the paged decoder, and the measurements of notebook 09 that need it:
the batched logits against the model's own forward, the step time by batch size, the capacity measured
under a memory cap, and requests that arrive as a Poisson process.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..llama.page_pool import PAGE_TOKENS
from ..llama.decoding import LlamaLayers
from ..llama.paged_decoding import PagedDecoder


# --- continuous batching ------------------------------------------------------------------------------

Arrival = tuple[float, Sequence[int], int]  # (arrival in seconds from the start, prompt ids, answer tokens)


@dataclasses.dataclass
class Served:
    """What :func:`serve` did: one ``continuous`` record over all requests, a ``continuous_request``
    record per request (in arrival order) and each request's answer ids."""

    summary: dict
    requests: list[dict]
    answers: list[list[int]]


def serve(decoder: PagedDecoder, arrivals: Sequence[Arrival], arrival_rate: float | None = None,
          clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> Served:
    """Continuous batching: each request joins the running batch once it has arrived and the pool has
    free pages for its whole prompt and answer beyond what the running requests will still take (first
    come, first served), is decoded with the others one step at a time, and leaves, its pages freed, after
    its answer. With nothing to run, waits (``sleep``) for the next arrival. ``clock`` and ``sleep`` are
    injectable (a fake clock in tests). TTFT: arrival to first token (queueing and prefill); TPOT: the
    seconds a token after the first; tokens/s: all answer tokens over the whole run. ``arrival_rate``
    (requests a second, of whoever drew the arrivals) is recorded as given."""
    pool = decoder.pool
    for i, (_, prompt, answer) in enumerate(arrivals):
        if answer < 1 or len(prompt) + answer > decoder.max_len:
            raise ValueError(f"arrival {i}: a {len(prompt)}-token prompt and a {answer}-token answer never fit "
                             f"(answers >= 1; a request holds at most {decoder.max_len} tokens)")
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    final = {i: len(arrivals[i][1]) + arrivals[i][2] for i in order}  # the tokens a request holds at most
    answers: list[list[int]] = [[] for _ in arrivals]
    first, last = [0.0] * len(arrivals), [0.0] * len(arrivals)
    peak = 0  # the most requests a step ran
    start = clock()

    def admissible(i: int) -> bool:
        owed = sum(pool.pages_for(final[r]) - len(pool.pages(r)) for r in decoder.requests)
        return pool.pages_for(final[i]) <= pool.free_pages - owed

    def emit(i: int, token: int, now: float) -> None:
        answers[i].append(token)
        last[i] = now
        if len(answers[i]) == arrivals[i][2]:
            decoder.finish(i)

    while order or decoder.requests:
        while order and arrivals[order[0]][0] <= clock() - start and admissible(order[0]):
            i = order.pop(0)
            logits = decoder.add(i, arrivals[i][1], arrivals[i][2])
            first[i] = clock() - start
            emit(i, int(logits.argmax()), first[i])
        if decoder.requests:
            peak = max(peak, len(decoder.requests))
            tokens = decoder.step()
            now = clock() - start
            for i, token in tokens.items():
                emit(i, token, now)
        elif order:
            sleep(max(0.0, arrivals[order[0]][0] - (clock() - start)))
    seconds = clock() - start
    requests = [{"what": "continuous_request", "request": i, "arrival_s": a, "prompt": len(p), "tokens": n,
                 "ttft_s": first[i] - a, "tpot_s": (last[i] - first[i]) / (n - 1) if n > 1 else None}
                for i, (a, p, n) in enumerate(arrivals)]
    tpots = [r["tpot_s"] for r in requests if r["tpot_s"] is not None]
    tokens = sum(len(a) for a in answers)
    summary = {"what": "continuous", "arrival_rate": arrival_rate, "requests": len(arrivals), "tokens": tokens,
               "peak_batch": peak,
               "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else None,
               "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in requests) if requests else None,
               "tpot_ms": 1e3 * statistics.median(tpots) if tpots else None}
    return Served(summary, requests, answers)


@torch.no_grad()
def batched_logits_check(model: nn.Module, prompt_lengths: Sequence[int], total: int, page_tokens: int = PAGE_TOKENS,
                         seed: int = 0, **decoder_kw) -> dict:
    """Requests of ``total`` random tokens each, decoded together teacher-forced: each admitted with its
    own prompt length (so the batch is ragged, and shrinks as requests finish), then fed its own next
    token every step. Every logit row against the model's own forward over the whole sequence
    (``decode_bench.relative_error``), beside transformers' own token-by-token decoding of the same
    tokens (the floor, ``cached_decode_error``); ``ok`` by ``decode_bench.logits_ok``."""
    from .decoding_ladder import cached_decode_error, logits_ok, relative_error

    if not prompt_lengths or min(prompt_lengths) < 1 or max(prompt_lengths) >= total:
        raise ValueError(f"need prompt lengths from 1 to total - 1 = {total - 1}, got {list(prompt_lengths)}")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(model.config.vocab_size, (len(prompt_lengths), total), generator=generator).to(device)
    reference = model(tokens).logits.float()
    per_request = -(-total // page_tokens)
    dec = PagedDecoder(model, len(prompt_lengths) * per_request, page_tokens, per_request * page_tokens, **decoder_kw)
    errors = {"prefill": [relative_error(dec.add(r, tokens[r, :p], total - p), reference[r, p - 1])
                          for r, p in enumerate(prompt_lengths)], "steps": [], "wide steps": []}
    batches = []
    while dec.requests:
        rows = dec.requests
        batches.append(len(rows))
        dec.step({r: int(tokens[r, dec.pool.length(r)]) for r in rows})
        wide = dec.max_rows is not None and dec._rows(len(rows)) > dec.max_rows
        for i, r in enumerate(rows):
            n = dec.pool.length(r)
            errors["wide steps" if wide else "steps"].append(relative_error(dec.logits[i], reference[r, n - 1]))
            if n == total:
                dec.finish(r)
    largest = {f"max_rel_error_{k.replace(' ', '_')}": max(v, default=None) for k, v in errors.items()}
    record = {"what": "batched_logits", "requests": len(prompt_lengths), "total": total,
              "largest_batch": max(batches), "smallest_batch": min(batches), "graph": dec.use_graph,
              "logits_max_rel_error": max(x for x in largest.values() if x is not None), **largest,
              "transformers_decode_error": cached_decode_error(model, tokens, reference)}
    return {**record, "ok": logits_ok(record)}


def _random_prompt(model: nn.Module, tokens: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(model.config.vocab_size, (tokens,), generator=generator)


def batch_decode_sweep(model: nn.Module, batches: Sequence[int], context: int, steps: int = 16,
                       page_tokens: int = PAGE_TOKENS, seed: int = 0, clock: Callable[[], float] = time.perf_counter,
                       progress: bool = False, **decoder_kw) -> list[dict]:
    """Decode tokens/s against batch size, on one decoder whose pool holds the largest batch: for each
    batch, that many requests of ``context``-token random prompts prefilled, one step to warm up (and
    capture its graph), then ``steps`` steps timed one by one (each ends reading its tokens on the host,
    so the device has finished), and the requests finished. ``step_ms``: the median step; ``tokens_per_s``:
    batch over it. ``decoder_kw`` goes to :class:`PagedDecoder` (kernels, ``max_rows``, ``graph``)."""
    if context < 1 or steps < 1 or not batches or min(batches) < 1:
        raise ValueError(f"need context, steps and batches >= 1, got {context}, {steps}, {list(batches)}")
    generator = torch.Generator().manual_seed(seed)
    per_request = -(-(context + steps + 1) // page_tokens)
    dec = PagedDecoder(model, max(batches) * per_request, page_tokens, per_request * page_tokens, **decoder_kw)
    records = []
    for batch in tqdm(batches, desc=f"batches at {context} tokens", disable=not progress, leave=False):
        for r in range(batch):
            dec.add(r, _random_prompt(model, context, generator), steps + 1)
        dec.step()  # warm-up: compilation, the graph's capture
        seconds = []
        for _ in range(steps):
            start = clock()
            dec.step()
            seconds.append(clock() - start)
        for r in range(batch):
            dec.finish(r)
        step_s = statistics.median(seconds)
        records.append({"what": "batch_decode", "batch": batch, "context": context, "steps": steps,
                        "graph": dec.use_graph, "step_ms": 1e3 * step_s,
                        "step_ms_min": 1e3 * min(seconds), "step_ms_max": 1e3 * max(seconds),
                        "tokens_per_s": batch / step_s if step_s > 0 else None})
    return records


def dataset_requests(prompt_lengths: Sequence[int], lengths: Sequence[int], n: int, seed: int = 0
                     ) -> list[tuple[int, int]]:
    """``n`` (prompt, answer) token counts drawn without replacement from a data set's texts (each text's
    prompt is its ``[INST] ... [/INST]`` part, ``lengths`` the whole texts')."""
    if len(prompt_lengths) != len(lengths) or not 1 <= n <= len(lengths):
        raise ValueError(f"need as many prompt lengths as lengths and 1 <= n <= {len(lengths)}, got "
                         f"{len(prompt_lengths)}, {len(lengths)} and n = {n}")
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed))[:n].tolist()
    return [(prompt_lengths[i], lengths[i] - prompt_lengths[i]) for i in order]


def poisson_arrivals(requests: Sequence[tuple[int, int]], rate: float | None, vocab_size: int, seed: int = 0
                     ) -> list[Arrival]:
    """Arrivals of ``requests`` ((prompt, answer) token counts, in order) as a Poisson process of ``rate``
    requests a second (gaps drawn from an exponential of mean 1 / rate; None: all at once), each prompt
    random token ids."""
    if rate is not None and not 0 < rate < math.inf:
        raise ValueError(f"rate must be > 0 and finite requests a second (None: all at once), got {rate}")
    generator = torch.Generator().manual_seed(seed)
    gaps = torch.zeros(len(requests)) if rate is None else \
        torch.empty(len(requests)).exponential_(rate, generator=generator)
    times = torch.cumsum(gaps, 0).tolist()
    return [(t, torch.randint(vocab_size, (p,), generator=generator).tolist(), a)
            for t, (p, a) in zip(times, requests)]


def measured_capacity(model: nn.Module, cap_gib: float, context: int, steps: int = 8, page_tokens: int = PAGE_TOKENS,
                      headroom_gib: float = 2.0, seed: int = 0, **decoder_kw) -> dict:
    """Requests of ``context``-token prompts that a paged decoder holds and decodes at once under a memory
    cap of ``cap_gib`` GiB (CUDA only; the CUDA context counted in, as notebook 06's caps do): the pool
    gets the pages that fit in what the cap leaves beside what is allocated now (the weights) and
    ``headroom_gib`` (a step's activations, the graphs, the logits); as many requests are added as the
    pool holds with their prompts and ``steps`` new tokens, then all of them decode ``steps`` steps under
    the cap. A ``capacity`` record (``measured`` True) with the step's time and tokens/s."""
    from ..llama.memory_caps import GiB, apply_cap, context_bytes

    if steps < 2:
        raise ValueError(f"steps must be >= 2 (one warms up), got {steps}")
    lay = LlamaLayers(model, 1)
    page_bytes = 2 * len(model.model.layers) * lay.kv_heads * page_tokens * lay.head_dim * lay.dtype.itemsize
    left = cap_gib * GiB - context_bytes() - torch.cuda.memory_allocated() - headroom_gib * GiB
    per_request = -(-(context + steps + 1) // page_tokens)
    num_pages = int(left // page_bytes)
    if num_pages < per_request:
        raise ValueError(f"a cap of {cap_gib} GiB leaves {left / GiB:.2f} GiB for the cache: not one request of "
                         f"{context} tokens")
    generator = torch.Generator().manual_seed(seed)
    torch.cuda.reset_peak_memory_stats()
    apply_cap(cap_gib)
    try:
        dec = PagedDecoder(model, num_pages, page_tokens, per_request * page_tokens, **decoder_kw)
        for r in range(num_pages // per_request):  # each holds its pages for every step to come
            dec.add(r, _random_prompt(model, context, generator), steps + 1)
        dec.step()  # warm-up: the graph's capture
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps - 1):
            dec.step()
        seconds = (time.perf_counter() - start) / (steps - 1)
        requests = len(dec.requests)
        peak_gib = torch.cuda.max_memory_reserved() / GiB
        del dec
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    return {"what": "capacity", "cap_gib": cap_gib, "context": context, "page_tokens": page_tokens,
            "requests": requests, "measured": True, "pages": num_pages, "step_ms": 1e3 * seconds,
            "tokens_per_s": requests / seconds, "peak_reserved_gib": peak_gib}
