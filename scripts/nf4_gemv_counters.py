"""Hardware counters of the fused nf4 kernel at one row of x (a decode step), read by Nsight Compute.

    python scripts/nf4_gemv_counters.py                        # runs ncu on itself; needs ncu and a GPU
    python scripts/nf4_gemv_counters.py --from-csv saved.csv.gz   # the table again from a saved ncu output

For each Llama-2-7B weight shape the kernel's default launch runs twice (the first compiles it) under
``ncu --clock-control none`` (the GPU's own clocks, as in every other measurement of the course). The
second launch's counters go to ``results/<gpu>/nf4_gemv_counters.json``, ncu's raw output next to it (.csv.gz):
its time, DRAM throughput (share of peak, over the whole kernel), how busy the ALU pipe (integer and logic:
the nibble lookups' ``prmt`` and ``lop3``) and the FMA pipe were (shares of peak over the cycles the SMs were
active), the issue slots used, warps resident and ready per scheduler, registers, a thread's instructions
per weight (warp instructions x 32 / weights), and the three stall reasons that cost its warps most cycles per
issued instruction (``stall_1`` to ``stall_3``, with their cycles). ncu flushes the caches before each measured
pass, so each launch reads its weight from HBM.
"""
from __future__ import annotations

import re
import sys

import torch

from helpers import ncu
from helpers.studies.decoding_ladder import LLAMA_7B_SHAPES, nf4_weights
from helpers.kernels.nf4_format import nf4_operands
from helpers.kernels.nf4_gemv import config_for, nf4_matmul

METRICS = {**ncu.KERNEL_METRICS,  # record field -> ncu metric
           "alu_pipe_pct": "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
           "fma_pipe_pct": "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"}
LAUNCHES = 2  # per shape: the first compiles, the second is kept
# the fused kernels: the one-row and the tile kernel (_nf4_matmul_row_kernel, _nf4_matmul_tile_kernel), and the
# single kernel they were split from (_nf4_matmul_kernel, the name in earlier saved runs)
KERNEL_REGEX = r"_nf4_matmul_(row_|tile_)?kernel"


def launch() -> None:
    """What ncu profiles: every shape's default launch, ``LAUNCHES`` times, in the order of LLAMA_7B_SHAPES."""
    for n, k in LLAMA_7B_SHAPES.values():
        if config_for(1, n, k).split_k > 1:  # its second kernel (the partial sums) would go uncounted
            raise RuntimeError(f"the default launch for ({n}, {k}) splits K; count _sum_splits_kernel too")
        ops = nf4_operands(nf4_weights(n, k, min_bytes=0)[0])
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(LAUNCHES):
            nf4_matmul(x, ops)
    torch.cuda.synchronize()


def parse(text: str) -> list[dict]:
    """ncu's ``--csv --page raw --print-units base`` output -> one record per kept launch: the fields of METRICS
    (the time in microseconds), the shape, instructions per weight."""
    rows = [r for r in ncu.raw_rows(text) if re.search(KERNEL_REGEX, r["Kernel Name"])]
    if len(rows) != LAUNCHES * len(LLAMA_7B_SHAPES):
        raise RuntimeError(f"expected {LAUNCHES * len(LLAMA_7B_SHAPES)} profiled launches, found {len(rows)}")
    records = []
    for i, (label, (n, k)) in enumerate(LLAMA_7B_SHAPES.items()):
        row = rows[LAUNCHES * i + LAUNCHES - 1]
        rec = {"shape": label, "N": n, "K": k}
        for field, metric in METRICS.items():
            rec[field] = ncu.number(row, metric)
        rec["duration_us"] = rec.pop("duration_ns") / 1e3
        rec["instructions_per_weight"] = 32 * rec["warp_instructions"] / (n * k)
        if any(ncu.STALL.match(m) for m in row):  # a run with the stall section (earlier saved runs lack it)
            rec.update(ncu.top_stalls(row))
        records.append(rec)
    return records


def show(records: list[dict]) -> None:
    """One line a shape."""
    for r in records:
        print(f"{r['shape']:34s} {r['duration_us']:6.1f} us  DRAM {r['dram_pct']:4.0f}%  "
              f"ALU pipe {r['alu_pipe_pct']:4.0f}%  "
              f"FMA pipe {r['fma_pipe_pct']:4.0f}%  issue {r['issue_slots_pct']:4.0f}%  warps/scheduler "
              f"{r['warps_per_scheduler']:.1f} ({r['eligible_per_scheduler']:.2f} ready)  "
              f"{r['registers']:.0f} registers  "
              f"{r['instructions_per_weight']:.2f} instructions/weight  stalls: {ncu.stall_text(r)}")


def add_configs(records: list[dict]) -> None:
    """Each record's launch configuration, from the kernel's launch table."""
    for r in records:
        r["config"] = str(config_for(1, r["N"], r["K"]))


if __name__ == "__main__":
    sys.exit(ncu.script_main(__file__, "nf4_gemv_counters", "the nf4 kernel", launch, parse, show, add_configs,
                             metrics=list(METRICS.values()), sections=[ncu.STALL_SECTION], kernel_regex=KERNEL_REGEX))
