"""Exercises of notebook 10 (two GPUs, one chip): predict a part's bandwidth elasticity from its arithmetic
intensity, then combine parts into a whole's share of time that follows bandwidth."""
from __future__ import annotations

from ..studies import bandwidth_elasticity as be
from .checks import NumberCheck


def _measured(name: str) -> tuple[float, str]:
    row = be.compare(name)
    if row.e is None:
        raise RuntimeError(f"{name}: {row.status}")
    return row.e, (f"median e of {name!r} over {len(row.points)} configuration(s) on both GPUs; "
                   f"{row.intensity:,.1f} FLOP/byte")


FUSED = NumberCheck("10.1", "the bandwidth elasticity e of the course's fused bias+GELU+LayerNorm forward (Triton)",
                    lambda: _measured("bias+GELU+LN fwd, triton (nb 04)"), tolerance=0.3, relative=False)

MATMUL = NumberCheck("10.2", "the bandwidth elasticity e of the 8192^3 bf16 matmul",
                     lambda: _measured("matmul 8192^3, bf16 (nb 00)"), tolerance=0.3, relative=False)

STEP = {"matmul": (0.7, 0.0), "element-wise": (1.2, 0.95), "host": (0.1, 0.0)}  # seconds on the H100, e


def _step_share() -> tuple[float, str]:
    share = be.combined(list(STEP.values()))
    terms = " + ".join(f"{t:g} s x {min(max(e, 0), 1):g}" for t, e in STEP.values())
    return share, (f"time-weighted, each e clipped to [0, 1]: ({terms}) / {sum(t for t, _ in STEP.values()):g} s "
                   "(bandwidth_elasticity.combined)")


STEP_SHARE = NumberCheck("10.3", "the share of this step's time that follows bandwidth (0 to 1)", _step_share,
                         tolerance=0.03, relative=False)

CHECKS = (FUSED, MATMUL, STEP_SHARE)
