"""One measurement of the sweep, meant to run in a process of its own:

    python -m helpers.finetune.sweep_point --spec '{"kind": "train", "model": "7b", ...}' --data D --out O

A ``train`` point builds the model, attaches LoRA, runs warm-up and timed training steps and
measures step time, tokens/s, peak memory and (on a GPU) utilisation; a ``generate`` point times
``generate()`` at batch 1 with the adapter attached. Both write their records to ``--out``. Running
out of memory is a result: the point records ``status: "oom"`` and exits normally. What a point
measures: ``spec.PointSpec``; its memory cap (applied on a GPU, simulated without one): ``memory_caps``;
the timed training steps: ``timing``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

from ..children import die_with_parent
from ..llama.data import TokenizedData, make_batches
from .generate import run_generate
from ..llama.lora import LoraSettings, attach_lora, check_checkpointing
from ..llama.memory_caps import GiB, SimulatedMemory, apply_cap, is_oom, peak_memory
from ..llama.models import build_model, model_bytes
from .point_spec import PointSpec, base_record
from .timing import run_timed_steps


def run_train(spec: PointSpec, data: TokenizedData, device: torch.device) -> list[dict]:
    """Build, attach LoRA, train ``warmup_steps + timed_steps`` steps; one record, "ok" or "oom"."""
    record = {"kind": "train", **base_record(spec, device), "batch_size": spec.batch_size}
    batches = make_batches(data.token_ids, spec.batch_size, spec.warmup_steps + spec.timed_steps, spec.max_len)
    timed = batches[spec.warmup_steps:]
    record.update(max_seq_len=max(b["input_ids"].shape[1] for b in batches),
                  mean_seq_len=statistics.fmean(float(b["attention_mask"].sum(1).float().mean()) for b in timed),
                  mean_padded_len=statistics.fmean(b["input_ids"].shape[1] for b in timed))
    if device.type == "cuda":
        record.update(apply_cap(spec.cap_gb))
        torch.cuda.reset_peak_memory_stats()
    stage = "build"
    meter = None
    try:
        model, source = build_model(spec.model, device, vocab_size=data.vocab_size, attn=spec.attn)
        model = attach_lora(model, LoraSettings(r=spec.lora_r), gradient_checkpointing=spec.grad_ckpt)
        record["weights"] = source
        stage = "train"
        record["checkpointing"] = check_checkpointing(model, batches[0]["input_ids"][:1, :16].to(device))
        if device.type == "cpu":
            limit = None if spec.cap_gb is None else int(spec.cap_gb * GiB)
            meter = SimulatedMemory(model_bytes(model), limit)
        times, monitor_summary, losses = run_timed_steps(model, batches, device, spec.warmup_steps, meter)
    except Exception as error:
        if not is_oom(error):
            raise
        record.update(status="oom", oom_stage=stage, oom_message=str(error).splitlines()[0][:200],
                      **peak_memory(device, meter))
        return [record]
    real_tokens = sum(int(b["attention_mask"].sum()) for b in timed)
    record.update(status="ok", step_s=statistics.median(times), tokens_per_s=real_tokens / sum(times),
                  samples_per_s=spec.batch_size * len(times) / sum(times), loss=losses[-1],
                  gpu_util_pct=monitor_summary.get("util_pct_mean"), mem_pct=monitor_summary.get("mem_pct_max"),
                  **peak_memory(device, meter))
    return [record]


def run_point(spec: PointSpec, data_path: Path) -> list[dict]:
    """Run one point in this process (on the GPU when there is one)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    card = torch.cuda.get_device_properties(0).total_memory / GiB if device.type == "cuda" else None
    spec.validate(card)
    data = TokenizedData.load(data_path)
    if spec.kind == "generate":
        return run_generate(spec, data, device)
    return run_train(spec, data, device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="the point as JSON (PointSpec fields)")
    parser.add_argument("--data", required=True, type=Path, help="tokenized data written by data.prepare().save()")
    parser.add_argument("--out", required=True, type=Path, help="where to write the records (JSON list)")
    args = parser.parse_args(argv)
    die_with_parent()  # a sweep killed outright takes its point with it
    records = run_point(PointSpec.from_json(args.spec), args.data)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(records))
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
