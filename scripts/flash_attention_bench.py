"""Race the Triton FlashAttention against naive attention and SDPA's backends on one shape.

    python scripts/flash_attention_bench.py --B 4 --H 32 --S 4096 --D 128
Prints one row per implementation and pass, and the configs the autotuner chose.
"""
from __future__ import annotations

import argparse

import torch

from helpers.studies.attention_designs import IMPLS, measure
from helpers.kernels import flash_attention as fa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--H", type=int, default=32)
    parser.add_argument("--S", type=int, nargs="+", default=[4096])
    parser.add_argument("--D", type=int, nargs="+", default=[128])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--passes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"{'impl':15s} {'pass':8s} {'S':>6s} {'D':>4s} {'causal':6s} {'ms':>8s} {'TFLOP/s':>8s} {'peak MB':>9s}")
    for S in args.S:
        for D in args.D:
            for causal in (False, True):
                for pass_ in args.passes:
                    for impl in args.impls:
                        r = measure(impl, args.B, args.H, S, D, causal, dtype, pass_)
                        ms = f"{r['ms']:8.3f}" if r["ms"] else f"{r['status']:>8s}"
                        tf = f"{r['tflops']:8.1f}" if r["tflops"] else ""
                        mb = f"{r['peak_mem_bytes'] / 2**20:9.1f}" if r["peak_mem_bytes"] is not None else ""
                        print(f"{impl:15s} {pass_:8s} {S:6d} {D:4d} {str(causal):6s} {ms} {tf:>8s} {mb:>9s}")
    for name in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"):
        cache = getattr(getattr(fa, name), "cache", {})
        for key, config in cache.items():
            print(f"{name}: {key} -> {config}")


if __name__ == "__main__":
    main()
