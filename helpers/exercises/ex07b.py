"""Exercise of appendix 07b (the course's kernels beside their peers): the share of the copy bandwidth the
course's RMSNorm forward reaches, read from the side-by-side run's table."""
from __future__ import annotations

from .. import results
from .checks import NumberCheck

M, N = 32768, 4096  # Llama-2-7B's width, 32,768 tokens
SHAPE = f"{M} x {N}, weight bf16"


def _copy_percent() -> tuple[float, str]:
    peers, gpu = results.load("peers", gpu=results.REFERENCE_GPU), results.REFERENCE_GPU
    [ms] = [r["ms"] for r in peers.where(kernel="rms_norm", impl="course", shape=SHAPE, timing="device")
            if r["pass"] == "fwd"]
    [copy] = [r["gbps"] for r in results.load("ceilings", gpu=gpu).where(what="copy")]
    nbytes = 2 * M * N * 2  # x read once, y written once, bf16; the weight and the statistics are a rounding error
    percent = 100 * nbytes / (ms * 1e-3) / 1e9 / copy
    return percent, (f"{nbytes / 1e6:.0f} MB (x read, y written, 2 bytes each) in {ms:.3f} ms (device time: the "
                      f"call replayed from a CUDA graph, results/{gpu}/peers.json) is "
                      f"{nbytes / (ms * 1e-3) / 1e9:,.0f} GB/s; over the {peers.provenance['gpu']}'s copy bandwidth "
                      f"as notebook 00 measured it ({copy:,.0f} GB/s, results/{gpu}/ceilings.json): {percent:.1f}%")


COPY_PERCENT = NumberCheck("07b.1", "the percentage of the reference H100's copy bandwidth the course's RMSNorm "
                           f"forward reaches at {M:,} x {N:,} bf16 (device time)", _copy_percent, tolerance=3.0,
                           relative=False)

CHECKS = (COPY_PERCENT,)
