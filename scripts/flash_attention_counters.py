"""Hardware counters of the course's FlashAttention beside cuDNN's, read by Nsight Compute.

    python scripts/flash_attention_counters.py                        # runs ncu on itself; needs ncu and a GPU
    python scripts/flash_attention_counters.py --from-csv saved.csv   # the table again from a saved ncu output

At B 4, H 32, S 4,096, D 128 (bf16), not causal and causal, each implementation's forward and backward run twice
to warm up (the autotuner's choices and cuDNN's plans made), then once more between ``cudaProfilerStart`` and
``cudaProfilerStop`` under ``ncu --clock-control none`` (the GPU's own clocks). Every kernel in that window is
profiled; a marker kernel (``torch.cuda._sleep``) before each pass tells which case and pass a kernel belongs to.
Each kernel's record: its time, how busy the tensor pipe and the transcendental pipe (exp2 and the
other special functions) were (shares of peak over the SMs' active cycles), the SMs' throughput, issue slots used,
warps resident and ready per scheduler, the launch (grid, block, registers, dynamic shared memory), warp
instructions, and the three stall reasons that cost its warps most cycles per issued instruction (``stall_1`` to
``stall_3``, with their cycles). Written to
``results/<gpu>/flash_attention_counters.json``, ncu's raw output beside it (.csv.gz).
"""
from __future__ import annotations

import re
import sys

import torch

from helpers import ncu

SHAPE = (4, 32, 4096, 128)  # B, H, S, D: the side-by-side run's attention shape
IMPLS = {"course": "triton", "cudnn": "sdpa_cudnn"}  # record name -> helpers.studies.attention_designs implementation
CASES = [(impl, causal) for impl in IMPLS for causal in (False, True)]
PASSES = ("fwd", "bwd")
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel
SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "Occupancy", "LaunchStats", ncu.STALL_SECTION]
METRICS = ncu.KERNEL_METRICS  # record field -> ncu metric, requested by name
SECTION_METRICS = {  # record field -> a metric the sections collect (None when this ncu names it otherwise)
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "shared_bytes": "launch__shared_mem_per_block_dynamic",
}
TENSOR_PIPE = re.compile(r"^sm__pipe_\w*tensor\w*_cycles_active\.avg\.pct_of_peak_sustained_active$")
# the transcendental unit (MUFU: exp2, log2, reciprocal), the softmax's pipe, as ComputeWorkloadAnalysis names it
XU_PIPE = re.compile(r"^sm__(inst_executed_)?pipe_xu\w*\.avg\.pct_of_peak_sustained_active$")


def launch() -> None:
    """What ncu profiles: for each case, a marker and the forward, a marker and the backward."""
    from helpers.studies.attention_designs import implementation, make_inputs
    q, k, v, do = make_inputs(*SHAPE, torch.bfloat16)

    def forward(impl: str, causal: bool) -> torch.Tensor:
        q.grad = k.grad = v.grad = None  # no accumulation kernels in the backward
        return implementation(IMPLS[impl])(q, k, v, causal)

    for impl, causal in CASES * 2:  # warm-up
        forward(impl, causal).backward(do)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for impl, causal in CASES:
        torch.cuda._sleep(1)
        out = forward(impl, causal)
        torch.cuda._sleep(1)
        out.backward(do)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def record(row: dict[str, str]) -> dict:
    """One profiled kernel's fields (times in microseconds)."""
    rec = {"kernel": row["Kernel Name"][:80]}
    for field, metric in METRICS.items():
        rec[field] = ncu.number(row, metric)
    for field, metric in SECTION_METRICS.items():
        rec[field] = ncu.number(row, metric) if row.get(metric) else None
    rec["duration_us"] = rec.pop("duration_ns") / 1e3
    tensor = {m: ncu.number(row, m) for m in row if TENSOR_PIPE.match(m) and row[m]}
    rec["tensor_pipe_pct"] = max(tensor.values()) if tensor else None
    rec["tensor_pipe_metric"] = max(tensor, key=tensor.get) if tensor else None
    xu = [ncu.number(row, m) for m in row if XU_PIPE.match(m) and row[m]]
    rec["xu_pipe_pct"] = max(xu) if xu else None
    return {**rec, **ncu.top_stalls(row)}


def parse(text: str) -> list[dict]:
    """ncu's ``--csv --page raw`` output -> one record a kernel of each case's passes, in launch order, labelled
    with its implementation, causality and pass (the marker kernels dropped)."""
    rows = ncu.raw_rows(text)
    marks = [i for i, r in enumerate(rows) if MARKER in r["Kernel Name"]]
    segments = len(CASES) * len(PASSES)
    if len(marks) != segments or (rows and marks[0] != 0):
        raise RuntimeError(f"expected {segments} marker kernels ({MARKER}), the first launch among them; found "
                           f"{len(marks)} in {len(rows)} launches")
    records = []
    for s, (start, end) in enumerate(zip(marks, marks[1:] + [len(rows)])):
        impl, causal = CASES[s // len(PASSES)]
        if end - start < 2:
            raise RuntimeError(f"{impl} {'causal' if causal else 'not causal'} {PASSES[s % 2]}: no kernel profiled")
        for row in rows[start + 1:end]:
            records.append({"impl": impl, "causal": causal, "pass": PASSES[s % len(PASSES)], **record(row)})
    return records


def show(records: list[dict]) -> None:
    """One line a kernel."""
    for r in records:
        tensor = "n/a" if r["tensor_pipe_pct"] is None else f"{r['tensor_pipe_pct']:4.0f}%"
        xu = "n/a" if r["xu_pipe_pct"] is None else f"{r['xu_pipe_pct']:4.0f}%"
        smem = "n/a" if r["shared_bytes"] is None else f"{r['shared_bytes'] / 1024:5.0f} KiB"
        print(f"{r['impl']:6s} {'causal' if r['causal'] else 'full':6s} {r['pass']:3s} {r['kernel'][:40]:40s} "
              f"{r['duration_us']:8.1f} us  tensor {tensor}  exp2 pipe {xu}  issue {r['issue_slots_pct']:4.0f}%  "
              f"warps/scheduler {r['warps_per_scheduler']:.1f} ({r['eligible_per_scheduler']:.2f} ready)  "
              f"grid {r['grid']:.0f} x {r['block']:.0f}  {r['registers']:.0f} registers  {smem}  "
              f"stalls: {ncu.stall_text(r)}")


if __name__ == "__main__":
    sys.exit(ncu.script_main(__file__, "flash_attention_counters", "FlashAttention beside cuDNN's", launch, parse, show,
                             metrics=list(METRICS.values()), sections=SECTIONS, from_start=False))
