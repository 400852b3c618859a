"""The DRAM bytes each part of a QLoRA training step moves, read by Nsight Compute: the step model's bytes measured.

    python scripts/step_part_bytes.py                        # runs ncu on itself; needs ncu and a GPU
    python scripts/step_part_bytes.py --from-csv saved.csv   # the table again from a saved ncu output

The sweep's configuration (7B, eager attention, LoRA r=16, gradient checkpointing, AdamW) trains two warm-up steps
at each reference batch (``POINTS``), then one more between ``cudaProfilerStart`` and ``cudaProfilerStop`` under
``ncu --clock-control none --cache-control none`` (the GPU's clocks, and the L2 as the step left it: a kernel that
re-reads what the one before wrote is not charged DRAM bytes it would not move). A marker kernel
(``torch.cuda._sleep``) starts each point. Every kernel is put in its part (``step_model.part_of``); each record
sums one kernel name's launches at one point: calls, time under ncu (kernels run one at a time there), DRAM bytes
read and written. ``step_model.measured_bytes`` turns them into bytes per part, set against the step model's counts.
Written to ``results/<gpu>/step_part_bytes.json``, ncu's raw output beside it (.csv).
"""
from __future__ import annotations

import sys

import torch

from helpers import ncu

MODEL = "7b"
POINTS = (1, 4, 16)  # batch sizes: step_parts.py's reference batches
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel
METRICS = {"duration_ns": "gpu__time_duration.sum", "dram_read": "dram__bytes_read.sum",
           "dram_write": "dram__bytes_write.sum"}


def launch() -> None:
    """What ncu profiles: at each batch, a marker kernel, then one training step."""
    import helpers
    from helpers.finetune.timing import train_step
    from helpers.llama.data import TokenizedData, data_file, make_batches
    from helpers.llama.lora import LoraSettings, attach_lora
    from helpers.llama.models import build_model

    data = TokenizedData.load(data_file())
    model, _ = build_model(MODEL, helpers.DEVICE, vocab_size=data.vocab_size, attn="eager")
    model = attach_lora(model, LoraSettings(r=16), gradient_checkpointing=True).train()
    step = train_step(model)
    for batch in POINTS:
        batches = [{k: v.to(helpers.DEVICE) for k, v in b.items()}
                   for b in make_batches(data.token_ids, batch, 3, max_len=1024)]
        for b in batches[:2]:
            step(b)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        torch.cuda._sleep(1)
        step(batches[2])
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"batch {batch}: padded to {batches[2]['input_ids'].shape[1]} tokens", flush=True)


def parse(text: str) -> list[dict]:
    """ncu's ``--csv --page raw`` output -> one record per point and kernel name (its launches summed), in order of
    first launch."""
    from helpers.finetune.step_model import part_of

    rows = ncu.raw_rows(text)
    marks = [i for i, r in enumerate(rows) if MARKER in r["Kernel Name"]]
    if len(marks) != len(POINTS) or (rows and marks[0] != 0):
        raise RuntimeError(f"expected {len(POINTS)} marker kernels ({MARKER}), the first launch among them; found "
                           f"{len(marks)} in {len(rows)} launches")
    records = []
    for batch, start, end in zip(POINTS, marks, marks[1:] + [len(rows)]):
        by_name: dict[str, dict] = {}
        for row in rows[start + 1:end]:
            name = row["Kernel Name"][:120]
            rec = by_name.setdefault(name, {"model": MODEL, "batch_size": batch, "part": part_of(name),
                                            "kernel": name, "calls": 0, "duration_ns": 0.0, "dram_read": 0.0,
                                            "dram_write": 0.0})
            rec["calls"] += 1
            for field, metric in METRICS.items():
                rec[field] += ncu.number(row, metric)
        if not by_name:
            raise RuntimeError(f"batch {batch}: no kernel profiled")
        records += by_name.values()
    return records


def padded_lengths(records: list[dict]) -> None:
    """Each record's ``padded_len``: the length the profiled batch was padded to (the batches are seeded)."""
    from helpers.llama.data import TokenizedData, data_file, make_batches

    data = TokenizedData.load(data_file())
    length = {b: make_batches(data.token_ids, b, 3, max_len=1024)[2]["input_ids"].shape[1] for b in POINTS}
    for r in records:
        r["padded_len"] = int(length[r["batch_size"]])


def show(records: list[dict]) -> None:
    """Each point's parts: launches, DRAM bytes, time under ncu and the bandwidth that makes; beside the bytes,
    the step model's count (``step_model.work``) where the records know the padded length."""
    from helpers.finetune.step_model import PARTS, measured_bytes, work
    from helpers.llama.models import MODELS

    for batch in POINTS:
        point = [r for r in records if r["batch_size"] == batch]
        counted = work(MODELS[MODEL], batch, point[0]["padded_len"]) if "padded_len" in point[0] else {}
        print(f"{MODEL} batch {batch}: part          launches  DRAM GB  counted GB  ms (ncu)   GB/s")
        for part, m in measured_bytes(point).items():
            count = f"{counted[part] / 1e9:10.2f}" if counted and PARTS[part] == "bandwidth" else f"{'':10s}"
            print(f"  {part:22s} {m['calls']:8d} {m['bytes'] / 1e9:8.2f} {count} {m['ms']:9.2f} {m['gbps']:6.0f}")


if __name__ == "__main__":
    sys.exit(ncu.script_main(__file__, "step_part_bytes", "a QLoRA step's parts", launch, parse, show, padded_lengths,
                             metrics=list(METRICS.values()), from_start=False, cache_control="none"))
