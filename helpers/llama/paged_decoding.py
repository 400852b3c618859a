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

from typing import Hashable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..bench import capture_graph
from . import kernel_set
from .decoding import (AddNorm, Linear, LinearGroup, LlamaLayers, Norm, SwigluLinear, module_linear, rotate,
                       torch_rms_norm)
from .kernel_set import PagedAttention, triton_paged_attention
from .page_pool import PAGE_TOKENS, OutOfPages, PagePool

NF4_ROWS = 16  # the rows a step sends through the nf4 kernels; more go through the dequantised weights
BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256)  # batch sizes a CUDA graph is captured for


def course_kernels(max_rows: int = NF4_ROWS) -> dict:
    """The hooks of the course's kernel set (``kernel_set.COURSE``: nf4 kernels, fused RMSNorm, SwiGLU and
    residual add, the paged kernel) up to ``max_rows`` rows (at most ``nf4_gemv.MAX_M``), and past them the
    weights dequantised once a step."""
    return kernel_set.COURSE.paged_hooks(max_rows)


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, T, n * D) -> (B, n, T, D)."""
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)


class PagedDecoder:
    """Greedy decoding of ``model`` for requests that come and go, their caches in ``num_pages`` pages
    of ``page_tokens`` tokens; a request holds at most ``max_len`` tokens (prompt and answer; default:
    as many as the pool holds, within the model's positions).

    The kernel hooks are :class:`~helpers.llama.decoding.LlamaLayers`' (``linear``, ``linear_group``,
    ``swiglu_linear``, ``norm``, ``add_norm``). ``max_rows``: the most rows the linear hooks take (the
    nf4 kernels': ``nf4_gemv.MAX_M``); a forward over more rows (a larger batch, a long prompt) computes
    every projection with ``wide_linear`` (default: the module's own forward). ``attention``: a
    :data:`PagedAttention` (default: the Triton kernel; ``kernel_set.torch_paged_attention`` to check it).
    ``graph=True`` (CUDA only): a step of B requests replays a CUDA graph captured once for the smallest
    of ``BUCKETS`` >= B, the batch padded with rows that write only to a spare page; more than
    ``BUCKETS[-1]`` requests step without a graph.
    """

    def __init__(self, model: nn.Module, num_pages: int, page_tokens: int = PAGE_TOKENS, max_len: int | None = None,
                 *, linear: Linear = module_linear, linear_group: LinearGroup | None = None,
                 swiglu_linear: SwigluLinear | None = None, norm: Norm = torch_rms_norm,
                 add_norm: AddNorm | None = None, attention: PagedAttention = triton_paged_attention,
                 max_rows: int | None = None, wide_linear: Linear = module_linear, graph: bool = False) -> None:
        if num_pages < 1 or page_tokens < 1:
            raise ValueError(f"need num_pages >= 1 and page_tokens >= 1, got {num_pages}, {page_tokens}")
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        max_len = max_len or min(num_pages * page_tokens, positions or num_pages * page_tokens)
        self.layers = LlamaLayers(model, max_len, linear=linear, linear_group=linear_group,
                                  swiglu_linear=swiglu_linear, norm=norm, add_norm=add_norm)
        self.wide = None if max_rows is None else LlamaLayers(model, max_len, linear=wide_linear, norm=norm,
                                                               add_norm=add_norm)
        self.max_rows = max_rows
        self.pool = PagePool(num_pages, page_tokens, max_pages_per_request=-(-max_len // page_tokens))
        self.max_len = min(max_len, self.pool.max_pages_per_request * page_tokens)
        self.attention = attention
        lay = self.layers
        if graph and lay.device.type != "cuda":
            raise ValueError(f"graph=True needs the model on a CUDA device; it is on {lay.device}")
        self.use_graph = graph
        self.spare = num_pages  # one page more than the pool hands out: the padding rows of a graphed step
        shape = (len(model.model.layers), num_pages + 1, lay.kv_heads, page_tokens, lay.head_dim)
        self.k_pages = torch.zeros(shape, dtype=lay.dtype, device=lay.device)
        self.v_pages = torch.zeros(shape, dtype=lay.dtype, device=lay.device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], torch.Tensor]] = {}
        # one memory pool for every bucket's graph: replays never overlap, and each step's logits are
        # copied out before the next replay, so the graphs may reuse each other's scratch memory
        self._graph_pool = torch.cuda.graph_pool_handle() if graph else None
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

    def _rows(self, batch: int) -> int:
        """The rows a step of ``batch`` requests runs: with graphs, the smallest bucket that holds them."""
        return next((x for x in BUCKETS if x >= batch), batch) if self.use_graph else batch

    def _inputs(self, requests: Sequence[Hashable], fed: Sequence[int], rows: int, width: int | None
                ) -> dict[str, torch.Tensor]:
        """A step's inputs on the host, for ``requests`` (each already extended by the token it is fed)
        and ``rows - len(requests)`` padding rows: one token at position 0 of the spare page."""
        page_tokens, pad = self.pool.page_tokens, rows - len(requests)
        lengths = [self.pool.length(r) for r in requests]  # the new token included
        pages = [self.pool.pages(r)[(n - 1) // page_tokens] for r, n in zip(requests, lengths)]
        table = self.pool.block_table(requests, width)
        return {"fed": torch.tensor(list(fed) + [0] * pad),
                "pos": torch.tensor([n - 1 for n in lengths] + [0] * pad),
                "page": torch.tensor(pages + [self.spare] * pad),
                "row": torch.tensor([(n - 1) % page_tokens for n in lengths] + [0] * pad),
                "table": torch.cat([table, torch.full((pad, table.shape[1]), self.spare, dtype=table.dtype)]),
                "lens": torch.tensor(lengths + [1] * pad, dtype=torch.int32)}

    def _decode(self, fed: torch.Tensor, pos: torch.Tensor, page: torch.Tensor, row: torch.Tensor,
                table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """One step's forward from its inputs on the device: the logits (rows, vocab) fp32."""
        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q, _, _ = self._rope_write(i, q, k, v, pos[:, None], page[:, None], row[:, None])
            return self.attention(q.contiguous(), self.k_pages[i], self.v_pages[i], table, lens)

        return self._forward(fed[:, None], attend)

    def _capture(self, rows: int) -> tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], torch.Tensor]:
        """A graph of a ``rows``-row step, its input tensors and its logits; captured on padding rows only,
        so the warm-up steps write nothing but the spare page."""
        device = self.layers.device
        static = {k: t.to(device) for k, t in self._inputs([], [], rows, self.pool.max_pages_per_request).items()}
        graph, logits = capture_graph(lambda: self._decode(**static), warmup=2, pool=self._graph_pool)
        return graph, static, logits

    @torch.no_grad()
    def capture_graphs(self, up_to: int = BUCKETS[-1]) -> None:
        """With ``graph=True``, capture now the step of every bucket up to ``up_to`` rows, so that no later
        step pays for a capture (without graphs: nothing)."""
        for rows in BUCKETS:
            if self.use_graph and rows <= up_to and rows not in self._graphs:
                self._graphs[rows] = self._capture(rows)

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
        fed = [(tokens or {}).get(r, self._next[r]) for r in requests]
        b = len(requests)
        rows = self._rows(b)
        inputs = self._inputs(requests, fed, rows, self.pool.max_pages_per_request)
        if self.use_graph and rows in BUCKETS:
            if rows not in self._graphs:
                self._graphs[rows] = self._capture(rows)
            graph, static, logits = self._graphs[rows]
            for name, t in inputs.items():
                static[name].copy_(t)
            graph.replay()
            self.logits = logits[:b].clone()  # the graph's output is overwritten by its next replay
        else:
            self.logits = self._decode(**{k: t.to(self.layers.device) for k, t in inputs.items()})[:b]
        self._next = dict(zip(requests, self.logits.argmax(-1).tolist()))
        return dict(self._next)

    def finish(self, request: Hashable) -> None:
        """Stop ``request`` and give its pages back."""
        self._check_known(request)
        self.pool.free(request)
        del self._next[request], self._limit[request]
