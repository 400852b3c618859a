"""Exercises of notebook 09 (serving): the KV cache's bytes a token, and a request's cache gathered from its pages."""
from __future__ import annotations

import torch

from ..llama import models
from ..kernels.paged_decode_attention import gather_pages
from .checks import Case, CodeCheck, NumberCheck, on_device


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
    return gather_pages(pages, table_row, length)


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
    out_dtypes=lambda case: (case.dtype,),
    hints={"value": "Wrong values. Position t is in page table_row[t // page_tokens] (the table, not page t // "
                    "page_tokens itself: pages are handed out in any order), at row t % page_tokens of it. "
                    "pages[i] is (H_kv, page_tokens, D): put the heads first before you join the pages.",
           "shape": "Return (H_kv, length, D): the pages a request holds cover a whole number of pages; cut "
                    "the positions past its length.",
           "raised": "table_row is an integer tensor: index pages with table_row[:n].long(); n = ceil(length / "
                     "page_tokens) pages."})

CHECKS = (KV_BYTES_13B, GATHER_REQUEST)
