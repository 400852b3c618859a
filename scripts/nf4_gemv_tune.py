"""Measure the fused nf4 kernel's launch shapes on this GPU, to fill ``nf4_gemv._TABLE``.

    python scripts/nf4_gemv_tune.py --rows 1 16

For each Llama-2-7B weight shape (and the row counts of the decoder's grouped launches) and each
count of rows of x, times every ``Config`` of a small grid after checking its result against
bitsandbytes' dequantised weights in float64, and prints the fastest few with their GB/s against the
measured copy bandwidth, then the default's and bitsandbytes' own kernel.
Timed as a decoder runs them (``bench.time_in_graph``): inside one CUDA graph, over enough copies of
the weight to exceed the L2 cache, so every call reads its weight from HBM and no launch gap from the
CPU is counted. Launch shapes that need more resources than the GPU has are skipped.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from helpers import bench, require_cuda  # first: on a machine without a GPU it sets the Triton interpreter up
import bitsandbytes as bnb  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402  (imports Triton)
import triton  # noqa: E402
from helpers.studies.decoding_ladder import LLAMA_7B_SHAPES, nf4_gemv_bytes, nf4_weights  # noqa: E402
from helpers.kernels.nf4_format import nf4_operands  # noqa: E402
from helpers.kernels.nf4_gemv import Config, config_for, nf4_matmul  # noqa: E402

# one pipeline stage only: three stages were never among the fastest on the H200 in earlier sweeps;
# long K tiles without a split save the partial sums' second kernel
GRID = {1: {"block_n": (16, 32, 64), "block_k": (256, 1024, 2048), "num_warps": (2, 4, 8), "split_k": (1, 2, 4),
            "num_stages": (1,), "prefetch": (True,), "max_registers": (None,)},
        16: {"block_n": (32, 64), "block_k": (128, 256), "num_warps": (4, 8), "split_k": (1, 2, 4),
             "num_stages": (1,), "prefetch": (False,), "max_registers": (None,)}}
TOLERANCE = 2e-2  # max error / max |y| against float64: a few bf16 roundings
# the decoder's grouped launches (nf4_matmul_group) cover these row counts in one grid
SHAPES = {**LLAMA_7B_SHAPES, "q, k, v in one launch (12288 x 4096)": (12288, 4096),
          "gate, up in one launch (22016 x 4096)": (22016, 4096)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1], choices=sorted(GRID))
    parser.add_argument("--top", type=int, default=4)
    fields = ("block_n", "block_k", "num_warps", "split_k", "max_registers")  # axes the command line may set
    for field in fields:
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, nargs="+",
                            help=f"{field} values (default: GRID's; for max_registers 0 is no cap)")
    args = parser.parse_args()
    for rows in args.rows:  # the command line narrows or widens the grid
        GRID[rows].update({f: tuple(x or None for x in v) for f in fields if (v := getattr(args, f)) is not None})
    require_cuda("tuning the nf4 kernel")
    copy = bench.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:,.0f} GB/s")
    tile_times: dict[int, dict[tuple, dict[str, float]]] = {rows: {} for rows in args.rows}  # ms by rows, tile, shape
    for label, (n, k) in SHAPES.items():
        weights = nf4_weights(n, k)
        ops = [nf4_operands(w) for w in weights]
        for rows in args.rows:
            moved = nf4_gemv_bytes(n, k, rows)
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ref = x.double() @ bnbf.dequantize_4bit(*weights[0]).double().T
            default = config_for(rows, n, k)
            timed = []
            for values in itertools.product(*GRID[rows].values()):
                cfg = Config(*values)
                if cfg.block_k > k or (rows > 1 and cfg.block_n < 16):  # tensor-core path: tl.dot's 16-row minimum
                    continue
                try:
                    out = nf4_matmul(x, ops[0], config=cfg).double()
                except triton.runtime.errors.OutOfResources:
                    continue
                error = float((out - ref).abs().max() / ref.abs().max())
                if error > TOLERANCE:
                    raise RuntimeError(f"{label}, {rows} rows, {cfg}: max error {error:.3g} of max |y|")
                ms = bench.time_in_graph([lambda o=o, cfg=cfg: nf4_matmul(x, o, config=cfg) for o in ops]).ms
                timed.append((ms, str(cfg)))
                tile = (cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, cfg.prefetch, cfg.max_registers)
                best = tile_times[rows].setdefault(tile, {})
                best[label] = min(ms, best.get(label, ms))  # the tile's fastest split on this shape
            timed.sort()
            default_ms = bench.time_in_graph([lambda o=o: nf4_matmul(x, o) for o in ops]).ms
            bnb_ms = bench.time_in_graph([lambda w=w: bnb.matmul_4bit(x, w[0].t(), quant_state=w[1])
                                          for w in weights]).ms
            print(f"\n{label}, {rows} row(s), {len(weights)} copies of the weight:")
            for ms, name in timed[:args.top] + [(default_ms, f"{default} default"), (bnb_ms, "bitsandbytes")]:
                gbps = moved / ms / 1e6
                print(f"  {ms * 1e3:8.1f} us  {gbps:7,.0f} GB/s  {100 * gbps / copy:4.0f}% of copy  {name}", flush=True)
    for rows, tiles in tile_times.items():
        fastest = {label: min(t[label] for t in tiles.values() if label in t) for label in SHAPES}
        slowdown = {tile: max(t[label] / fastest[label] for label in SHAPES)
                    for tile, t in tiles.items() if len(t) == len(SHAPES)}
        print(f"\n{rows} row(s): one tile for every shape (its best split on each), worst slowdown against each "
              "shape's fastest:")
        for tile, worst in sorted(slowdown.items(), key=lambda kv: kv[1])[:args.top]:
            print(f"  (block_n, block_k, num_warps, num_stages, prefetch, max_registers) = {tile}: "
                  f"{100 * (worst - 1):.0f}% slower at worst")


if __name__ == "__main__":
    main()
