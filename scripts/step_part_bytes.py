"""The DRAM bytes each part of a QLoRA training step moves per decoder layer, read by Nsight Compute: the step model's
bytes measured.

    python scripts/step_part_bytes.py                        # runs ncu on itself; needs ncu and a GPU
    python scripts/step_part_bytes.py --from-csv saved.csv.gz  # the table again from a saved ncu output

Llama-2-7B's layer (its widths, random nf4 weights: the bytes do not depend on the values) in the sweep's
configuration (eager attention, LoRA r=16, gradient checkpointing, AdamW), built with one and with two decoder layers
(``LAYERS``): the two steps differ by exactly one layer's kernels, so their difference is one layer's bytes, without
the embedding, the lm_head and the loss, and a step under ncu launches a few hundred kernels instead of a 32-layer
model's thousands. At each reference batch (``POINTS``) two warm-up steps, then one between ``cudaProfilerStart`` and
``cudaProfilerStop`` under ``ncu --clock-control none --cache-control none`` (the GPU's clocks, and the L2 as the step
left it: a kernel that re-reads what the one before wrote is not charged DRAM bytes it would not move). A marker
kernel (``torch.cuda._sleep``) starts each step. Every kernel is put in its part (``step_model.part_of``); a record
sums one kernel name's launches in one step: calls, time under ncu (kernels run one at a time there), DRAM bytes read
and written. ``step_model.layer_bytes`` turns them into one layer's bytes per part. Written to
``results/<gpu>/step_part_bytes.json``, ncu's raw output beside it (.csv.gz).
"""
from __future__ import annotations

import dataclasses
import sys

import torch

from helpers import ncu

MODEL = "7b"
LAYERS = (1, 2)  # decoder layers of the two models profiled: their difference is one layer
POINTS = (1, 4, 16)  # batch sizes: step_parts.py's reference batches
STEPS = [(layers, batch) for layers in LAYERS for batch in POINTS]  # in the order they are profiled
MAX_LEN = 1024
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel
METRICS = {"duration_ns": "gpu__time_duration.sum", "dram_read": "dram__bytes_read.sum",
           "dram_write": "dram__bytes_write.sum"}


def _batches(batch: int) -> list[dict]:
    """The three batches of a point (two warm-up, one profiled): the sweep's seeded batches."""
    from helpers.llama.data import TokenizedData, data_file, make_batches

    return make_batches(TokenizedData.load(data_file()).token_ids, batch, 3, max_len=MAX_LEN)


def launch() -> None:
    """What ncu profiles: for each model and batch, a marker kernel, then one training step."""
    import helpers
    from helpers.finetune.timing import train_step
    from helpers.llama.data import TokenizedData, data_file
    from helpers.llama.lora import LoraSettings, attach_lora
    from helpers.llama.models import build_random, spec_for

    vocab = TokenizedData.load(data_file()).vocab_size
    for layers in LAYERS:
        spec = dataclasses.replace(spec_for(MODEL, vocab), num_hidden_layers=layers)
        model = build_random(spec, helpers.DEVICE, attn="eager")
        model = attach_lora(model, LoraSettings(r=16), gradient_checkpointing=True).train()
        step = train_step(model)
        for batch in POINTS:
            batches = [{k: v.to(helpers.DEVICE) for k, v in b.items()} for b in _batches(batch)]
            for b in batches[:2]:
                step(b)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            torch.cuda._sleep(1)
            step(batches[2])
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
        del model, step
        torch.cuda.empty_cache()


def parse(text: str) -> list[dict]:
    """ncu's ``--csv --page raw`` output -> one record per step (``STEPS``) and kernel name (its launches summed), in
    order of first launch."""
    from helpers.finetune.step_model import part_of

    rows = ncu.raw_rows(text)
    marks = [i for i, r in enumerate(rows) if MARKER in r["Kernel Name"]]
    if len(marks) != len(STEPS) or (rows and marks[0] != 0):
        raise RuntimeError(f"expected {len(STEPS)} marker kernels ({MARKER}), the first launch among them; found "
                           f"{len(marks)} in {len(rows)} launches")
    records = []
    for (layers, batch), start, end in zip(STEPS, marks, marks[1:] + [len(rows)]):
        by_name: dict[str, dict] = {}
        for row in rows[start + 1:end]:
            name = row["Kernel Name"][:120]
            rec = by_name.setdefault(name, {"model": MODEL, "layers": layers, "batch_size": batch,
                                            "part": part_of(name), "kernel": name, "calls": 0, "duration_ns": 0.0,
                                            "dram_read": 0.0, "dram_write": 0.0})
            rec["calls"] += 1
            for field, metric in METRICS.items():
                rec[field] += ncu.number(row, metric)
        if not by_name:
            raise RuntimeError(f"{layers} layers, batch {batch}: no kernel profiled")
        records += by_name.values()
    return records


def padded_lengths(records: list[dict]) -> None:
    """Each record's ``padded_len``: the length the profiled batch was padded to (the batches are seeded)."""
    length = {b: int(_batches(b)[2]["input_ids"].shape[1]) for b in POINTS}
    for r in records:
        r["padded_len"] = length[r["batch_size"]]


def show(records: list[dict]) -> None:
    """One layer's parts at each batch: launches, DRAM bytes, the step model's count where the records know the
    padded length (``step_model.work``, a layer's share), time under ncu and the bandwidth that makes."""
    from helpers.finetune.step_model import PARTS, layer_bytes, work
    from helpers.llama.models import MODELS

    spec = MODELS[MODEL]
    for batch in POINTS:
        point = [r for r in records if r["batch_size"] == batch]
        counted = work(spec, batch, point[0]["padded_len"]) if "padded_len" in point[0] else {}
        print(f"{MODEL}, one layer, batch {batch}: part   launches  DRAM MB  counted MB  ms (ncu)   GB/s")
        for part, m in layer_bytes(point).items():
            count = (f"{counted[part] / spec.num_hidden_layers / 1e6:10.1f}" if counted and PARTS[part] == "bandwidth"
                     else f"{'':10s}")
            print(f"  {part:22s} {m['calls']:8d} {m['bytes'] / 1e6:8.1f} {count} {m['ms']:9.3f} {m['gbps']:6.0f}")


if __name__ == "__main__":
    sys.exit(ncu.script_main(__file__, "step_part_bytes", "a QLoRA step's parts", launch, parse, show, padded_lengths,
                             metrics=list(METRICS.values()), from_start=False, cache_control="none"))
