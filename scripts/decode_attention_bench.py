"""Decode attention at batch 1: ``scaled_dot_product_attention`` over the whole masked cache (what a
CUDA-graphed decoder runs) against the course's kernel over the live half of it, per number of slices.

    python scripts/decode_attention_bench.py

Llama-2 7B and 13B heads (32 and 40 of 128), caches of 272 to 4,112 positions, the step at the middle.
Timed as a decoder runs them (``bench.time_in_graph``): 32 layers' caches, one after the other, in one graph.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from helpers import bench, require_cuda  # first: sets Triton up
from helpers.kernels.decode_attention import decode_attention  # noqa: E402

LAYERS, HEAD_DIM = 32, 128
SPLITS = (1, 2, 3, 4, 6, 8, 16)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    require_cuda("timing decode attention")
    torch.manual_seed(0)
    for heads in (32, 40):
        for max_len in (272, 1040, 4112):
            kc = [torch.randn(1, heads, max_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
            vc = [torch.randn_like(k) for k in kc]
            q = torch.randn(1, heads, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            pos = torch.tensor([max_len // 2], device="cuda")
            live = torch.arange(max_len, device="cuda") <= pos
            mask = torch.where(live, 0.0, float("-inf")).to(torch.bfloat16)[None, None, None, :]
            ref = F.scaled_dot_product_attention(q, kc[0], vc[0], attn_mask=mask).float()
            us = {"sdpa": bench.time_in_graph(
                [lambda i=i: F.scaled_dot_product_attention(q, kc[i], vc[i], attn_mask=mask) for i in range(LAYERS)]
            ).ms * 1e3}
            for s in (*SPLITS, None):
                error = float((decode_attention(q, kc[0], vc[0], pos, s).float() - ref).norm() / ref.norm())
                if error > 2e-2:
                    raise RuntimeError(f"{heads} heads, {max_len} positions, {s} splits: error {error:.3g}")
                us[f"{s or 'default'} splits"] = bench.time_in_graph(
                    [lambda i=i, s=s: decode_attention(q, kc[i], vc[i], pos, s) for i in range(LAYERS)]).ms * 1e3
            print(f"{heads} heads, {max_len:5d} positions, us a call: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in us.items()), flush=True)


if __name__ == "__main__":
    main()
