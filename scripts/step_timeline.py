"""A QLoRA step's launch timeline at the reference batches: the host's issue time, and the record a step can be
replayed from with its kernels scaled to another card (``helpers.finetune.launch_replay``).

    python scripts/step_timeline.py [--train 7b:1 7b:4 7b:16]

The sweep's configuration (eager attention, LoRA r=16, gradient checkpointing, AdamW) at each model:batch: two
warm-up steps, then one under the profiler, its device synchronised at the end. Each record holds the step's wall,
device and host-issue times, wall minus device (the step model's "host" part today) beside them. Every launch, as
[issued, start, duration, part] (``step_model.part_of``), goes beside it (``launch_replay.save_events``). The profiler
adds its own few microseconds to each operator the host runs, so the host's times are upper bounds. Writes
``results/<gpu>/step_timeline.json``. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import gc

import torch

import helpers  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers import results
from helpers.finetune import launch_replay
from helpers.finetune.step_model import part_of
from helpers.finetune.timing import train_step
from helpers.llama.data import TokenizedData, data_file, make_batches
from helpers.llama.lora import LoraSettings, attach_lora
from helpers.llama.models import build_model

MAX_LEN = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", nargs="+", default=["7b:1", "7b:4", "7b:16"], help="model:batch points")
    args = parser.parse_args()
    helpers.require_cuda("recording a step's launch timeline")
    data = TokenizedData.load(data_file())
    records = []
    for point in args.train:
        name, batch = point.split(":")
        rec = point_record(name, int(batch), data)
        records.append(rec)
        print(f"{name} batch {batch}: wall {rec['wall_us'] / 1e3:.1f} ms, device {rec['device_us'] / 1e3:.1f}, host "
              f"issue {rec['host_issue_us'] / 1e3:.1f}, wall - device {(rec['wall_us'] - rec['device_us']) / 1e3:.1f} "
              f"({rec['launch_count']} launches, latency {rec['launch_latency_us']:.1f} us)", flush=True)
        gc.collect()  # the model built for this point goes before the next one's
        torch.cuda.empty_cache()
    path = results.save("step_timeline", [{k: v for k, v in r.items() if k not in launch_replay.EVENTS}
                                           for r in records])
    launch_replay.save_events(path, records)
    print(f"wrote {path} and {launch_replay.events_path(path).name}")


def point_record(name: str, batch: int, data: TokenizedData) -> dict:
    """One point's record: the model built, one step to warm up, then the profiled step's timeline."""
    batches = [{k: v.to(helpers.DEVICE) for k, v in b.items()} for b in make_batches(data.token_ids, batch, 2, MAX_LEN)]
    model, source = build_model(name, helpers.DEVICE, vocab_size=data.vocab_size, attn="eager")
    step = train_step(attach_lora(model, LoraSettings(r=16), gradient_checkpointing=True).train())
    step(batches[0])
    timeline = launch_replay.record(lambda: step(batches[1]))  # a warm-up call on this batch, then the recorded one
    return {"model": name, "batch_size": batch, "padded_len": int(batches[1]["input_ids"].shape[1]), "weights": source,
            **launch_replay.to_record(timeline, name=part_of)}


if __name__ == "__main__":
    main()
