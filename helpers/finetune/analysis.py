"""Reading the sweep: the seed's tables, its claims tested, and a model of step and decode time.

The time models are deliberately small, so that their terms can be read:

* a training step = FLOPs at a fraction of the card's matmul peak + bytes at a fraction of its
  bandwidth + a fixed overhead per decoder layer and pass (kernel launches, Python);
* a decode step at batch 1 = the bytes of every weight at a fraction of the bandwidth + a fixed
  overhead per decoder layer.

The fractions and overheads are fitted on this GPU's measurements; evaluated with another card's
datasheet numbers they give a projection, not a measurement.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..specs import GpuSpec
from .generate import decode_bytes_per_token
from .models import MODELS, ModelSpec

PASSES = 3  # forward, forward again (gradient checkpointing), backward
DEQUANT_BYTES = 4.5  # per nf4 weight and pass: read 0.5 B packed, write 2 B bf16, read them back for the matmul
# bytes a token moves per layer and hidden unit in the element-wise kernels (norms, RoPE, SiLU, residuals)
ACT_BYTES = 40


def train_terms(spec: ModelSpec, batch: int, padded_len: float, attn: str = "eager") -> dict:
    """FLOPs, bytes and layer-passes of one training step of ``batch`` texts padded to ``padded_len``."""
    tokens = batch * padded_len
    h, layers = spec.hidden_size, spec.num_hidden_layers
    flops = 2 * PASSES * spec.linear_params() * tokens  # the frozen nf4 matmuls: 3 passes
    flops += 4 * spec.vocab_size * h * tokens  # lm_head forward + input gradient
    flops += (PASSES + 1) * layers * 4 * padded_len * h * tokens  # Q Kᵀ and P V, backward counted twice
    data = PASSES * DEQUANT_BYTES * spec.linear_params() + PASSES * ACT_BYTES * layers * h * tokens
    if attn == "eager":  # the S x S scores in bf16, their fp32 softmax and bf16 probabilities, per pass
        data += PASSES * layers * batch * spec.num_attention_heads * padded_len**2 * 12
    return {"flops": flops, "bytes": data, "layer_passes": PASSES * layers}


def _fit(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error (small active-set loop; a handful of terms)."""
    active = list(range(features.shape[1]))
    while True:
        a = features[:, active] / seconds[:, None]
        coef, *_ = np.linalg.lstsq(a, np.ones(len(seconds)), rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            full = np.zeros(features.shape[1])
            full[active] = np.clip(coef, 0, None)
            return full
        active.pop(int(np.argmin(coef)))


def _train_rows(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "train" and r.get("status") == "ok" and r.get("measured", True)
            and r.get("mean_padded_len") and r["model"] in MODELS]


def step_features(record: dict, card: GpuSpec) -> np.ndarray:
    terms = train_terms(MODELS[record["model"]], record["batch_size"], record["mean_padded_len"],
                        record.get("attn", "eager"))
    return np.array([terms["flops"] / (card.tensor_tflops * 1e12), terms["bytes"] / (card.bandwidth_gbps * 1e9),
                     terms["layer_passes"]])


def fit_step_model(records: list[dict], card: GpuSpec) -> dict:
    """Fit the step-time model on the measured training points with gradient checkpointing on (a cap
    that a point fits under does not change its speed, so capped points count too)."""
    rows = [r for r in _train_rows(records) if r.get("checkpointing", True)]
    if len(rows) < 2:
        raise ValueError(f"need at least 2 measured training points to fit, got {len(rows)}")
    x = np.stack([step_features(r, card) for r in rows])
    t = np.array([r["step_s"] for r in rows])
    coef = _fit(x, t)
    err = np.abs(x @ coef - t) / t
    return {"flops_factor": float(coef[0]), "bytes_factor": float(coef[1]), "overhead_s_per_layer_pass": float(coef[2]),
            "mean_rel_error": float(err.mean()), "max_rel_error": float(err.max()), "points": len(rows)}


def project_step(fit: dict, record: dict, card: GpuSpec) -> dict:
    """Projected step time of ``record``'s shape on ``card``, and each term's share."""
    f = step_features(record, card)
    parts = {"compute_s": fit["flops_factor"] * f[0], "memory_s": fit["bytes_factor"] * f[1],
             "overhead_s": fit["overhead_s_per_layer_pass"] * f[2]}
    return {**parts, "step_s": sum(parts.values())}


def generate_runs(records: list[dict]) -> list[dict]:
    """The finished generation records timed with the KV cache on (each new token one pass over one
    position); a record without ``kv_cache`` re-read the whole sequence for every token and is left out."""
    return [r for r in records if r.get("kind") == "generate" and r.get("status") == "ok" and r.get("kv_cache")]


def fit_decode_model(records: list[dict], card: GpuSpec, prompt_tokens: int = 32) -> dict:
    """Fit seconds per new token = bytes_factor * bytes / bandwidth + overhead per layer."""
    rows = [r for r in generate_runs(records) if r["model"] in MODELS]
    if len(rows) < 2:
        raise ValueError(f"need at least 2 generation measurements to fit, got {len(rows)}")
    x = np.stack([decode_features(r, card, prompt_tokens) for r in rows])
    t = np.array([r["seconds"] / r["new_tokens"] for r in rows])
    coef = _fit(x, t)
    err = np.abs(x @ coef - t) / t
    return {"bytes_factor": float(coef[0]), "overhead_s_per_layer": float(coef[1]), "mean_rel_error": float(err.mean()),
            "max_rel_error": float(err.max()), "points": len(rows)}


def decode_features(record: dict, card: GpuSpec, prompt_tokens: int = 32) -> np.ndarray:
    spec = MODELS[record["model"]]
    context = prompt_tokens + record["new_tokens"] / 2
    return np.array([decode_bytes_per_token(spec, int(context)) / (card.bandwidth_gbps * 1e9),
                     spec.num_hidden_layers])


def project_decode(fit: dict, record: dict, card: GpuSpec, reference: GpuSpec, clock_scaled: bool) -> float:
    """Projected tokens/s on ``card``; ``clock_scaled``: the overhead shrinks with the card's boost clock
    relative to ``reference`` (the GPU the fit was made on), else it stays as measured."""
    f = decode_features(record, card)
    overhead = fit["overhead_s_per_layer"] * f[1] * (reference.boost_mhz / card.boost_mhz if clock_scaled else 1)
    return 1.0 / (fit["bytes_factor"] * f[0] + overhead)


def train_runs(records: list[dict], model: str, cap, **fields) -> list[dict]:
    """The training records of ``model`` under ``cap`` whose other ``fields`` match, by batch size."""
    return sorted((r for r in records if r.get("kind") == "train" and r["model"] == model and r.get("cap_gb") == cap
                   and all(r.get(k) == v for k, v in fields.items())), key=lambda r: r["batch_size"])


def first_oom(records: list[dict], model: str, cap, **fields) -> int | None:
    """The smallest batch size that ran out of memory for ``model`` under ``cap`` (None: none did)."""
    return next((r["batch_size"] for r in train_runs(records, model, cap, **fields) if r["status"] == "oom"), None)


def status(records: list[dict], model: str, batch: int, cap, **fields) -> str | None:
    """"ok", "oom" or None (not measured) for one training point."""
    return next((r["status"] for r in train_runs(records, model, cap, **fields) if r["batch_size"] == batch), None)


def seed_table(records: list[dict], model: str, caps, **fields) -> pd.DataFrame:
    """The seed's table for one model: per batch size and cap, step time, memory % and GPU utilisation %
    (or OOM). Memory % is of the emulated card: peak reserved + CUDA context over the cap."""
    rows = {}
    for r in records:
        if r.get("kind") != "train" or r["model"] != model or not all(r.get(k) == v for k, v in fields.items()):
            continue
        if r.get("cap_gb") not in caps:
            continue
        label = "whole card" if r.get("cap_gb") is None else f"{r['cap_gb']:g} GB cap"
        if r["status"] != "ok":
            cell = "OOM" if r.get("measured", True) else "OOM (smaller batch did)"
        else:
            if r.get("cap_gb") is None:
                mem = r.get("mem_pct")
            else:
                mem = 100 * (r["peak_reserved_gb"] + (r.get("context_gb") or 0)) / r["cap_gb"]
            util = r.get("gpu_util_pct")
            cell = (f"{r['step_s']:.2f} s, mem {mem:.0f}%" if mem is not None else f"{r['step_s']:.2f} s") + \
                   (f", util {util:.0f}%" if util is not None else "")
        rows.setdefault(r["batch_size"], {})[label] = cell
    table = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    order = ["whole card" if c is None else f"{c:g} GB cap" for c in caps]
    table = table[[c for c in order if c in table.columns]]  # the caps' order, whatever order the points ran in
    table.index.name = "batch size"
    return table.fillna("-")
