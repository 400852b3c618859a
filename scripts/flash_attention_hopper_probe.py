"""FlashAttention's forward with Hopper's tile loads (``helpers.kernels.flash_attention_hopper``) beside the course's
forward and cuDNN's, in one run on this GPU: does Triton's warp specialisation reach this kernel, and how fast is
each launch config?

    python scripts/flash_attention_hopper_probe.py

At B 4, H 32, S 4,096, D 128, bf16, not causal and causal, each config (tile sizes, warps, pipeline depth, warp
specialisation on or off) is compiled, checked against the course kernel's output (largest absolute difference) and
timed as every course timing is (``bench.time_fn``: CUDA events, a cold L2, the median), beside the course's forward
and cuDNN's in the same run. A config with warp specialisation also records whether it changed the compiled code
(its PTX against the same config's without): Triton may leave a loop as it is. A config Triton cannot compile is
a record too, with the error. Written to ``results/<gpu>/flash_attention_hopper_probe.json``.
"""
from __future__ import annotations

import argparse
import math

import torch

from helpers import bench, require_cuda, results  # first: sets Triton up
from helpers.attention_bench import implementation, make_inputs
from helpers.kernels.flash_attention import LOG2E
from helpers.kernels.flash_attention_hopper import (HopperConfig, _hopper_fwd_kernel, flash_attention_forward_hopper,
                                                    launch_constants)
from triton.runtime.errors import TritonError  # noqa: E402

SHAPE = (4, 32, 4096, 128)  # B, H, S, D: the side-by-side run's and appendix 05a's
# Triton 3.6 warp-specialises this kernel on Hopper with 4 warps, not 8 (compiled for sm_90): both are tried
CONFIGS = [HopperConfig(128, bn, w, st, ws) for bn, w, st in [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2)]
           for ws in (False, True)]
# Triton's own errors (compilation, resources, the interpreter's) and its MLIR passes' failures (RuntimeError)
FAILURES = (TritonError, RuntimeError, ValueError)


def tflops(ms: float, causal: bool) -> float:
    b, h, s, d = SHAPE
    return 4 * b * h * s * s * d / (2 if causal else 1) / (ms * 1e-3) / 1e12


def ptx(config: HopperConfig, causal: bool, q: torch.Tensor) -> str:
    """The config's compiled PTX (compiled, not launched)."""
    b, h, s, d = q.shape
    lse = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
    compiled = _hopper_fwd_kernel.warmup(q, q, q, q, lse, h, 1, s, s, LOG2E / math.sqrt(d), grid=(1,),
                                         **launch_constants(config, causal, s, d))
    return compiled.asm["ptx"]


def specialised(config: HopperConfig, causal: bool, q: torch.Tensor) -> bool | str:
    """Whether warp specialisation changed the compiled code, or why that could not be told."""
    plain = HopperConfig(config.block_m, config.block_n, config.num_warps, config.stages)
    try:
        return ptx(config, causal, q) != ptx(plain, causal, q)
    except Exception as error:  # noqa: BLE001 -- Triton's internal API: record why, keep the timings
        return f"not told: {type(error).__name__}: {str(error).strip().splitlines()[-1][:160]}"


def measure(causal: bool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[dict]:
    """The course's forward, cuDNN's, then every config, for one causality."""
    records = []
    course = implementation("triton")
    with torch.no_grad():
        reference = course(q, k, v, causal)
    peers = {"course": lambda: course(q, k, v, causal), "cudnn": lambda: implementation("sdpa_cudnn")(q, k, v, causal)}
    for name, run in peers.items():
        with torch.no_grad():
            t = bench.time_fn(run)
        records.append({"impl": name, "causal": causal, "status": "ok", "ms": t.ms, "ms_p20": t.ms_p20,
                        "ms_p80": t.ms_p80, "tflops": tflops(t.ms, causal)})
    for config in CONFIGS:
        record = {"impl": "hopper", "causal": causal, **{f: getattr(config, f) for f in config.__dataclass_fields__}}
        try:
            out, _ = flash_attention_forward_hopper(q, k, v, causal, config=config)
            t = bench.time_fn(lambda: flash_attention_forward_hopper(q, k, v, causal, config=config))
        except FAILURES as error:
            record.update(status=f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:200]}")
        else:
            record.update(status="ok", ms=t.ms, ms_p20=t.ms_p20, ms_p80=t.ms_p80, tflops=tflops(t.ms, causal),
                          max_abs_diff=(out.float() - reference.float()).abs().max().item())
            if config.warp_specialize:
                record["warp_specialize_changed_code"] = specialised(config, causal, q)
        records.append(record)
        print(record, flush=True)
    return records


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    require_cuda("the Hopper forward's probe")
    q, k, v, _ = make_inputs(*SHAPE, torch.bfloat16, requires_grad=False)
    records = [r for causal in (False, True) for r in measure(causal, q, k, v)]
    for causal in (False, True):
        rows = [r for r in records if r["causal"] == causal and r["status"] == "ok"]
        peers = {r["impl"]: r for r in rows if r["impl"] != "hopper"}
        line = f"causal={causal}: course {peers['course']['tflops']:.0f}, cuDNN {peers['cudnn']['tflops']:.0f} TFLOP/s"
        best = min((r for r in rows if r["impl"] == "hopper"), key=lambda r: r["ms"], default=None)
        if best:
            speed = peers["cudnn"]["ms"] / best["ms"]
            line += f"; best Hopper config {best['tflops']:.0f} TFLOP/s, {speed:.2f}x cuDNN's speed"
        print(line)
    print(f"saved to {results.save('flash_attention_hopper_probe', records)}")


if __name__ == "__main__":
    main()
