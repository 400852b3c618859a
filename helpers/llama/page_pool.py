"""The allocator of a paged KV cache: fixed-size pages handed out by id, a block-table row per request.

The tensors that hold the pages are the attention kernel's business; a ``PagePool`` only keeps the ids.
It takes pages back when a request finishes. A request it cannot hold now is refused with
``OutOfPages``; one it could never hold with ``ValueError``; either way nothing it holds changes.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import torch

PAGE_TOKENS = 16  # tokens a page holds (vLLM's default block size)


class OutOfPages(RuntimeError):
    """The pool has too few free pages for a request now (it may fit once others finish)."""


class PagePool:
    """``num_pages`` pages of ``page_tokens`` tokens each, handed out to requests by id.

    A request holds ``pages_for(length)`` pages, listed in order in its block-table row (at most
    ``max_pages_per_request``, the table's width). Freed pages go back on a stack and are handed out
    again first, so a new request reuses a finished one's pages."""

    def __init__(self, num_pages: int, page_tokens: int = PAGE_TOKENS, max_pages_per_request: int | None = None):
        if num_pages < 1 or page_tokens < 1:
            raise ValueError(f"need num_pages >= 1 and page_tokens >= 1, got {num_pages}, {page_tokens}")
        self.num_pages, self.page_tokens = num_pages, page_tokens
        self.max_pages_per_request = min(num_pages, max_pages_per_request or num_pages)
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: page 0 is handed out first
        self._pages: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_tokens)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def requests(self) -> list[Hashable]:
        return list(self._pages)

    def length(self, request: Hashable) -> int:
        return self._lengths[request]

    def pages(self, request: Hashable) -> list[int]:
        """The request's pages, in the order of its positions."""
        return list(self._pages[request])

    def _take(self, request: Hashable, tokens: int, held: int) -> list[int]:
        """New pages for ``request`` to hold ``tokens`` (it holds ``held`` pages now); checks first, so a
        refusal changes nothing."""
        need = self.pages_for(tokens)
        if need > self.max_pages_per_request:
            raise ValueError(f"request {request!r}: {tokens} tokens need {need} pages of {self.page_tokens}; a "
                             f"request can never hold more than {self.max_pages_per_request}")
        extra = need - held
        if extra > len(self._free):
            raise OutOfPages(f"request {request!r}: {tokens} tokens need {need} pages; it holds {held} and "
                             f"{len(self._free)} of the pool's {self.num_pages} are free")
        return [self._free.pop() for _ in range(extra)]

    def allocate(self, request: Hashable, tokens: int) -> list[int]:
        """Give a new request pages for ``tokens`` tokens; returns them."""
        if request in self._pages:
            raise ValueError(f"request {request!r} already holds pages")
        if tokens < 1:
            raise ValueError(f"request {request!r}: tokens must be >= 1, got {tokens}")
        self._pages[request] = self._take(request, tokens, 0)
        self._lengths[request] = tokens
        return self.pages(request)

    def extend(self, request: Hashable, tokens: int) -> list[int]:
        """Grow a request to ``tokens`` tokens (a decode step adds one), taking pages as it needs; returns
        the pages it took."""
        if tokens < self._lengths[request]:
            raise ValueError(f"request {request!r} holds {self._lengths[request]} tokens; it cannot shrink to {tokens}")
        taken = self._take(request, tokens, len(self._pages[request]))
        self._pages[request] += taken
        self._lengths[request] = tokens
        return taken

    def free(self, request: Hashable) -> list[int]:
        """A finished request's pages back to the pool; returns them."""
        pages = self._pages.pop(request)
        del self._lengths[request]
        self._free.extend(reversed(pages))
        return pages

    def block_table(self, requests: Sequence[Hashable], width: int | None = None,
                    device: torch.device | str = "cpu") -> torch.Tensor:
        """(len(requests), width) int32: each request's pages in order, padded with page 0 (never read:
        the padding lies past the request's length). ``width``: by default the longest row."""
        rows = [self._pages[r] for r in requests]
        width = max((len(p) for p in rows), default=0) if width is None else width
        if any(len(p) > width for p in rows):
            raise ValueError(f"a request holds more than width = {width} pages")
        return torch.tensor([p + [0] * (width - len(p)) for p in rows], dtype=torch.int32, device=device
                            ).reshape(len(rows), width)

    def lengths(self, requests: Sequence[Hashable], device: torch.device | str = "cpu") -> torch.Tensor:
        """(len(requests),) int32: each request's length in tokens."""
        return torch.tensor([self._lengths[r] for r in requests], dtype=torch.int32, device=device)
