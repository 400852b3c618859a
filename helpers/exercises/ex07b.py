"""Exercise of appendix 07b (the course's kernels beside their peers): the share of the copy bandwidth the
course's RMSNorm forward reaches, read from the side-by-side run's table."""
from __future__ import annotations

from .. import results
from .checks import NumberCheck

M, N = 32768, 4096  # Llama-2-7B's width, 32,768 tokens
SHAPE = f"{M} x {N}, weight bf16"


def _copy_fraction() -> tuple[float, str]:
    peers = results.load("peers", gpu="h200")
    [ms] = [r["ms"] for r in peers.where(kernel="rms_norm", impl="course", shape=SHAPE, timing="device")
            if r["pass"] == "fwd"]
    [copy] = [r["gbps"] for r in results.load("ceilings", gpu="h200").where(what="copy")]
    nbytes = 2 * M * N * 2  # x read once, y written once, bf16; the weight and the statistics are a rounding error
    fraction = nbytes / (ms * 1e-3) / 1e9 / copy
    return fraction, (f"{nbytes / 1e6:.0f} MB (x read, y written, 2 bytes each) in {ms:.3f} ms (device time: the "
                      f"call replayed from a CUDA graph, results/h200/peers.json) is "
                      f"{nbytes / (ms * 1e-3) / 1e9:,.0f} GB/s; over the H200's copy bandwidth as notebook 00 "
                      f"measured it ({copy:,.0f} GB/s, results/h200/ceilings.json): {fraction:.2f}")


COPY_FRACTION = NumberCheck("07b.1", f"the fraction of the H200's copy bandwidth the course's RMSNorm forward reaches "
                            f"at {M:,} x {N:,} bf16 (device time)", _copy_fraction, tolerance=0.03, relative=False)

CHECKS = (COPY_FRACTION,)
