"""FlashAttention's forward with Hopper's tile loads (``helpers.kernels.candidates.flash_attention_hopper``)
beside the course's forward and cuDNN's, in one run on this GPU: does Triton's warp specialisation reach this
kernel, and how fast is each launch config?

    python scripts/flash_attention_hopper_probe.py [--child-timeout-s 120]

At B 4, H 32, S 4,096, D 128, bf16, not causal and causal, each config (tile sizes, warps, pipeline depth, warp
specialisation on or off) is compiled, checked against the course kernel's output (largest absolute difference) and
timed as every course timing is (``bench.time_fn``: CUDA events, a cold L2, the median), beside the course's forward
and cuDNN's in the same run. A config Triton cannot compile is a record too, with the error.

Warp specialisation: the wrapper asks Triton for it only where the kernel has no masked loop (not causal, the keys
in whole tiles); elsewhere such a config is recorded as not asked. Each config that asks is first compiled without
launching, and its PTX compared with the same config's without specialisation (Triton may leave a loop as it is).
Unchanged code is recorded as such and not timed twice. Changed code is launched in a child process with a time
limit: a warp-specialised launch that did not finish (a deadlock between the producer and consumer warps) must not
stop the run, and is recorded as not finished. Written to ``results/<gpu>/flash_attention_hopper_probe.json`` after
each config, so that a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
from typing import Callable

import torch

from helpers import bench, require_cuda, results  # first: sets Triton up
from helpers.studies.attention_designs import implementation, make_inputs
from helpers.kernels.flash_attention import LOG2E
from helpers.kernels.candidates.flash_attention_hopper import (HopperConfig, _hopper_fwd_kernel,
                                                               flash_attention_forward_hopper, launch_constants)
from triton.runtime.errors import TritonError  # noqa: E402

SHAPE = (4, 32, 4096, 128)  # B, H, S, D: the side-by-side run's and appendix 05a's
# Triton 3.6 warp-specialises this kernel on Hopper with 4 warps, not 8 (compiled for sm_90): both are tried
CONFIGS = [HopperConfig(128, bn, w, st, ws) for bn, w, st in [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2)]
           for ws in (False, True)]
# Triton's own errors (compilation, resources, the interpreter's) and its MLIR passes' failures (RuntimeError)
FAILURES = (TritonError, RuntimeError, ValueError)
TOPIC = "flash_attention_hopper_probe"
SEED = 0  # the parent and each child draw the same inputs
CHILD_TIMEOUT_S = 120.0


def tflops(ms: float, causal: bool) -> float:
    b, h, s, d = SHAPE
    return 4 * b * h * s * s * d / (2 if causal else 1) / (ms * 1e-3) / 1e12


def inputs(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(SEED)
    q, k, v, _ = make_inputs(*shape, dtype, requires_grad=False)
    return q, k, v


def ptx(config: HopperConfig, causal: bool, q: torch.Tensor) -> str:
    """The config's compiled PTX (compiled, not launched)."""
    b, h, s, d = q.shape
    lse = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
    compiled = _hopper_fwd_kernel.warmup(q, q, q, q, lse, h, 1, s, s, LOG2E / math.sqrt(d), grid=(1,),
                                         **launch_constants(config, causal, s, d))
    return compiled.asm["ptx"]


def config_record(config: HopperConfig, causal: bool, **fields) -> dict:
    """A record naming ``config`` and the causality, with ``fields``."""
    return {"impl": "hopper", "causal": causal, **dataclasses.asdict(config), **fields}


def time_config(config: HopperConfig, causal: bool, q, k, v, reference: torch.Tensor) -> dict:
    """One config's record: its time and largest difference from ``reference``, or the error that stopped it."""
    record = config_record(config, causal)
    try:
        out, _ = flash_attention_forward_hopper(q, k, v, causal, config=config)
        t = bench.time_fn(lambda: flash_attention_forward_hopper(q, k, v, causal, config=config))
    except FAILURES as error:
        return {**record, "status": f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:200]}"}
    return {**record, "status": "ok", "ms": t.ms, "ms_p20": t.ms_p20, "ms_p80": t.ms_p80,
            "tflops": tflops(t.ms, causal), "max_abs_diff": (out.float() - reference.float()).abs().max().item()}


def in_child(config: HopperConfig, causal: bool, q: torch.Tensor, timeout_s: float) -> dict:
    """:func:`time_config` in a child process (this script with ``--one``) on inputs of ``q``'s shape and dtype
    drawn there, killed after ``timeout_s``."""
    record = config_record(config, causal)
    spec = {"causal": causal, "shape": list(q.shape), "dtype": str(q.dtype).removeprefix("torch."),
            **dataclasses.asdict(config)}
    cmd = [sys.executable, __file__, "--one", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**record, "status": f"not finished in {timeout_s:.0f} s (compile, launch and timing; killed)"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**record, "status": f"child failed (exit {proc.returncode}): {tail[0][:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(causal: bool, q, k, v, timeout_s: float = CHILD_TIMEOUT_S,
            keep: Callable[[list[dict]], object] = lambda records: None) -> list[dict]:
    """The course's forward, cuDNN's, then every config, for one causality; ``keep`` gets the records so far after
    each config (a run cut short keeps what it measured)."""
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
        if not config.warp_specialize:
            record = time_config(config, causal, q, k, v, reference)
        elif not launch_constants(config, causal, k.shape[2], q.shape[-1])["WARP_SPECIALIZE"]:
            record = config_record(config, causal,
                                   status="not asked of Triton: the kernel has a masked loop (see launch_constants)")
        else:
            plain = dataclasses.replace(config, warp_specialize=False)
            try:
                changed = ptx(config, causal, q) != ptx(plain, causal, q)
            except Exception as error:  # noqa: BLE001 -- Triton's internal API (none in the interpreter)
                changed = f"not told: {type(error).__name__}: {str(error).strip().splitlines()[-1][:160]}"
            if changed is False:
                record = config_record(config, causal,
                                       status="same code as without warp specialisation: not timed again")
            else:
                record = in_child(config, causal, q, timeout_s)
            record["warp_specialize_changed_code"] = changed
        records.append(record)
        keep(records)
        print(record, flush=True)
    return records


def one(spec: str) -> None:
    """The child: one config timed, its record printed as JSON on the last line."""
    fields = json.loads(spec)
    causal, shape, dtype = fields.pop("causal"), fields.pop("shape"), getattr(torch, fields.pop("dtype"))
    q, k, v = inputs(tuple(shape), dtype)
    with torch.no_grad():
        reference = implementation("triton")(q, k, v, causal)
    print(json.dumps(time_config(HopperConfig(**fields), causal, q, k, v, reference)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child-timeout-s", type=float, default=CHILD_TIMEOUT_S,
                        help="time limit of a warp-specialised config's child process")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's config, as JSON
    args = parser.parse_args()
    if args.one:  # a child: on a machine without a GPU, the tests' (the interpreter at a small shape)
        return one(args.one)
    require_cuda("the Hopper forward's probe")
    q, k, v = inputs(SHAPE, torch.bfloat16)
    records: list[dict] = []
    for causal in (False, True):
        records += measure(causal, q, k, v, args.child_timeout_s,
                           keep=lambda rs, before=list(records): results.save(TOPIC, before + rs))
    for causal in (False, True):
        rows = [r for r in records if r["causal"] == causal and r["status"] == "ok"]
        peers = {r["impl"]: r for r in rows if r["impl"] != "hopper"}
        line = f"causal={causal}: course {peers['course']['tflops']:.0f}, cuDNN {peers['cudnn']['tflops']:.0f} TFLOP/s"
        best = min((r for r in rows if r["impl"] == "hopper"), key=lambda r: r["ms"], default=None)
        if best:
            speed = peers["cudnn"]["ms"] / best["ms"]
            line += f"; best Hopper config {best['tflops']:.0f} TFLOP/s, {speed:.2f}x cuDNN's speed"
        print(line)
    print(f"saved to {results.path_for(TOPIC)}")


if __name__ == "__main__":
    main()
