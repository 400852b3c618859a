"""The parts of a QLoRA training step and of a decode step, measured for notebook 06's step-time model.

    python scripts/step_parts.py [--train 7b:1 7b:4 7b:16] [--timed 10] [--decode-model 7b]
                                 [--contexts 64 256 1024 2048] [--graphed-contexts 64 256 1024 2048] [--rounds 5]

Training: the sweep's configuration (eager attention, LoRA r=16, gradient checkpointing) at each model:batch,
``--timed`` steps after 2 of warm-up, then 3 under the profiler, split into parts (``step_model.PARTS``).
Decoding: stock ``generate()`` at batch 1, the time per new token at each context length, split into the
device's and the host's; and the same split for the course's graphed decoder (notebook 07's last rung, on the
model without LoRA, as notebook 07 decodes). Writes ``results/<gpu>/step_parts.json`` (on a CPU,
``.smoke-results/``). A point not measured in this run (a model and batch size, a decoder and context) keeps
the file's earlier record; every record names the commit and the time it was measured at.
"""
from __future__ import annotations

import argparse
import gc

import torch

import helpers  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers.studies import decoding_ladder
from helpers import results
from helpers.finetune import sweep
from helpers.llama.data import TokenizedData
from helpers.finetune.generate import decode_parts
from helpers.llama.lora import LoraSettings, attach_lora
from helpers.llama.models import build_model
from helpers.finetune.step_model import GEMM_CLASSES, measure_train_parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", nargs="*", default=helpers.pick(full=["7b:1", "7b:4", "7b:16"], smoke=["tiny:2"]),
                        help="model:batch points to split (none: skip training)")
    parser.add_argument("--timed", type=int, default=helpers.pick(full=10, smoke=2))
    parser.add_argument("--decode-model", default=helpers.pick(full="7b", smoke="tiny"))
    parser.add_argument("--contexts", nargs="*", type=int,
                        default=helpers.pick(full=[64, 256, 1024, 2048], smoke=[8, 16]))
    parser.add_argument("--graphed-contexts", nargs="*", type=int,
                        default=helpers.pick(full=[64, 256, 1024, 2048], smoke=[8, 16]))
    parser.add_argument("--rounds", type=int, default=helpers.pick(full=5, smoke=1))
    args = parser.parse_args()
    data = TokenizedData.load(sweep.data_file())
    stamp = {k: results.provenance()[k] for k in ("git_commit", "timestamp")}
    records = []
    for point in args.train:
        name, batch = point.split(":")
        r = measure_train_parts(name, int(batch), data, helpers.DEVICE, timed=args.timed)
        print(f"{name} batch {batch}: {r['step_s']:.3f} s a step ({r['step_s_min']:.3f}-{r['step_s_max']:.3f}), "
              + ", ".join(f"{k} {v:.0f}" for k, v in r.items() if k.endswith(" ms")), flush=True)
        print("  matmul GFLOP by data type, counted / from the shapes: " + ", ".join(
            f"{c} {r[f'{c} GFLOP counted']:,.1f} / {r[f'{c} GFLOP from the shapes']:,.1f}" for c in GEMM_CLASSES))
        records.append({**r, **stamp})
        gc.collect()  # the model built for this point goes before the next one's
        torch.cuda.empty_cache() if helpers.HAS_CUDA else None
    if args.contexts:
        model, _ = build_model(args.decode_model, helpers.DEVICE, vocab_size=data.vocab_size, attn="eager")
        model = attach_lora(model, LoraSettings(r=16)).eval()
        prompt = [t for ids in data.token_ids for t in ids][:max(args.contexts)]
        for r in decode_parts(model, prompt, args.contexts, helpers.DEVICE, rounds=args.rounds):
            records.append({"model": args.decode_model, **r, **stamp})
            print(f"decode {args.decode_model}, context {r['context']}: {1e3 * r['s_per_token']:.1f} ms a token "
                  f"({1e3 * r['s_per_token_min']:.1f}-{1e3 * r['s_per_token_max']:.1f}), device "
                  f"{1e3 * r['device_s_per_token']:.1f}, host {1e3 * r['host_s_per_token']:.1f}", flush=True)
    if args.graphed_contexts:
        gc.collect()
        torch.cuda.empty_cache() if helpers.HAS_CUDA else None
        model, _ = build_model(args.decode_model, helpers.DEVICE, vocab_size=data.vocab_size, attn="sdpa")
        for r in decoding_ladder.graphed_decode_parts(model.eval(), args.graphed_contexts, rounds=args.rounds):
            records.append({"model": args.decode_model, **r, **stamp})
            print(f"course decoder {args.decode_model}, context {r['context']}: {1e3 * r['s_per_token']:.2f} ms a "
                  f"token ({1e3 * r['s_per_token_min']:.2f}-{1e3 * r['s_per_token_max']:.2f}), device "
                  f"{1e3 * r['device_s_per_token']:.2f}, host {1e3 * r['host_s_per_token']:.2f}", flush=True)
    measured = {(r["what"], r["model"], r.get("batch_size"), r.get("context")) for r in records}
    kept = earlier_records(measured)
    path = results.save("step_parts", kept + records)
    print(f"wrote {path}" + (f" ({len(kept)} earlier records kept)" if kept else ""))


def earlier_records(measured: set[tuple]) -> list[dict]:
    """The results file's records of the points not re-measured (``(what, model, batch_size, context)`` not in
    ``measured``), each stamped with the commit and time of the run that measured it: a run of 13B points keeps
    7B's."""
    try:
        old = results.load("step_parts", scale=helpers.SCALE)
    except FileNotFoundError:
        return []
    stamp = {k: old.provenance.get(k) for k in ("git_commit", "timestamp")}
    return [{**stamp, **r} for r in old.records
            if (r.get("what"), r.get("model"), r.get("batch_size"), r.get("context")) not in measured]


if __name__ == "__main__":
    main()
