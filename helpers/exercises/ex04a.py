"""Exercise of appendix 04a (GELU's numerics): the spacing of bf16 numbers, the yardstick of every tolerance."""
from __future__ import annotations

import torch

from .checks import NumberCheck


def _bf16_ulp_at_one() -> tuple[float, str]:
    ulp = torch.finfo(torch.bfloat16).eps
    return ulp, (f"bf16 keeps 8 bits of significand (7 stored, 1 implied), so the next number above 1.0 is "
                 f"1 + 2^-7: one ulp at 1.0 is {ulp:g} (torch.finfo(torch.bfloat16).eps); fp32's is 2^-23")


BF16_ULP = NumberCheck("04a.1", "the gap between 1.0 and the next bf16 number above it (one ulp at 1.0)",
                       _bf16_ulp_at_one, tolerance=0.05, relative=True)

CHECKS = (BF16_ULP,)
