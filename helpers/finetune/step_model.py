"""A QLoRA training step, part by part: each part's device time measured on this GPU (the profiler's
kernels), its work counted from the model's shapes, and scaled to another card by the one datasheet rate
that part depends on.

Parts and what scales them (``PARTS``):

* ``matmul``: every GEMM (the frozen nf4 linears after dequantisation, LoRA, the lm_head, eager
  attention's Q Kᵀ and P V): FLOPs at the card's bf16 tensor rate;
* ``nf4 dequantise``: bytes (packed weights in, bf16 out, three passes) at the card's bandwidth;
* ``softmax``: eager attention's S x S scores, written and read in fp32: bytes at the bandwidth;
* ``optimizer``: AdamW over the LoRA weights: bytes at the bandwidth;
* ``element-wise``: every other kernel (norms, RoPE, SiLU, residuals, casts, the loss): bytes at the
  bandwidth;
* ``host``: the time the device waits for Python and the launches: the same on any card (it is the host's).

Each part's rate on this GPU (work per second, as a fraction of the datasheet rate) is measured at one
reference point; the same fraction is assumed on the other card (same software). That assumption is the
projection's; :func:`validate` prints how well the model predicts points it was not built from.
"""
from __future__ import annotations

import re
import statistics
import time

import torch

from ..bench import profile_kernels
from ..specs import GpuSpec
from .analysis import ACT_BYTES, DEQUANT_BYTES, PASSES
from .data import TokenizedData, make_batches
from .lora import LoraSettings, attach_lora, check_checkpointing
from .models import MODELS, ModelSpec, build_model
from .timing import sync

PARTS = {"matmul": "tensor", "nf4 dequantise": "bandwidth", "softmax": "bandwidth", "optimizer": "bandwidth",
         "element-wise": "bandwidth", "host": "host"}
KERNEL_PARTS = (("nf4 dequantise", r"dequant"),
                ("softmax", r"softmax"),
                ("optimizer", r"adam|foreach|multi_tensor"),
                ("matmul", r"gemm|cutlass|nvjet|sm90_|sm80_|matmul|splitk|aten::(add|b)?mm\b"))


def part_of(kernel: str) -> str:
    """The part a kernel belongs to, from its name (``KERNEL_PARTS``); "element-wise" when nothing matches."""
    return next((part for part, pattern in KERNEL_PARTS if re.search(pattern, kernel, re.IGNORECASE)), "element-wise")


def work(spec: ModelSpec, batch: int, padded_len: float, lora_r: int = 16) -> dict[str, float]:
    """The work of each part in one step of ``batch`` texts padded to ``padded_len`` (eager attention,
    gradient checkpointing): FLOPs for ``matmul``, bytes for the bandwidth parts, layer-passes for ``host``."""
    if batch < 1 or padded_len < 1:
        raise ValueError(f"batch and padded_len must be >= 1, got {batch}, {padded_len}")
    tokens = batch * padded_len
    h, layers = spec.hidden_size, spec.num_hidden_layers
    lora_params = layers * 2 * lora_r * 2 * h  # q and v: A (h x r) and B (r x h) each
    return {
        "matmul": 2 * PASSES * (spec.linear_params() + lora_params) * tokens + 4 * spec.vocab_size * h * tokens
        + (PASSES + 1) * layers * 4 * padded_len * h * tokens,
        "nf4 dequantise": PASSES * DEQUANT_BYTES * spec.linear_params(),
        "softmax": PASSES * layers * batch * spec.num_attention_heads * padded_len ** 2 * 2 * 4,
        "optimizer": lora_params * 4 * 4 * 2,  # fp32 weight, grad, two moments: read and written
        "element-wise": PASSES * ACT_BYTES * layers * h * tokens,
        "host": PASSES * layers,
    }


def rate(card: GpuSpec, part: str) -> float:
    """The datasheet rate ``part`` runs against on ``card``: FLOP/s, bytes/s, or 1 for the host."""
    scale = PARTS[part]
    if scale == "tensor":
        return card.tensor_tflops * 1e12
    return card.bandwidth_gbps * 1e9 if scale == "bandwidth" else 1.0


def build_terms(reference: dict, card: GpuSpec) -> dict[str, float]:
    """Each part's efficiency at the measured ``reference`` record (a fraction of ``card``'s datasheet rate;
    for the host, seconds per layer-pass)."""
    w = work(MODELS[reference["model"]], reference["batch_size"], reference["mean_padded_len"])
    terms = {}
    for part in PARTS:
        seconds = reference[f"{part} ms"] / 1e3
        terms[part] = seconds / w[part] if part == "host" else w[part] / (seconds * rate(card, part))
    return terms


def predict(terms: dict[str, float], model: str, batch: int, padded_len: float, card: GpuSpec,
            host: bool = True) -> dict[str, float]:
    """Seconds of each part and their sum (``step_s``) for one step on ``card``. ``host=False``: the
    device's time alone (the host fully hidden behind it: the low end of a range)."""
    w = work(MODELS[model], batch, padded_len)
    parts = {part: (terms[part] * w[part] if part == "host" else w[part] / (terms[part] * rate(card, part)))
             for part in PARTS if host or part != "host"}
    return {**parts, "step_s": sum(parts.values())}


def validate(terms: dict[str, float], records: list[dict], card: GpuSpec) -> list[dict]:
    """The model against measured steps it was not built from: predicted and measured seconds, and the error."""
    rows = []
    for r in records:
        p = predict(terms, r["model"], r["batch_size"], r["mean_padded_len"], card)["step_s"]
        rows.append({"model": r["model"], "batch": r["batch_size"], "measured s": r["step_s"], "predicted s": p,
                     "error": p / r["step_s"] - 1})
    return rows


def compare(terms: dict[str, float], model: str, batch: int, padded_len: float, a: GpuSpec, b: GpuSpec) -> dict:
    """``b``'s step time over ``a``'s, as a range: host added in full (the device waits for it, as here) or
    hidden behind the device; and the part that contributes most to the difference."""
    ratios = [predict(terms, model, batch, padded_len, b, host)["step_s"] /
              predict(terms, model, batch, padded_len, a, host)["step_s"] for host in (True, False)]
    pa, pb = (predict(terms, model, batch, padded_len, card) for card in (a, b))
    deciding = max((p for p in PARTS if p != "host"), key=lambda p: abs(pb[p] - pa[p]))
    return {"low": min(ratios), "high": max(ratios), "deciding": deciding,
            "deciding_s": pb[deciding] - pa[deciding]}


def measure_train_parts(model_name: str, batch: int, data: TokenizedData, device: torch.device, *,
                        warmup: int = 2, timed: int = 10, max_len: int | None = 1024) -> dict:
    """One record: the sweep's configuration (eager attention, LoRA r=16 on q and v, gradient checkpointing,
    AdamW) trained ``warmup`` + ``timed`` steps, the wall time of each timed step (median and spread), then
    the same timed batches again under the profiler: milliseconds per part a step (their mean), and the
    host's (the mean wall time the device spent waiting)."""
    if timed < 1 or warmup < 1:
        raise ValueError(f"warmup and timed must be >= 1, got {warmup}, {timed}")
    batches = [{k: v.to(device) for k, v in b.items()}
               for b in make_batches(data.token_ids, batch, warmup + timed, max_len)]
    model, source = build_model(model_name, device, vocab_size=data.vocab_size, attn="eager")
    model = attach_lora(model, LoraSettings(r=16), gradient_checkpointing=True)
    checkpointing = check_checkpointing(model, batches[0]["input_ids"][:1, :16])  # leaves the model training
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)

    def step(b: dict) -> None:
        model(**b).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = []
    for i, b in enumerate(batches):
        sync(device)
        t0 = time.perf_counter()
        step(b)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    todo = iter(batches[warmup - 1:])  # the last warm-up batch warms the profiler up, then the timed ones
    rows = profile_kernels(lambda: step(next(todo)), reps=timed)
    parts: dict[str, float] = {p: 0.0 for p in PARTS if p != "host"}
    for r in rows:
        parts[part_of(r["name"])] += r["calls"] * r["us_per_call"] / 1e3
    device_ms = sum(parts.values())
    padded = statistics.fmean(b["input_ids"].shape[1] for b in batches[warmup:])
    return {"what": "train_parts", "model": model_name, "batch_size": batch, "mean_padded_len": padded,
            "weights": source, "checkpointing": checkpointing, "timed_steps": timed,
            "step_s": statistics.median(times), "step_s_mean": statistics.fmean(times), "step_s_min": min(times),
            "step_s_max": max(times), "device_ms": device_ms,
            "host ms": max(0.0, 1e3 * statistics.fmean(times) - device_ms),
            **{f"{p} ms": ms for p, ms in parts.items()}}
