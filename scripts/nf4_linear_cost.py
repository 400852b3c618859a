"""What one nf4 linear layer of the QLoRA step costs, bitsandbytes' ``Linear4bit`` against the course's
(``patching.use_course_nf4``): the device time of dequantising a Llama-2-7B weight (4096 x 11008), and the
host time of a forward + backward, measured on a small layer so that the GPU never sets the pace.

    python scripts/nf4_linear_cost.py [--calls 300]
"""
from __future__ import annotations

import argparse
import time

import torch

import helpers  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers import bench, require_cuda
from helpers.llama.models import random_nf4_linear
from helpers.kernels.nf4_dequant import nf4_dequantize
from helpers.kernels.nf4_format import nf4_operands
from helpers.llama.patching import use_course_nf4


def host_us(layer: torch.nn.Module, x: torch.Tensor, calls: int) -> float:
    """Microseconds of host time per forward + backward (the device synchronised only at the end)."""
    def step() -> None:
        layer(x).sum().backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    require_cuda("timing the nf4 layers")
    import bitsandbytes.functional as BF

    gen = torch.Generator(helpers.DEVICE).manual_seed(0)
    big = random_nf4_linear(4096, 11008, helpers.DEVICE, 0.02, gen)
    ops = nf4_operands(big.weight)
    for name, fn in (("bitsandbytes dequantize_4bit", lambda: BF.dequantize_4bit(big.weight, big.weight.quant_state)),
                     ("course nf4_dequantize", lambda: nf4_dequantize(ops))):
        t = bench.time_fn(fn)
        print(f"{name:30s} 4096 x 11008: {t.ms * 1e3:6.1f} us, {ops.n * ops.k * 2.516 / t.ms / 1e6:,.0f} GB/s")
    x = torch.randn(64, 256, device=helpers.DEVICE, requires_grad=True)
    for variant in ("stock", "course"):
        layer = torch.nn.Sequential(random_nf4_linear(256, 256, helpers.DEVICE, 0.02, gen))
        if variant == "course":
            use_course_nf4(layer)
        print(f"{variant:7s} Linear4bit 64 x 256 -> 256, forward + backward: {host_us(layer, x, args.calls):6.1f} us "
              "of host time a call")


if __name__ == "__main__":
    main()
