"""Exercises of notebook 03 (the naive chain): bytes of the eager forward, the speedup they predict, the
slowest kernel on the reference H100."""
from __future__ import annotations

from ..studies import eager_chain
from .. import results
from .checks import NumberCheck

M, N, BF16 = 16384, 4096, 2


def _eager_bytes() -> tuple[float, str]:
    per_kernel = eager_chain.eager_forward_bytes(M, N, BF16)
    total = sum(per_kernel.values())
    parts = ", ".join(f"{op} {b / 1e6:,.1f} MB" for op, b in per_kernel.items())
    return total / 1e6, f"eager_chain.eager_forward_bytes({M}, {N}, 2): {parts}; total {total / 1e6:,.1f} MB"


EAGER_BYTES = NumberCheck("03.1", "MB (1e6 bytes) the eager bf16 forward chain moves at 16384 x 4096",
                          _eager_bytes, tolerance=0.02, relative=True, unit="MB")


def _bytes_speedup() -> tuple[float, str]:
    eager = sum(eager_chain.eager_forward_bytes(M, N, BF16).values())
    fused = eager_chain.fused_forward_bytes(M, N, BF16)
    return eager / fused, (f"eager {eager / 1e6:,.1f} MB / fused {fused / 1e6:,.1f} MB "
                           "(eager_chain.fused_forward_bytes: read x once, write y once, plus the vectors and "
                           "statistics)")


BYTES_SPEEDUP = NumberCheck("03.2", "the forward speedup the bytes predict for one fused kernel (eager / fused bytes)",
                            _bytes_speedup, tolerance=0.05, relative=True, unit="x")

KERNELS = {1: "add", 2: "gelu", 3: "layer_norm"}


def _slowest() -> tuple[float, str]:
    saved = results.reference("naive_chain")
    ops = [r for r in saved.where(what="op", **{"pass": "fwd"})]
    slowest = min(ops, key=lambda r: r["gbps"])
    rates = ", ".join(f"{r['op']} {r['gbps']:,.0f} GB/s" for r in ops)
    number = next(k for k, name in KERNELS.items() if name == slowest["op"])
    return float(number), (f"results/{saved.path.parent.name}/naive_chain.json ({saved.describe()}): {rates} "
                           "against a copy ceiling "
                           f"of {ops[0]['copy_gbps']:,.0f} GB/s; the lowest is {slowest['op']}")


SLOWEST = NumberCheck("03.3", "which forward kernel reached the lowest GB/s on the reference H100: 1 add, 2 gelu, "
                      "3 layer_norm",
                      _slowest, tolerance=0.5, relative=False, choices=KERNELS)

CHECKS = (EAGER_BYTES, BYTES_SPEEDUP, SLOWEST)
