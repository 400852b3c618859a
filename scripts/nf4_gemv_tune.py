"""Measure the fused nf4 kernel's launch shapes on this GPU, to fill ``nf4_gemv._TABLE``.

    python scripts/nf4_gemv_tune.py --rows 1      # then --rows 16 (each a few minutes)

For each Llama-2-7B weight shape and each row count, times every ``Config`` of a small grid (block_n,
block_k, num_warps, split_k) after checking its result against the default config's, and prints the
fastest few with their GB/s against the measured copy bandwidth, then the default's. Timed after a
read-only L2 flush (no dirty lines for the kernel to write back; see scripts/l2_flush_check.py).
Launch shapes that need more shared memory than the GPU has are skipped.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from helpers import bench, require_cuda  # first: on a machine without a GPU it sets the Triton interpreter up
import bitsandbytes.functional as bnbf  # noqa: E402  (imports Triton)
import triton  # noqa: E402
from helpers.decode_bench import LLAMA_7B_SHAPES, nf4_gemv_bytes
from helpers.kernels.nf4_gemv import Config, config_for, nf4_matmul, nf4_operands

GRID = {1: {"block_n": (8, 16, 32), "block_k": (256, 512, 1024), "num_warps": (2, 4, 8), "split_k": (1, 2, 4, 8)},
        16: {"block_n": (16, 32, 64), "block_k": (128, 256, 512), "num_warps": (4, 8), "split_k": (1, 2)}}
TIMING = dict(warmup_ms=5, rep_ms=20, max_reps=200, flush_l2="read")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1], choices=sorted(GRID))
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args()
    require_cuda("tuning the nf4 kernel")
    copy = bench.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:,.0f} GB/s")
    for label, (n, k) in LLAMA_7B_SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        ops = nf4_operands(bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True))
        del w
        for rows in args.rows:
            moved = nf4_gemv_bytes(n, k, rows)
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            default = config_for(rows, n, k)
            expected = nf4_matmul(x, ops, config=default)
            timed = []
            for values in itertools.product(*GRID[rows].values()):
                cfg = Config(*values[:3], split_k=values[3])
                if cfg.block_k > k:
                    continue
                try:
                    out = nf4_matmul(x, ops, config=cfg)
                except triton.runtime.errors.OutOfResources:  # more shared memory than the GPU has
                    continue
                tolerance = 2e-2 * expected.abs().max().item()
                if not torch.allclose(out.float(), expected.float(), rtol=2e-2, atol=tolerance):
                    raise RuntimeError(f"{label}, {rows} rows, {cfg}: result differs from the default config's")
                ms = bench.time_fn(lambda cfg=cfg: nf4_matmul(x, ops, config=cfg), **TIMING).ms
                timed.append((ms, cfg))
            timed.sort(key=lambda t: t[0])
            default_ms = bench.time_fn(lambda: nf4_matmul(x, ops, config=default), **TIMING).ms
            print(f"\n{label}, {rows} row(s):")
            for ms, cfg in timed[:args.top] + [(default_ms, default)]:
                tag = "default" if cfg is default else ""
                gbps = moved / ms / 1e6
                print(f"  {ms * 1e3:8.1f} us  {gbps:7,.0f} GB/s  {100 * gbps / copy:4.0f}% of copy  {cfg} {tag}")


if __name__ == "__main__":
    main()
