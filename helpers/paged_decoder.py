"""Decoding many requests at once over a paged KV cache, and a continuous-batching loop on top of it.

    dec = PagedDecoder(model, num_pages=256, page_tokens=16, max_len=1024)
    logits = dec.add("a", prompt_ids, max_new_tokens=64)   # prefill: one forward over the prompt
    next_tokens = dec.step()                                # one token for every running request, batched
    dec.finish("a")                                         # its pages back to the pool
    served = serve(dec, arrivals)                           # requests join and leave the batch as they come

Each request's keys and values live in pages of one pool per layer, (num_pages, H_kv, page_tokens, D)
for K and the same for V (``paged_decode_attention``'s layout), handed out by a ``PagePool``. A step
feeds every running request one token: the projections see B rows, each request's q and k are rotated
at its own position, its new key and value go to its current page (a new page when it crosses a page
boundary), and the paged kernel attends each request over its own length.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Hashable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .decode import AddNorm, Linear, LinearGroup, LlamaLayers, Norm, SwigluLinear, module_linear, rotate, torch_rms_norm
from .kernels.paged_decode_attention import paged_decode_attention
from .serving import PAGE_TOKENS, OutOfPages, PagePool, paged_reference

# (q (B, H, 1, D), k_pages, v_pages (num_pages, H_kv, page_tokens, D), block_table (B, W), lengths (B,)) -> (B, H, 1, D)
PagedAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def triton_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                           lengths: torch.Tensor) -> torch.Tensor:
    """The Triton paged kernel, its host-side block-table check skipped (the decoder's pool keeps it in range)."""
    return paged_decode_attention(q, k_pages, v_pages, block_table, lengths, check=False)


def torch_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                          lengths: torch.Tensor) -> torch.Tensor:
    """The same attention in PyTorch (float64, ``serving.paged_reference``), in q's dtype: the path to check against."""
    return paged_reference(q, k_pages, v_pages, block_table, lengths).to(q.dtype)


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, T, n * D) -> (B, n, T, D)."""
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)


class PagedDecoder:
    """Greedy decoding of ``model`` for requests that come and go, their caches in ``num_pages`` pages
    of ``page_tokens`` tokens; a request holds at most ``max_len`` tokens (prompt and answer; default:
    as many as the pool holds, within the model's positions).

    The kernel hooks are :class:`~helpers.decode.LlamaLayers`' (``linear``, ``linear_group``,
    ``swiglu_linear``, ``norm``, ``add_norm``). ``max_rows``: the most rows the linear hooks take (the
    nf4 kernels': ``nf4_gemv.MAX_M``); a forward over more rows (a larger batch, a long prompt) uses the
    modules' own forward (bitsandbytes dequantises and multiplies). ``attention``: a
    :data:`PagedAttention` (default: the Triton kernel; :func:`torch_paged_attention` to check it).
    """

    def __init__(self, model: nn.Module, num_pages: int, page_tokens: int = PAGE_TOKENS, max_len: int | None = None,
                 *, linear: Linear = module_linear, linear_group: LinearGroup | None = None,
                 swiglu_linear: SwigluLinear | None = None, norm: Norm = torch_rms_norm,
                 add_norm: AddNorm | None = None, attention: PagedAttention = triton_paged_attention,
                 max_rows: int | None = None) -> None:
        if num_pages < 1 or page_tokens < 1:
            raise ValueError(f"need num_pages >= 1 and page_tokens >= 1, got {num_pages}, {page_tokens}")
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        max_len = max_len or min(num_pages * page_tokens, positions or num_pages * page_tokens)
        self.layers = LlamaLayers(model, max_len, linear=linear, linear_group=linear_group,
                                  swiglu_linear=swiglu_linear, norm=norm, add_norm=add_norm)
        self.wide = None if max_rows is None else LlamaLayers(model, max_len, norm=norm, add_norm=add_norm)
        self.max_rows = max_rows
        self.pool = PagePool(num_pages, page_tokens, max_pages_per_request=-(-max_len // page_tokens))
        self.max_len = min(max_len, self.pool.max_pages_per_request * page_tokens)
        self.attention = attention
        lay = self.layers
        shape = (len(model.model.layers), num_pages, lay.kv_heads, page_tokens, lay.head_dim)
        self.k_pages = torch.zeros(shape, dtype=lay.dtype, device=lay.device)
        self.v_pages = torch.zeros(shape, dtype=lay.dtype, device=lay.device)
        self._limit: dict[Hashable, int] = {}  # the most tokens each running request may hold
        self._next: dict[Hashable, int] = {}   # the token each running request is fed at the next step
        self.logits: torch.Tensor | None = None  # the last step's, (B, vocab) fp32, rows in ``requests`` order

    @property
    def requests(self) -> list[Hashable]:
        """The running requests, in the order they joined (the rows of a step)."""
        return list(self._next)

    def _forward(self, tokens: torch.Tensor, attend) -> torch.Tensor:
        rows = tokens.numel()
        layers = self.layers if self.wide is None or rows <= self.max_rows else self.wide
        return layers.forward(tokens, attend).float()

    def _rope_write(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                    page: torch.Tensor, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, T, H*D) and k rotated at positions ``pos`` (B, T), k and v written to row ``row`` of page
        ``page`` (B, T) of layer ``i``; returns q, k, v as (B, heads, T, D)."""
        lay = self.layers
        c, s = lay.cos[pos][:, None], lay.sin[pos][:, None]  # (B, 1, T, D)
        q, k, v = _heads(q, lay.heads), _heads(k, lay.kv_heads), _heads(v, lay.kv_heads)
        k = rotate(k, c, s)
        self.k_pages[i][page, :, row] = k.transpose(1, 2)
        self.v_pages[i][page, :, row] = v.transpose(1, 2)
        return rotate(q, c, s), k, v

    def _slots(self, request: Hashable, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The page and the row within it of each of the request's ``positions``."""
        pages = torch.tensor(self.pool.pages(request), device=positions.device)
        return pages[positions // self.pool.page_tokens], positions % self.pool.page_tokens

    def _check_known(self, request: Hashable) -> None:
        if request not in self._next:
            raise ValueError(f"unknown request {request!r}; running: {self.requests}")

    @torch.no_grad()
    def add(self, request: Hashable, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Admit ``request``: pages for its prompt, and the prompt's forward (its keys and values written to
        them); returns the logits after the prompt, (vocab,) fp32. Its first new token (their argmax) is
        fed at the next step. ValueError if it could never fit (prompt + ``max_new_tokens`` beyond
        ``max_len``), ``OutOfPages`` if its prompt does not fit now; either way nothing changes."""
        lay = self.layers
        prompt = torch.as_tensor(prompt_ids, device=lay.device)
        if request in self._next:
            raise ValueError(f"request {request!r} is already running")
        if prompt.dim() != 1 or prompt.numel() == 0 or prompt.dtype != torch.long:
            raise ValueError(f"request {request!r}: the prompt must be a non-empty 1-D sequence of token ids, "
                             f"got shape {tuple(prompt.shape)} {prompt.dtype}")
        if max_new_tokens < 1:
            raise ValueError(f"request {request!r}: max_new_tokens must be >= 1, got {max_new_tokens}")
        n = prompt.numel()
        if n + max_new_tokens > self.max_len:
            raise ValueError(f"request {request!r}: {n} prompt + {max_new_tokens} new tokens can never fit; a request "
                             f"holds at most {self.max_len} tokens ({self.pool.max_pages_per_request} pages of "
                             f"{self.pool.page_tokens} of the pool's {self.pool.num_pages})")
        self.pool.allocate(request, n)
        positions = torch.arange(n, device=lay.device)
        page, row = self._slots(request, positions)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q, k, v = self._rope_write(i, q, k, v, positions[None], page[None], row[None])
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=lay.kv_heads != lay.heads)

        try:
            logits = self._forward(prompt[None], attend)[0]
        except BaseException:
            self.pool.free(request)
            raise
        self._limit[request] = n + max_new_tokens
        self._next[request] = int(logits.argmax())
        return logits

    @torch.no_grad()
    def step(self, tokens: Mapping[Hashable, int] | None = None) -> dict[Hashable, int]:
        """Feed every running request its next token (the argmax of its last logits, or ``tokens[request]``
        where given) in one batched forward; returns each request's next token. ``OutOfPages`` if the
        requests that cross into a new page need more pages than are free (nothing changes: finish a
        request and step again)."""
        requests = self.requests
        if not requests:
            raise ValueError("no running requests: add one first")
        for r in tokens or {}:
            self._check_known(r)
        lengths = [self.pool.length(r) for r in requests]
        for r, n in zip(requests, lengths):
            if n + 1 > self._limit[r]:
                raise ValueError(f"request {r!r} holds {n} tokens, its limit: finish it")
        crossing = sum(n % self.pool.page_tokens == 0 for n in lengths)
        if crossing > self.pool.free_pages:
            raise OutOfPages(f"{crossing} requests need a new page and {self.pool.free_pages} of the pool's "
                             f"{self.pool.num_pages} are free")
        for r, n in zip(requests, lengths):
            self.pool.extend(r, n + 1)
        lay = self.layers
        fed = torch.tensor([(tokens or {}).get(r, self._next[r]) for r in requests], device=lay.device)
        pos = torch.tensor(lengths, device=lay.device)
        slots = [self._slots(r, p[None]) for r, p in zip(requests, pos)]
        page, row = (torch.cat(s)[:, None] for s in zip(*slots))  # (B, 1)
        table = self.pool.block_table(requests, device=lay.device)
        lens = self.pool.lengths(requests, device=lay.device)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q, _, _ = self._rope_write(i, q, k, v, pos[:, None], page, row)
            return self.attention(q.contiguous(), self.k_pages[i], self.v_pages[i], table, lens)

        self.logits = self._forward(fed[:, None], attend)
        self._next = dict(zip(requests, self.logits.argmax(-1).tolist()))
        return dict(self._next)

    def finish(self, request: Hashable) -> None:
        """Stop ``request`` and give its pages back."""
        self._check_known(request)
        self.pool.free(request)
        del self._next[request], self._limit[request]


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
               "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else None,
               "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in requests) if requests else None,
               "tpot_ms": 1e3 * statistics.median(tpots) if tpots else None}
    return Served(summary, requests, answers)


def batch_decode_sweep(model: nn.Module, batches: Sequence[int], context: int, steps: int = 8,
                       page_tokens: int = PAGE_TOKENS, seed: int = 0, clock: Callable[[], float] = time.perf_counter,
                       **decoder_kw) -> list[dict]:
    """Decode tokens/s against batch size: for each batch, that many requests of ``context``-token random
    prompts prefilled, one step to warm up, then ``steps`` batched steps timed (each step ends reading
    its tokens on the host, so the device has finished). ``decoder_kw`` goes to :class:`PagedDecoder`
    (kernels, ``max_rows``)."""
    if context < 1 or steps < 1 or not batches or min(batches) < 1:
        raise ValueError(f"need context, steps and batches >= 1, got {context}, {steps}, {list(batches)}")
    generator = torch.Generator().manual_seed(seed)
    records = []
    for batch in batches:
        per_request = -(-(context + steps + 1) // page_tokens)
        dec = PagedDecoder(model, batch * per_request, page_tokens, per_request * page_tokens, **decoder_kw)
        for r in range(batch):
            dec.add(r, torch.randint(model.config.vocab_size, (context,), generator=generator), steps + 1)
        dec.step()  # warm-up: compilation, autotuning
        start = clock()
        for _ in range(steps):
            dec.step()
        seconds = clock() - start
        records.append({"what": "batch_decode", "batch": batch, "context": context, "steps": steps,
                        "seconds": seconds,
                        "tokens_per_s": batch * steps / seconds if seconds > 0 else None})
    return records
