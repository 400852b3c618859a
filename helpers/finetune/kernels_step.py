"""The QLoRA training step with the course's kernels against the stock step (notebook 07, part 2).

Both variants build the same nf4 model (same seed), attach the same LoRA adapters with gradient
checkpointing and train on the same batches; "stock" runs transformers' SDPA attention and its
RMSNorm, "course" swaps in the course's FlashAttention and fused RMSNorm (``helpers.patching``).
"""
from __future__ import annotations

import re
import statistics

import torch

from ..bench import profile_kernels
from ..patching import use_course_kernels
from .data import TokenizedData, make_batches
from .lora import LoraSettings, attach_lora
from .models import build_model
from .point import GiB, timed_steps

VARIANTS = ("stock", "course")
# kernel name -> what it does, first match wins (CUDA kernel names of PyTorch, cuBLAS, bitsandbytes, Triton)
CATEGORIES = (("attention", r"flash|fmha|attn|attention|_fwd_kernel|_bwd_d"),
              ("RMSNorm", r"rms|norm"),
              ("nf4 dequantise", r"dequant"),
              ("matmul", r"gemm|cutlass|nvjet|sm90_|sm80_|matmul|splitk"))


def build(model_name: str, variant: str, data: TokenizedData, device: torch.device, seed: int = 0):
    """The model of one variant, ready to train; (model, what the course's kernels replaced)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    model, _ = build_model(model_name, device, vocab_size=data.vocab_size, attn="sdpa", seed=seed)
    torch.manual_seed(seed)  # the same adapters for both variants
    model = attach_lora(model, LoraSettings(), gradient_checkpointing=True)
    return model, (use_course_kernels(model) if variant == "course" else {})


def train(model_name: str, variant: str, batch_size: int, data: TokenizedData, device: torch.device, *,
          steps: int = 50, warmup_steps: int = 2, max_len: int | None = 1024, seed: int = 0
          ) -> tuple[dict, list[float]]:
    """Train ``steps`` steps (the first ``warmup_steps`` untimed); a flat record (for ``helpers.results``)
    and every step's loss."""
    if steps <= warmup_steps:
        raise ValueError(f"steps ({steps}) must be more than warmup_steps ({warmup_steps})")
    model, changed = build(model_name, variant, data, device, seed)
    batches = make_batches(data.token_ids, batch_size, steps, max_len, seed=seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(seed)  # the same LoRA dropout masks for both variants
    times, _, losses = timed_steps(model, batches, device, warmup_steps, None)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches[warmup_steps:])
    peak = torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else None
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    replaced = ", ".join(f"{k}: {v}" for k, v in changed.items()) or "nothing"
    return ({"model": model_name, "variant": variant, "batch_size": batch_size, "steps": steps, "max_len": max_len,
             "step_s": statistics.median(times), "tokens_per_s": tokens / sum(times), "peak_alloc_gb": peak,
             "final_loss": losses[-1], "replaced": replaced}, losses)


def category(kernel: str) -> str:
    """What a kernel does, from its name (see ``CATEGORIES``); "other" when nothing matches."""
    for name, pattern in CATEGORIES:
        if re.search(pattern, kernel, re.IGNORECASE):
            return name
    return "other"


def step_breakdown(model_name: str, variant: str, batch_size: int, data: TokenizedData, device: torch.device,
                   max_len: int | None = 1024, seed: int = 0) -> dict[str, float]:
    """Milliseconds of device time per forward + backward by kernel category (CPU time on a CPU)."""
    model, _ = build(model_name, variant, data, device, seed)
    [batch] = make_batches(data.token_ids, batch_size, 1, max_len, seed=seed)
    batch = {k: v.to(device) for k, v in batch.items()}

    def step() -> None:
        model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)

    rows = profile_kernels(step, reps=2)
    del model
    out: dict[str, float] = {}
    for r in rows:
        out[category(r["name"])] = out.get(category(r["name"]), 0.0) + r["calls"] * r["us_per_call"] / 1e3
    return out
