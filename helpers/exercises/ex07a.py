"""Exercise of appendix 07a (inside the tuned nf4 kernel): the bytes a weight costs, what its bandwidth
budget is counted in."""
from __future__ import annotations

from ..studies.decoding_ladder import nf4_gemv_bytes
from .checks import NumberCheck

N = K = 4096  # a Llama-2-7B attention projection


def _bytes_per_weight() -> tuple[float, str]:
    per_weight = nf4_gemv_bytes(N, K) / (N * K)
    return per_weight, (f"decoding_ladder.nf4_gemv_bytes({N}, {K}) / ({N} x {K}): half a byte of code, one 1-byte "
                        f"scale code per 64 weights, one fp32 scale per 256 of those blocks, and x and y "
                        f"(negligible at one row): {per_weight:.4f} bytes a weight")


BYTES_PER_WEIGHT = NumberCheck("07a.1", "the bytes a weight costs the nf4 matrix-vector kernel at one row of x, "
                               "for a 4,096 x 4,096 weight with nested scales", _bytes_per_weight,
                               tolerance=0.02, relative=True, unit="bytes")

CHECKS = (BYTES_PER_WEIGHT,)
