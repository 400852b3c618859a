"""Exercises of notebook 07 (decoding): unpacking nf4, one step into a static KV cache, the roofline's tokens/s."""
from __future__ import annotations

import torch

from .. import datasheets
from ..finetune import generate
from ..llama import models
from .checks import Case, CodeCheck, NumberCheck, on_device


def nf4_unpack(packed: torch.Tensor, code: torch.Tensor, absmax: torch.Tensor, blocksize: int) -> torch.Tensor:
    """Solution of 07.1: weight ``i`` is ``code[q_i] * absmax[i // blocksize]``, where byte ``j`` holds
    ``q_2j`` in its high nibble and ``q_2j+1`` in its low one; float32, two weights a byte."""
    q = torch.stack((packed >> 4, packed & 15), dim=1).flatten().long()
    return code[q] * absmax.repeat_interleave(blocksize)


def _nf4_inputs(case: Case, generator: torch.Generator) -> tuple:
    blocks, blocksize = case.params["blocks"], case.params["blocksize"]
    packed = torch.randint(0, 256, (blocks * blocksize // 2,), generator=generator, dtype=torch.uint8)
    # a fresh table each time (sorted, from -1 to 1, like nf4's): the answer must read it, not its own copy
    inner = torch.sort(torch.rand(14, generator=generator, dtype=torch.float64) * 2 - 1).values
    code = torch.cat((torch.tensor([-1.0], dtype=torch.float64), inner, torch.tensor([1.0], dtype=torch.float64)))
    absmax = torch.rand(blocks, generator=generator, dtype=torch.float64) + 0.1
    return on_device(packed), on_device(code.float()), on_device(absmax.float()), blocksize


def _nf4_reference(packed, code, absmax, blocksize) -> torch.Tensor:
    packed, code, absmax = packed.cpu().long(), code.cpu().double(), absmax.cpu().double()
    weights = torch.empty(2 * packed.numel(), dtype=torch.float64)
    for j, byte in enumerate(packed.tolist()):  # one byte at a time: slow and plain, the definition itself
        for half, q in enumerate((byte >> 4, byte & 15)):
            i = 2 * j + half
            weights[i] = code[q] * absmax[i // blocksize]
    return weights


NF4_UNPACK = CodeCheck(
    "07.1", "nf4_unpack(packed, code, absmax, blocksize): two 4-bit codes a byte, looked up and scaled",
    solution=nf4_unpack, make_inputs=_nf4_inputs, reference=_nf4_reference,
    cases=[Case(f"{b} blocks of {bs}", torch.float32, {"blocks": b, "blocksize": bs})
           for b, bs in ((1, 64), (3, 64), (5, 16), (7, 2))],
    out_dtypes=lambda case: (torch.float32,),
    hints={"value": "Wrong weights. The high nibble (byte >> 4) is the first weight of the pair, the low one "
                    "(byte & 15) the second. Weight i (not byte j) belongs to block i // blocksize.",
           "raised": "Indexing a tensor with uint8 values treats them as a mask: convert the codes with .long() "
                     "before `code[q]`.",
           "shape": "Two weights per byte: the result has 2 * packed.numel() elements, in order."})


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Solution of 07.2: write one step's ``k``, ``v`` (B, H, 1, D) into the caches (B, H, max_len, D) at
    the position in the one-element tensor ``pos``, in place; returns the caches."""
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    return k_cache, v_cache


def _kv_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    b, h, max_len, d = case.params["cache"]
    caches = [torch.randn(b, h, max_len, d, generator=generator).to(case.dtype) for _ in range(2)]  # earlier steps
    step = [torch.randn(b, h, 1, d, generator=generator).to(case.dtype) for _ in range(2)]
    pos = torch.tensor([case.params["pos"]])
    return tuple(on_device(t) for t in (*caches, *step, pos))


def _kv_reference(k_cache, v_cache, k, v, pos) -> tuple[torch.Tensor, torch.Tensor]:
    k_ref, v_ref = k_cache.detach().cpu().double().clone(), v_cache.detach().cpu().double().clone()
    p = int(pos.item())
    k_ref[:, :, p] = k.detach().cpu().double()[:, :, 0]
    v_ref[:, :, p] = v.detach().cpu().double()[:, :, 0]
    return k_ref, v_ref


WRITE_KV = CodeCheck(
    "07.2", "write_kv(k_cache, v_cache, k, v, pos): one decode step's K and V into a static cache, in place",
    solution=write_kv, make_inputs=_kv_inputs, reference=_kv_reference,
    cases=[Case(f"cache {c}, pos {p}", dtype, {"cache": c, "pos": p})
           for c, p in (((1, 2, 7, 8), 0), ((2, 3, 11, 16), 10), ((1, 4, 9, 8), 4))
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype, case.dtype),
    in_place={0: 0, 1: 1},
    hints={"value": "The caches differ from the reference. Only position pos along dim 2 (the sequence) may "
                    "change; every other position holds earlier steps and must stay as it was. K goes to k_cache, "
                    "V to v_cache.",
           "not in place": "A static cache is allocated once: write into it (k_cache.index_copy_(2, pos, k), or "
                           "k_cache[:, :, pos] = k) and return the same tensors; torch.cat makes new ones.",
           "raised": "pos is a one-element tensor (so one CUDA graph serves every step): index with it directly, "
                     "or take int(pos) outside a graph."})


def _roofline_tokens() -> tuple[float, str]:
    spec, h200, context = models.MODELS["7b"], datasheets.by_name("H200"), 128
    per_token = generate.decode_bytes_per_token(spec, context, lm_head_bytes=2)
    rate = h200.bandwidth_gbps * 1e9 / per_token
    return rate, (f"generate.decode_bytes_per_token(7B, {context} cached tokens, bf16 lm_head) = "
                  f"{per_token / 1e9:.2f} GB a token (nf4 weights, lm_head, one embedding row, the KV cache); "
                  f"the H200's datasheet {h200.bandwidth_gbps:,.0f} GB/s / that = {rate:,.0f} tokens/s")


ROOFLINE_TOKENS = NumberCheck("07.3", "tokens/s the H200's bandwidth allows Llama-2-7B nf4 at batch 1 "
                              "(128 tokens in the cache)", _roofline_tokens, tolerance=0.1, relative=True,
                              unit="tokens/s")

CHECKS = (NF4_UNPACK, WRITE_KV, ROOFLINE_TOKENS)
