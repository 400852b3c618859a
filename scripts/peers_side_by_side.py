"""The course's kernels against the peers a user would pick instead, side by side in one run
(helpers.studies.peer_kernels).

    python scripts/peers_side_by_side.py [--kernels rms_norm layer_norm swiglu rotary attention nf4_gemv]

Every kernel forward and forward+backward, called from Python and as device time (a CUDA graph), against eager
PyTorch, torch.compile, Liger-Kernel (when installed), cuDNN and flash SDPA, and bitsandbytes. Writes
``results/<gpu>/peer_kernels.json`` (on a CPU, ``.smoke-results/``) and prints each peer's time over the course's.
"""
from __future__ import annotations

import argparse

import pandas as pd
from tqdm.auto import tqdm

import helpers  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers.studies import peer_kernels
from helpers import results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=list(peer_kernels.KERNELS), choices=peer_kernels.KERNELS)
    args = parser.parse_args()
    print(helpers.describe())
    print("Liger-Kernel:", "installed" if peer_kernels.has_liger() else "not available here: its rows are left out")
    bar = tqdm(total=len(args.kernels), desc="kernels")
    records = []
    for kernel in args.kernels:
        records += peer_kernels.run((kernel,), progress=bar.set_postfix_str)
        bar.update()
    bar.close()
    path = results.save("peers", records)
    print(f"{len(records)} records -> {path}")
    failed = [r for r in records if r["status"] != "ok"]
    for r in failed:
        print(f"  not timed: {r['kernel']} {r['impl']} {r['shape']} {r['pass']} {r['timing']}: {r['status']}")
    impls = sorted({r["impl"] for r in records} - {"course"})
    table = pd.DataFrame([row for peer in impls for row in peer_kernels.ratios(records, peer)])
    if len(table):
        table["causal"] = table["causal"].map({True: "causal", False: "not causal"}).fillna("")
        wide = table.pivot_table(index=["kernel", "shape", "dtype", "causal", "pass", "timing"], columns="peer",
                                 values="ratio")
        with pd.option_context("display.width", 200, "display.max_rows", None, "display.max_columns", None):
            print("peer's time / the course's (above 1: the course is faster)")
            print(wide.round(2))


if __name__ == "__main__":
    main()
