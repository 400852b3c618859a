"""Measure RMSNorm's launch shapes on this GPU beside Liger-Kernel and torch.compile, in one run.

    python scripts/rms_norm_tune.py [--ns 4096 5120 8192] [--weights bf16 fp32] [--passes fwd bwd] [--top 3] [--m M]
                                    [--stages 1 3] [--rows 1 2] [--num-warps 8 16] [--programs-per-sm 4 256] [--graph]
                                    [--peers liger]

RMSNorm's launch tables (``rms_norm.forward_config``, ``backward_config``) come from this script; widths it has not
measured take the fused bias + GELU + LayerNorm kernel's, made for far more arithmetic an element. For Llama's
widths at the side-by-side run's shapes (bf16 activations; the weight bf16, or fp32 as in a QLoRA model), this
times every ``Config`` of a small grid (rows per program x warps x programs per SM, and for the forward the pipeline
depth of its loop), forward and backward (with the weight's gradient), each checked against the table's launch
first, on the device (CUDA events, L2 flushed by a read, median). Liger-Kernel's RMSNorm (when installed),
``torch.compile`` of transformers' formula (compiled afresh for each shape) and the course's autograd call with the
table's launches, built on the same inputs as the side-by-side run builds them
(``helpers.studies.peer_kernels``), are timed the same way in the same run, forward and forward+backward
through autograd. Prints the fastest few against the copy bandwidth and the peers, and writes
``results/<gpu>/rms_norm_tune.json``. ``--graph`` times every launch and peer as the side-by-side run's device time
does (calls back to back in a CUDA graph, the L2 not flushed) instead of events after an L2 flush.
"""
from __future__ import annotations

import argparse
import functools
import itertools
from typing import Callable

import torch

from helpers import bench, pick, require_cuda, results  # first: sets the Triton interpreter up on a CPU
from helpers.studies import peer_kernels
from helpers.kernels import rms_norm as R

ROWS = {4096: 32768, 5120: 16384, 8192: 8192}  # M for each N: the side-by-side run's shapes
# programs per SM up to 16 loop over row blocks; 64 and 256 give each program one block at the widest shapes (a grid
# of M / rows programs, Liger-Kernel's launch at rows = 1)
GRID = {"rows": (1, 2, 4), "num_warps": (2, 4, 8, 16), "programs_per_sm": (1, 2, 4, 8, 16, 64, 256)}
STAGES = {"fwd": (1, 3), "bwd": (1,)}  # the forward's loop pipelined or not (the backward's is not)
TIMING = pick(full={"warmup_ms": 5, "rep_ms": 25, "min_reps": 10, "flush_l2": "read"},
              smoke={"warmup_ms": 0, "rep_ms": 1, "min_reps": 1, "flush_l2": False})
WEIGHTS = ("bf16", "fp32")
PEERS = ("course", "compile", "liger")  # through autograd, as a user calls them (the course's with its tables)


def _timer(graph: bool) -> Callable[[Callable[[], object]], float]:
    """Milliseconds a call takes: back to back in a CUDA graph as the side-by-side run's device time, or by events
    after an L2 flush."""
    if graph:
        return lambda fn: bench.steady_state_time(fn).ms
    return lambda fn: bench.time_fn(fn, **TIMING).ms


def tune_shape(n: int, wname: str, passes: list[str], top: int, copy: float, m: int | None = None,
               stages_by_pass: dict[str, tuple[int, ...]] = STAGES, grid: dict[str, tuple[int, ...]] = GRID,
               graph: bool = False, peers: tuple[str, ...] = PEERS) -> list[dict]:
    """The course's launches and its peers for one row width and weight dtype (``m`` rows, else ``ROWS[n]``; the
    pipeline depths ``stages_by_pass``, the launch grid ``grid``; timed in a CUDA graph with ``graph``; the
    implementations ``peers`` through autograd): every timing a record."""
    time_ms = _timer(graph)
    records = []
    m = m or ROWS[n]
    case = peer_kernels.rms_norm_case(m, n, wname)  # the side-by-side run's inputs and implementations
    x, w = (t.detach() for t in case.leaves)
    y, rstd = R.forward(x, w)
    dy = torch.randn_like(y)
    course = {"fwd": lambda cfg: R.forward(x, w, config=cfg)[0],
              "bwd": lambda cfg: R.backward(dy, x, w, rstd, config=cfg)[0]}
    out_bytes = y.element_size()
    moved = {"fwd": m * n * (2 + out_bytes), "bwd": m * n * (2 + out_bytes + 2)}  # x (and dy) read, y (dx) written
    table = {"fwd": R.forward_config(n, x.dtype), "bwd": R.backward_config(n, x.dtype)}
    best = {}
    for pas in passes:
        reference = course[pas](table[pas])
        timed = []
        for rows, warps, pps, stages in itertools.product(*grid.values(), stages_by_pass[pas]):
            cfg = R.Config(table[pas].block_n, rows, warps, pps, prefetch=False, stages=stages)
            if not torch.allclose(course[pas](cfg).float(), reference.float(), rtol=1e-2, atol=1e-2):
                raise AssertionError(f"{pas} N={n} weight {wname} {cfg}: result differs from the table's launch")
            ms = time_ms(functools.partial(course[pas], cfg))
            timed.append((ms, cfg))
            records.append({"pass": pas, "N": n, "M": m, "weight": wname, "impl": "course", "rows": rows,
                            "num_warps": warps, "programs_per_sm": pps, "stages": stages, "table": cfg == table[pas],
                            "ms": ms, "timing": "graph" if graph else "events",
                            "pct_copy": 100 * moved[pas] / ms / 1e6 / copy})
        timed.sort(key=lambda t: t[0])
        best[pas] = timed[0][0]
        print(f"{pas} {m} x {n}, weight {wname}, the course's launches, fastest first:")
        for ms, cfg in timed[:top]:
            print(f"    rows={cfg.rows} warps={cfg.num_warps:2d} pps={cfg.programs_per_sm:2d} stages={cfg.stages}: "
                  f"{ms * 1e3:7.1f} us, "
                  f"{100 * moved[pas] / ms / 1e6 / copy:5.1f}% of copy")
    torch._dynamo.reset()  # torch.compile afresh for this shape: past its recompile limit it would run eager
    for pas in ("fwd", "fwd+bwd"):
        line = []
        for impl in (i for i in peers if i in case.impls):
            with torch._dynamo.config.patch(**peer_kernels.NO_SILENT_EAGER):
                ms = time_ms(peer_kernels.runner(case, impl, pas))
            label = "course (table)" if impl == "course" else impl  # apart from the launches timed above
            records.append({"pass": pas, "N": n, "M": m, "weight": wname, "impl": label, "ms": ms,
                            "timing": "graph" if graph else "events"})
            line.append(f"{label} {ms * 1e3:.1f} us")
        ours = best.get("fwd") if pas == "fwd" else sum(best.values()) if len(best) == 2 else None
        mine = "" if ours is None else f"; the course's best launch(es) {ours * 1e3:.1f} us"
        print(f"{pas} {m} x {n}, weight {wname}: " + ", ".join(line) + mine)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", type=int, nargs="+", default=list(ROWS), choices=list(ROWS), help="row widths")
    parser.add_argument("--weights", nargs="+", choices=WEIGHTS, default=list(WEIGHTS), help="weight dtypes")
    parser.add_argument("--passes", nargs="+", choices=("fwd", "bwd"), default=["fwd", "bwd"])
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--m", type=int, help="rows (default: the side-by-side run's M for each width)")
    parser.add_argument("--stages", type=int, nargs="+", help="the forward's pipeline depths (default: 1 and 3)")
    for axis in GRID:
        parser.add_argument(f"--{axis.replace('_', '-')}", type=int, nargs="+", help=f"sweep only these {axis}")
    parser.add_argument("--graph", action="store_true",
                        help="time calls back to back in a CUDA graph (the side-by-side run's device time) instead of "
                             "events after an L2 flush")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS),
                        help="implementations timed through autograd beside the launches")
    args = parser.parse_args()
    require_cuda("tuning RMSNorm's launches")
    copy = bench.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:,.0f} GB/s; Liger-Kernel " + ("installed" if peer_kernels.has_liger() else "not here"))
    records = []
    for n, wname in itertools.product(args.ns, args.weights):
        records += tune_shape(n, wname, args.passes, args.top, copy, args.m,
                              {**STAGES, "fwd": tuple(args.stages or STAGES["fwd"])},
                              {axis: tuple(getattr(args, axis) or values) for axis, values in GRID.items()}, args.graph,
                              tuple(args.peers))
    print(f"-> {results.save('rms_norm_tune', records)}")


if __name__ == "__main__":
    main()
