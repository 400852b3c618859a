"""Exercises of notebook 06 (QLoRA on one card): where 40 GB runs out, what checkpointing saves, the nf4 bytes."""
from __future__ import annotations

from .. import results
from ..finetune import analysis
from ..llama import models
from .checks import NumberCheck

MAIN = {"attn": "eager", "lora_r": 16}  # the H200 sweep's main series (notebook 06's MAIN at full scale)


def _main_records() -> tuple[list[dict], str]:
    saved = results.load("finetune", gpu="h200")
    return [r for r in saved.records if not r["point"].endswith("/no-ckpt")], saved.describe()


def _first_oom() -> tuple[float, str]:
    records, where = _main_records()
    runs = analysis.train_runs(records, "13b", 40, **MAIN)
    first = analysis.first_oom(records, "13b", 40, **MAIN)
    tried = ", ".join(f"{r['batch_size']} {r['status']}" + (f" ({r['peak_alloc_gb']:.1f} GB)" if r["status"] == "ok"
                                                           else "") for r in runs)
    if first is None:
        raise RuntimeError("no 13B point ran out of memory under 40 GB in results/h200/finetune.json")
    return float(first), (f"results/h200/finetune.json ({where}), Llama-2 13B, LoRA r=16, texts up to 1,024 tokens, "
                          f"40 GB cap: batch {tried}; the first batch that ran out is {first}")


FIRST_OOM = NumberCheck("06.1", "the first batch size (of 1, 2, 4, 8, 16, 20, 25, 32) at which 13B runs out of "
                        "a 40 GB cap", _first_oom, tolerance=0.5, relative=False, unit="")


def _checkpointing() -> tuple[float, str]:
    saved = results.load("finetune", gpu="h200")
    off = next(r for r in saved.records if r["kind"] == "train" and r["point"].endswith("/no-ckpt"))
    on = next(r for r in analysis.train_runs(saved.records, off["model"], off.get("cap_gb"), **MAIN)
              if r["batch_size"] == off["batch_size"] and not r["point"].endswith("/no-ckpt"))
    return off["peak_alloc_gb"] / on["peak_alloc_gb"], (
        f"results/h200/finetune.json ({saved.describe()}), {off['model']} batch {off['batch_size']}: peak "
        f"{off['peak_alloc_gb']:.1f} GB without gradient checkpointing, {on['peak_alloc_gb']:.1f} GB with it. "
        "Without it every layer keeps its activations for the backward pass; with it only each layer's input")


CHECKPOINTING = NumberCheck("06.2", "how many times more memory 7B batch 4 peaks at with gradient checkpointing off",
                            _checkpointing, tolerance=0.2, relative=True, unit="x")


def _nf4_bytes() -> tuple[float, str]:
    spec = models.MODELS["7b"]
    nbytes = models.nf4_bytes(spec)
    return nbytes / 1e9, (f"models.nf4_bytes: {spec.linear_params() / 1e9:.2f} billion weights in the decoder "
                          "layers' linear projections x 0.5 byte, plus one 8-bit scale per 64 weights and one fp32 "
                          f"per 256 scales = {nbytes / 1e9:.2f} GB (embeddings, norms and lm_head stay in 16 bits)")


NF4_BYTES = NumberCheck("06.3", "GB the nf4 weights of Llama-2-7B's linear layers take", _nf4_bytes,
                        tolerance=0.05, relative=True, unit="GB")

CHECKS = (FIRST_OOM, CHECKPOINTING, NF4_BYTES)
