"""Does the way the L2 is flushed before each timed run change what a memory-bound kernel measures?

    python scripts/l2_flush_check.py

``bench.time_fn`` evicts the L2 before every timed run by zero-filling 256 MB, which leaves the L2
full of dirty lines (up to its size: 60 MiB as the H200's driver reports it) that the timed kernel
then has to write back to HBM. A call that moves 268 MB pays for up to 60 MB more; the 2 GiB copy
that sets the ceiling hardly notices. This times the same calls after a zero-fill flush, after a read-only flush (which
leaves clean lines) and with no flush, prints GB/s for each and saves them to ``results/<gpu>/l2_flush.json``.
"""
from __future__ import annotations

import argparse

import torch

from helpers import bench, require_cuda, results
from helpers.kernels import fused_bias_gelu_layernorm as fused

MODES = ("write", "read", False)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    require_cuda("the L2 flush check")
    rows = []
    for nbytes in (2**28, 2**30):  # one fused-kernel-sized copy, the ceiling's copy
        src = torch.randn(nbytes // 4, device="cuda")
        dst = torch.empty_like(src)
        rows.append((f"copy {nbytes >> 20} MiB", 2 * nbytes, lambda src=src, dst=dst: dst.copy_(src)))
    for dtype, m in ((torch.bfloat16, 16384), (torch.float32, 16384)):
        x = torch.randn(m, 4096, device="cuda", dtype=dtype)
        b, w, lb = (torch.randn(4096, device="cuda", dtype=dtype) for _ in range(3))
        moved = 2 * x.numel() * x.element_size()
        rows.append((f"bias only {dtype}", moved, lambda x=x, b=b: torch.add(x, b)))
        rows.append((f"fused forward {dtype}", moved, lambda x=x, b=b, w=w, lb=lb: fused.forward(x, b, w, lb)))
    print(f"{'call':28s} " + " ".join(f"{str(m):>12s}" for m in MODES) + "   GB/s by flush mode")
    records = []
    for name, moved, fn in rows:
        gbps = [bench.time_fn(fn, flush_l2=mode).gbps(moved) for mode in MODES]
        print(f"{name:28s} " + " ".join(f"{g:12,.0f}" for g in gbps))
        records += [{"call": name, "flush": str(mode), "bytes": moved, "gbps": g} for mode, g in zip(MODES, gbps)]
    print("saved", results.save("l2_flush", records))


if __name__ == "__main__":
    main()
