"""Exercise of appendix 04b (timing and tuning): the bytes one fused forward must move, which every % of copy
in notebook 04 divides by."""
from __future__ import annotations

from ..studies import eager_chain
from .checks import NumberCheck

ELEMS, N = 1 << 26, 4096  # notebook 04's full-scale input: 64M bf16 elements in rows of 4,096


def _forward_bytes() -> tuple[float, str]:
    m = ELEMS // N
    mb = eager_chain.fused_forward_bytes(m, N, 2) / 1e6
    return mb, (f"eager_chain.fused_forward_bytes({m}, {N}, 2 bytes): x read once and y written once "
                f"(2 x {ELEMS:,} elements x 2 bytes), plus the three vectors of {N} and the per-row statistics: "
                f"{mb:,.1f} MB")


FORWARD_BYTES = NumberCheck("04b.1", "the MB (10^6 bytes) one fused forward moves for 64M bf16 elements in rows of "
                            "4,096 (x read, y written, the bias, weight and LayerNorm bias read)",
                            _forward_bytes, tolerance=0.05, relative=True, unit="MB")

CHECKS = (FORWARD_BYTES,)
