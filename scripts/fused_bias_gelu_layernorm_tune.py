"""Measure the fused bias + GELU + LayerNorm kernel's launch shapes on this GPU, to fill
``fused_bias_gelu_layernorm._FORWARD_TABLE`` and ``_BACKWARD_TABLE``.

    python scripts/fused_bias_gelu_layernorm_tune.py [--ns 8192] [--block 4096] [--passes fwd] [--dtypes bf16]
                                                     [--gelu erf_exp2] [--out sweep.json]
                                                     [--rows 1 2] [--num-warps 4 8] [--programs-per-sm 2] [--loads 3]

For fp32 and bf16 and N in 1024 ... 8192 (M x N = 64M elements, as notebook 04 benchmarks), times
every ``Config`` of a small grid (rows per program x warps x programs per SM x how the next row block
is loaded: prefetched, on demand (backward), or through a pipelined loop (forward)), forward and backward
alone, after checking each against the table's launch; prints the fastest few against the measured
copy bandwidth. Then splits the autograd forward+backward of the table's launch into the kernels'
time and the host's: how long Python takes to issue one call, against how long the GPU needs for it.
``--block`` times launches with that many columns a step instead of the table's (below N: the
kernels walk each row in chunks). ``--graph`` times each launch as the side-by-side run does (calls back to back
in a CUDA graph: the previous call's writes still draining from L2, as in a model), not after an L2 flush.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton

from helpers import bench, require_cuda  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers.studies import eager_chain
from helpers.kernels import fused_bias_gelu_layernorm as K  # noqa: E402

ELEMS = 1 << 26
NS = (1024, 2048, 4096, 8192)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GRID = {"fwd": {"rows": (1, 2, 4), "num_warps": (2, 4, 8, 16, 32), "programs_per_sm": (1, 2, 4, 8),
                "loads": ("prefetch", 3, 4)},  # the next row block prefetched, or the loop pipelined in 3 or 4 stages
        "bwd": {"rows": (1, 2, 4), "num_warps": (4, 8, 16), "programs_per_sm": (1, 2, 4), "loads": ("prefetch", 1)}}
PER_THREAD = {"fwd": (4, 64), "bwd": (2, 32)}  # elements of a tile per thread worth trying (fewer idle, more spill)
TIMING = {"warmup_ms": 5, "rep_ms": 25, "min_reps": 10, "flush_l2": "read"}  # as notebook 04 times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write every timing here (JSON)")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--ns", type=int, nargs="+", default=list(NS), help="row widths")
    parser.add_argument("--block", type=int, help="columns a step (default: the table's)")
    parser.add_argument("--passes", nargs="+", choices=("fwd", "bwd"), default=["fwd", "bwd"])
    parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES))
    parser.add_argument("--gelu", default="auto", choices=["auto", *K.GELU_MODES],
                        help="GELU variant of the swept kernels (the fwd+bwd split keeps auto)")
    for axis in ("rows", "num_warps", "programs_per_sm"):
        parser.add_argument(f"--{axis.replace('_', '-')}", type=int, nargs="+", help=f"sweep only these {axis}")
    parser.add_argument("--loads", nargs="+", help="sweep only these loads: prefetch, or a number of stages")
    parser.add_argument("--graph", action="store_true",
                        help="time back-to-back calls replayed in a CUDA graph (bench.steady_state_time: the steady "
                             "state of peers_side_by_side.py's device time) instead of events after an L2 flush")
    args = parser.parse_args()
    for grid in GRID.values():
        for axis in grid:
            if getattr(args, axis):
                grid[axis] = tuple(v if v == "prefetch" else int(v) for v in getattr(args, axis))
    require_cuda("tuning the fused kernel")
    copy = bench.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:,.0f} GB/s")
    rows_out = []
    for dname, n in itertools.product(args.dtypes, args.ns):
        dtype, m = DTYPES[dname], ELEMS // n
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        b, w, lb = (torch.randn(n, device="cuda", dtype=dtype) for _ in range(3))
        dy = torch.randn_like(x)
        y_ref, mean, rstd = K.forward(x, b, w, lb, gelu=args.gelu)
        dx_ref = K.backward(dy, x, b, w, mean, rstd, gelu=args.gelu)[0]
        moved = {"fwd": eager_chain.fused_forward_bytes(m, n, x.element_size()),
                 "bwd": eager_chain.fused_backward_bytes(m, n, x.element_size())}
        table = {"fwd": K.forward_config(n, dtype), "bwd": K.backward_config(n, dtype)}
        for pas in args.passes:
            timed = []
            for rows, warps, pps, loads in itertools.product(*GRID[pas].values()):
                prefetch, stages = (True, 1) if loads == "prefetch" else (False, loads)
                cfg = K.Config(args.block or table[pas].block_n, rows, warps, pps, prefetch, stages)
                lo, hi = PER_THREAD[pas]
                if not lo <= rows * cfg.block_n // (32 * warps) <= hi and cfg != table[pas]:
                    continue
                if pas == "fwd":
                    # (F821: ruff sees the del at the loop's end; the lambdas run before it)
                    run = lambda: K.forward(x, b, w, lb, gelu=args.gelu, config=cfg)  # noqa: E731, F821
                    ref = y_ref
                else:
                    run = lambda: K.backward(dy, x, b, w, mean, rstd, gelu=args.gelu, config=cfg)  # noqa: E731, F821
                    ref = dx_ref
                try:
                    got = run()[0]
                except triton.runtime.errors.OutOfResources:  # pipelined stages beyond shared memory
                    continue
                if not torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-2):
                    raise AssertionError(f"{pas} {dname} N={n} {cfg}: result differs from the table's launch")
                ms = (bench.steady_state_time(run).ms if args.graph
                      else bench.time_fn(run, **TIMING).ms)
                timed.append((ms, cfg))
                rows_out.append({"pass": pas, "dtype": dname, "N": n, "rows": rows, "num_warps": warps,
                                 "programs_per_sm": pps, "prefetch": cfg.prefetches(m, x.device), "stages": stages,
                                 "ms": ms, "pct_copy": 100 * moved[pas] / ms / 1e6 / copy,
                                 "table": cfg == table[pas]})
            timed.sort(key=lambda t: t[0])
            best = timed[0][0]
            table_ms = next((ms for ms, cfg in timed if cfg == table[pas]), None)
            if table_ms is None:
                print(f"{pas} {dname} N={n}, {args.block} columns a step:")
            else:
                print(f"{pas} {dname} N={n}: table {table[pas]} {100 * moved[pas] / table_ms / 1e6 / copy:.1f}% "
                      f"({table_ms / best - 1:+.0%} from best)")
            for ms, cfg in timed[:args.top]:
                print(f"    rows={cfg.rows:2d} warps={cfg.num_warps:2d} pps={cfg.programs_per_sm} "
                      f"prefetch={cfg.prefetches(m, x.device)} stages={cfg.stages}: {ms * 1e3:7.1f} us "
                      f"{100 * moved[pas] / ms / 1e6 / copy:5.1f}%")
        if args.block or len(args.passes) < 2:
            continue
        leaves = [t.clone().requires_grad_() for t in (x, b, w, lb)]
        both = lambda: torch.autograd.grad(K.fused_bias_gelu_layernorm(*leaves), leaves, dy)  # noqa: E731, F821
        gpu = bench.time_fn(both, **TIMING).ms
        host = bench.host_time(both, calls=50).ms
        print(f"fwd+bwd {dname} N={n}: {gpu * 1e3:.1f} us timed, {host * 1e3:.1f} us to issue from Python")
        rows_out.append({"pass": "fwd+bwd", "dtype": dname, "N": n, "ms": gpu, "host_ms": host})
        del x, dy, leaves
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"copy_gbps": copy, "records": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
