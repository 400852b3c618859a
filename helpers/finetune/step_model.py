"""A QLoRA training step, part by part: each part's device time measured on this GPU (the profiler's
kernels), its work counted from the model's shapes, and scaled to another card by the one datasheet rate
that part depends on.

Parts and what scales them (``PARTS``):

* ``matmul``: every GEMM, FLOPs in two classes (:func:`matmul_flops`), each at its own datasheet rate: the
  frozen nf4 linears after dequantisation multiply in bf16 (tensor cores); LoRA, the lm_head and eager
  attention's Q Kᵀ and P V in fp32 (CUDA cores: TF32 is off), because peft's k-bit preparation keeps the
  norms, embeddings and lm_head in fp32, so the hidden states (and q, k, v) are fp32;
* ``nf4 dequantise``: bytes (packed weights in, bf16 out, three passes) at the card's bandwidth;
* ``softmax``: eager attention's S x S scores, written and read in fp32: bytes at the bandwidth;
* ``optimizer``: AdamW over the LoRA weights: bytes at the bandwidth;
* ``element-wise``: every other kernel (norms, RoPE, SiLU, residuals, casts, the loss): bytes at the
  bandwidth;
* ``host``: the time the device waits for Python and the launches: the same on any card (it is the host's).

Each part's rate on this GPU (work per second, as a fraction of the datasheet rate) is measured at a few
reference points (:class:`StepModel`; between them it is interpolated in the log of the tokens a step); the
same fraction is assumed on the other card (same software). That assumption is the projection's;
:func:`validate` measures how well the model predicts the sweep's steps, none of which built it, and
:func:`compare` turns that error into a range for one card's step time over another's.
"""
from __future__ import annotations

import itertools
import math
import re
import statistics
from dataclasses import dataclass

import numpy as np
import torch

from ..bench import profile_kernels
from ..datasheets import GpuSpec
from ..llama.data import TokenizedData, make_batches
from ..llama.lora import LoraSettings, attach_lora, check_checkpointing
from ..llama.models import MODELS, ModelSpec, build_model
from .gemm_count import GemmCount
from .launch_replay import Timeline
from .timing import time_steps, train_step

PASSES = 3  # forward, forward again (gradient checkpointing), backward
DEQUANT_BYTES = 4.5  # per nf4 weight and pass: read 0.5 B packed, write 2 B bf16, read them back for the matmul
ACT_BYTES = 40  # bytes a token moves per layer and hidden unit in the element-wise kernels
LINEARS_PER_LAYER = 7  # q, k, v, o, gate, up, down: each an nf4 matrix
PARTS = {"matmul": "tensor", "nf4 dequantise": "bandwidth", "softmax": "bandwidth", "optimizer": "bandwidth",
         "element-wise": "bandwidth", "host": "host"}
SCALES = ("tensor", "bandwidth", "host")
GEMM_CLASSES = ("bf16", "fp32")  # the matmul part's data types: bf16 on the tensor cores, fp32 on the CUDA cores
KERNEL_PARTS = (("nf4 dequantise", r"dequant"),
                ("softmax", r"softmax"),
                ("optimizer", r"adam|foreach|multi_tensor"),
                ("matmul", r"gemm|cutlass|nvjet|sm90_|sm80_|matmul|splitk|aten::(add|b)?mm\b"))


MATMUL_KERNELS_KEPT = 12  # the longest matmul kernels a parts record names, for classing GEMMs by data type later


def part_of(kernel: str) -> str:
    """The part a kernel belongs to, from its name (``KERNEL_PARTS``); "element-wise" when nothing matches."""
    return next((part for part, pattern in KERNEL_PARTS if re.search(pattern, kernel, re.IGNORECASE)), "element-wise")


def split_parts(rows: list[dict]) -> tuple[dict[str, float], dict[str, str | float]]:
    """The profiler's kernel rows (``bench.profile_kernels``) as milliseconds per device part, and the matmul
    part's longest kernels (at most ``MATMUL_KERNELS_KEPT``, longest first) as a record's flat fields: "matmul kernel
    1" its name, "matmul kernel 1, ms a step" its time, and so on. Their names say the data type and the pipe (bf16
    tensor cores, TF32, fp32 on the CUDA cores), which one datasheet rate cannot."""
    parts: dict[str, float] = {p: 0.0 for p in PARTS if p != "host"}
    matmuls: dict[str, float] = {}
    for r in rows:
        part, ms = part_of(r["name"]), r["calls"] * r["us_per_call"] / 1e3
        parts[part] += ms
        if part == "matmul":
            matmuls[r["name"]] = matmuls.get(r["name"], 0.0) + ms
    longest = sorted(matmuls.items(), key=lambda kv: -kv[1])[:MATMUL_KERNELS_KEPT]
    fields: dict[str, str | float] = {}
    for i, (name, ms) in enumerate(longest, 1):
        fields.update({f"matmul kernel {i}": name, f"matmul kernel {i}, ms a step": ms})
    return parts, fields


def _lora_params(spec: ModelSpec, lora_r: int) -> int:
    return spec.num_hidden_layers * 2 * lora_r * 2 * spec.hidden_size  # q and v: A (h x r) and B (r x h) each


def matmul_flops(spec: ModelSpec, batch: int, padded_len: float, lora_r: int = 16) -> dict[str, float]:
    """The matmul part's FLOPs in one step by the data type they run in (``GEMM_CLASSES``). "bf16": the frozen nf4
    linears (forward, its recomputation, the input gradient), which bitsandbytes dequantises to bf16. "fp32": the
    LoRA adapters (as many passes), the lm_head (forward and input gradient) and eager attention's two products
    (forward, recomputation, two products each backward): peft's k-bit preparation keeps the norms, embeddings and
    lm_head in fp32, so the hidden states, q, k and v are fp32, and the adapters are fp32 (TF32 is off: the CUDA
    cores). ``tests/test_gemm_classes.py`` checks these data types on the model itself."""
    if batch < 1 or padded_len < 1:
        raise ValueError(f"batch and padded_len must be >= 1, got {batch}, {padded_len}")
    tokens = batch * padded_len
    h, layers = spec.hidden_size, spec.num_hidden_layers
    return {"bf16": 2 * PASSES * spec.linear_params() * tokens,
            "fp32": 2 * PASSES * _lora_params(spec, lora_r) * tokens + 4 * spec.vocab_size * h * tokens
            + (PASSES + 1) * layers * 4 * padded_len * h * tokens}


def work(spec: ModelSpec, batch: int, padded_len: float, lora_r: int = 16) -> dict[str, float]:
    """The work of each part in one step of ``batch`` texts padded to ``padded_len`` (eager attention,
    gradient checkpointing): FLOPs for ``matmul`` (both data types of :func:`matmul_flops`), bytes for the
    bandwidth parts, layer-passes for ``host``."""
    tokens = batch * padded_len
    h, layers = spec.hidden_size, spec.num_hidden_layers
    lora_params = _lora_params(spec, lora_r)
    return {
        "matmul": sum(matmul_flops(spec, batch, padded_len, lora_r).values()),
        "nf4 dequantise": PASSES * DEQUANT_BYTES * spec.linear_params(),
        "softmax": PASSES * layers * batch * spec.num_attention_heads * padded_len ** 2 * 2 * 4,
        "optimizer": lora_params * 4 * 4 * 2,  # fp32 weight, grad, two moments: read and written
        "element-wise": PASSES * ACT_BYTES * layers * h * tokens,
        "host": PASSES * layers,
    }


def _part_sums(records: list[dict]) -> dict[str, dict[str, float]]:
    """Launches, DRAM bytes (read + written) and nanoseconds per device part, summed over ``records``."""
    sums: dict[str, dict[str, float]] = {}
    for r in records:
        s = sums.setdefault(r["part"], {"calls": 0, "bytes": 0.0, "ns": 0.0})
        s["calls"] += r["calls"]
        s["bytes"] += r["dram_read"] + r["dram_write"]
        s["ns"] += r["duration_ns"]
    return sums


def layer_bytes(records: list[dict]) -> dict[str, dict[str, float]]:
    """One decoder layer's share of a step, per device part, from Nsight Compute's records of the same step on a
    model of one and of two layers (``scripts/step_part_bytes.py``, one batch size): the two models' difference in
    launches, DRAM bytes and milliseconds under ncu, and the GB/s they make."""
    if len({(r["model"], r["batch_size"]) for r in records}) != 1 or {r["layers"] for r in records} != {1, 2}:
        raise ValueError("pass the records of one model and batch size, at 1 and at 2 layers")
    one, two = (_part_sums([r for r in records if r["layers"] == n]) for n in (1, 2))
    out: dict[str, dict[str, float]] = {}
    for part in PARTS:
        if part in two:
            a, b = one.get(part, {"calls": 0, "bytes": 0.0, "ns": 0.0}), two[part]
            moved, ns = b["bytes"] - a["bytes"], b["ns"] - a["ns"]
            out[part] = {"calls": b["calls"] - a["calls"], "bytes": moved, "ms": ns / 1e6,
                         "gbps": moved / ns if ns > 0 else float("nan")}
    return out


def launches(spec: ModelSpec) -> dict[str, int]:
    """Kernel launches a step of the parts whose count follows from the shapes (any batch): one dequantisation
    per nf4 matrix and pass; the GEMMs of a layer (forward 7 frozen + 4 LoRA + 2 attention, twice; backward 7
    input gradients + 8 LoRA gradients + 4 attention) and the lm_head's 2; one softmax (or its backward) per
    layer and pass. At least these: cuBLAS may split a GEMM into more kernels."""
    layers = spec.num_hidden_layers
    return {"nf4 dequantise": PASSES * LINEARS_PER_LAYER * layers, "matmul": (2 * 13 + 19) * layers + 2,
            "softmax": PASSES * layers}


PACED_FRACTION = 0.5  # a bandwidth part that streams at least this fraction of the datasheet bandwidth is paced by it


def clock_rate(card: GpuSpec) -> float:
    """``card``'s SMs times their boost clock (MHz): what a kernel paced by its instructions' latency follows when
    its programs fill every SM. An upper bound: the clock a card sustains under load is lower, and no datasheet
    gives it."""
    return card.sms * card.boost_mhz


REST_SCALINGS = ("clock", "fixed")  # what a part's time follows beyond its measured share that follows the bandwidth


def elastic_factor(here: GpuSpec, card: GpuSpec, elasticity: float, rest: str) -> float:
    """``card``'s time over ``here``'s for a part whose time follows HBM bandwidth with the exponent
    ``elasticity`` (measured between two GPUs that differ only in their memory, notebook 10; clipped to [0, 1])
    and, with the remaining exponent, the SMs x boost clock (``rest`` "clock": :func:`clock_rate`) or nothing
    ("fixed": a latency no card changes)."""
    if rest not in REST_SCALINGS:
        raise ValueError(f"rest must be one of {REST_SCALINGS}, got {rest!r}")
    e = min(max(elasticity, 0.0), 1.0)
    other = clock_rate(here) / clock_rate(card) if rest == "clock" else 1.0
    return (here.bandwidth_gbps / card.bandwidth_gbps) ** e * other ** (1 - e)


def class_rate(card: GpuSpec, gemm_class: str) -> float:
    """``card``'s datasheet FLOP/s for one of ``GEMM_CLASSES``: the bf16 tensor-core rate, or fp32 on the CUDA cores."""
    rates = {"bf16": card.tensor_tflops, "fp32": card.fp32_tflops}
    if gemm_class not in rates:
        raise ValueError(f"gemm_class must be one of {GEMM_CLASSES}, got {gemm_class!r}")
    return rates[gemm_class] * 1e12


def rate(card: GpuSpec, part: str, flops: dict[str, float] | None = None) -> float:
    """The datasheet rate ``part`` runs against on ``card``: FLOP/s, bytes/s, or 1 for the host. For ``matmul``,
    ``flops`` (:func:`matmul_flops`) blends the classes' rates by their FLOPs, as the time they take at their own
    rates adds up; without it, the bf16 tensor rate alone."""
    scale = PARTS[part]
    if scale == "tensor":
        if not flops:
            return class_rate(card, "bf16")
        return sum(flops.values()) / sum(f / class_rate(card, c) for c, f in flops.items())
    return card.bandwidth_gbps * 1e9 if scale == "bandwidth" else 1.0


def build_terms(reference: dict, card: GpuSpec) -> dict[str, float]:
    """Each part's efficiency at the measured ``reference`` record (a fraction of ``card``'s datasheet rate;
    for the host, seconds per layer-pass)."""
    spec, batch, padded = MODELS[reference["model"]], reference["batch_size"], reference["mean_padded_len"]
    w, flops = work(spec, batch, padded), matmul_flops(spec, batch, padded)
    terms = {}
    for part in PARTS:
        seconds = reference[f"{part} ms"] / 1e3
        terms[part] = seconds / w[part] if part == "host" else w[part] / (seconds * rate(card, part, flops))
    return terms


def tokens(record: dict) -> float:
    """Token positions a step processes, padding included: what the parts' efficiencies follow."""
    return record["batch_size"] * record["mean_padded_len"]


@dataclass(frozen=True)
class StepModel:
    """The part-by-part model built from measured ``train_parts`` records on ``here``."""

    here: GpuSpec
    references: tuple[dict, ...]  # by tokens a step

    @classmethod
    def from_records(cls, records: list[dict], here: GpuSpec) -> StepModel:
        refs = sorted((r for r in records if r.get("what") == "train_parts"), key=tokens)
        if not refs:
            raise ValueError("no train_parts record to build the step model from")
        return cls(here, tuple(refs))

    def terms(self, batch: int, padded_len: float) -> dict[str, float]:
        """Each part's efficiency (host: seconds per layer-pass) at a step of ``batch`` x ``padded_len``
        tokens: the nearest references' terms, interpolated in log tokens (the end ones outside their span)."""
        x = [math.log(tokens(r)) for r in self.references]
        built = [build_terms(r, self.here) for r in self.references]
        at = math.log(batch * padded_len)
        return {p: float(np.interp(at, x, [b[p] for b in built])) for p in PARTS}

    def unpaced_parts(self, paced: float = PACED_FRACTION) -> tuple[str, ...]:
        """The bandwidth parts that reach less than ``paced`` of the datasheet bandwidth at some reference: what
        paces them, their bytes or their kernels' fixed latency (the SMs' clock, :func:`clock_rate`), is not known
        from one GPU."""
        built = [build_terms(r, self.here) for r in self.references]
        return tuple(p for p, scale in PARTS.items() if scale == "bandwidth" and min(b[p] for b in built) < paced)

    def predict(self, model: str, batch: int, padded_len: float, card: GpuSpec,
                factors: dict[str, float] | None = None, overlap: bool = False,
                clock_parts: tuple[str, ...] = (), elasticities: dict[str, float] | None = None,
                rest: str = "fixed") -> dict[str, float]:
        """Seconds of each part on ``card``, the device's sum, and the step: device + host (``overlap``
        False: the device waits for all of the host's time, as measured here) or the larger of the two (the
        host's work hidden behind a slower device). ``factors``: a multiplier per scale (``SCALES``).
        ``clock_parts``: parts scaled from this GPU by :func:`clock_rate` instead of their rate (a what-if:
        kernels paced by their fixed latency rather than by FLOP/s or bytes). ``elasticities``: parts scaled
        from this GPU by their measured bandwidth elasticity and ``rest`` (:func:`elastic_factor`)."""
        terms, w = self.terms(batch, padded_len), work(MODELS[model], batch, padded_len)
        flops = matmul_flops(MODELS[model], batch, padded_len)
        factors, elasticities = factors or {}, elasticities or {}
        parts = {}
        for p in PARTS:
            here_s = w[p] / (terms[p] * rate(self.here, p, flops)) if p != "host" else 0.0
            if p == "host":
                seconds = terms[p] * w[p]
            elif p in elasticities:
                seconds = here_s * elastic_factor(self.here, card, elasticities[p], rest)
            elif p in clock_parts:
                seconds = here_s * clock_rate(self.here) / clock_rate(card)
            else:
                seconds = w[p] / (terms[p] * rate(card, p, flops))
            parts[p] = factors.get(PARTS[p], 1.0) * seconds
        device = sum(v for p, v in parts.items() if p != "host")
        step = max(device, parts["host"]) if overlap else device + parts["host"]
        return {**parts, "device_s": device, "step_s": step}


def trained_runs(sweep_records: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """The sweep's measured steps (trained, with checkpointing) by model and batch size, each point's runs under
    every cap; smallest model first, then batch."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in sweep_records:
        if (r.get("kind") == "train" and r.get("status") == "ok" and r.get("measured", True)
                and r.get("checkpointing", True) and r["model"] in MODELS and r.get("mean_padded_len")):
            groups.setdefault((r["model"], r["batch_size"]), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (MODELS[kv[0][0]].linear_params(), kv[0][1])))


def validate(step_model: StepModel, sweep_records: list[dict]) -> list[dict]:
    """The model against the sweep's measured steps (:func:`trained_runs`), one row per model and batch:
    the steps measured under every cap (the same work: their spread is the measurement's noise), their median,
    the prediction (each run's at its own mean padded length, their median) and the error: the median over the
    runs of each prediction against its own run."""
    rows = []
    for (model, batch), runs in trained_runs(sweep_records).items():
        steps = [r["step_s"] for r in runs]
        predicted = [step_model.predict(model, batch, r["mean_padded_len"], step_model.here)["step_s"] for r in runs]
        rows.append({"model": model, "batch": batch,
                     "mean_padded_len": statistics.median(r["mean_padded_len"] for r in runs),
                     "runs": len(runs), "measured s": statistics.median(steps),
                     "min s": min(steps), "max s": max(steps), "predicted s": statistics.median(predicted),
                     "error": statistics.median(p / m - 1 for p, m in zip(predicted, steps))})
    return rows


def uncertainty(rows: list[dict]) -> dict[str, float]:
    """The model's stated uncertainty for each model: the largest relative error on its points that the step
    model did not see (:func:`validate`'s rows)."""
    if not rows:
        raise ValueError("no validation rows: the model's error is unknown")
    errors: dict[str, float] = {}
    for r in rows:
        errors[r["model"]] = max(errors.get(r["model"], 0.0), abs(r["error"]))
    return errors


def compare(step_model: StepModel, model: str, batch: int, padded_len: float, a: GpuSpec, b: GpuSpec,
            error: float, elasticities: dict[str, float] | None = None, timeline: Timeline | None = None,
            recorded_on: GpuSpec | None = None) -> dict:
    """``b``'s step time over ``a``'s: the nominal ratio (host added in full) and its range when each scale's
    time (tensor, bandwidth, host) is off by up to ``error`` (the same on both cards: the same software), the
    host is added or hidden, and the bandwidth parts that stream far below the bandwidth
    (:meth:`StepModel.unpaced_parts`) follow it or the SMs' clock; the part that contributes most to the
    difference in the device's time (in its direction), its seconds, and a clock what-if: the nominal ratio if
    that part alone followed the SMs' clock instead.

    With ``elasticities`` (each part's measured bandwidth elasticity), those parts follow the bandwidth by it and
    the rest of their time stays fixed (nominal) or follows the SMs' clock (the range) in place of the unpaced
    parts' either-or; the what-if is then the nominal ratio with the rest of all their time on the clock.

    With ``timeline`` (that point's step recorded on ``recorded_on``, default this GPU, :mod:`launch_replay`),
    each card's step is the timeline replayed with every kernel's time scaled by its part's predicted time on the
    card over its predicted time on ``recorded_on``, the host's issue times kept as measured: the host is neither
    added nor hidden, and has no error of its own."""
    if not 0 <= error < 1:
        raise ValueError(f"error must be in [0, 1), got {error}")
    variants = ([{"elasticities": elasticities, "rest": rest} for rest in REST_SCALINGS] if elasticities
                else [{"clock_parts": ()}, {"clock_parts": step_model.unpaced_parts()}])
    recorded = step_model.predict(model, batch, padded_len, recorded_on or step_model.here)

    def step(card: GpuSpec, **options) -> float:
        """The step on ``card``: the model's sum, or the timeline replayed (microseconds: only ratios are used)."""
        predicted = step_model.predict(model, batch, padded_len, card, **options)
        return predicted["step_s"] if timeline is None else replayed_us(timeline, predicted, recorded)

    device_scales = tuple(s for s in SCALES if s != "host")  # replayed, the host is measured: no error of its own
    scales, overlaps = (SCALES, (False, True)) if timeline is None else (device_scales, (False,))
    ratios = []
    for variant in variants:
        for signs in itertools.product((1 - error, 1 + error), repeat=len(scales)):
            factors = dict(zip(scales, signs))
            for overlap in overlaps:
                ratios.append(step(b, factors=factors, overlap=overlap, **variant)
                              / step(a, factors=factors, overlap=overlap, **variant))
    pa, pb = (step_model.predict(model, batch, padded_len, card, elasticities=elasticities) for card in (a, b))
    sign = 1.0 if pb["device_s"] >= pa["device_s"] else -1.0  # the part that moves the device time most that way
    deciding = max((p for p in PARTS if p != "host"), key=lambda p: sign * (pb[p] - pa[p]))
    what_if = {"elasticities": elasticities, "rest": "clock"} if elasticities else {"clock_parts": (deciding,)}
    return {"ratio": step(b, elasticities=elasticities) / step(a, elasticities=elasticities),
            "low": min(ratios), "high": max(ratios), "deciding": deciding, "deciding_s": pb[deciding] - pa[deciding],
            "clock what-if": step(b, **what_if) / step(a, **what_if),
            "host": "added or hidden" if timeline is None else "replayed"}


def replayed_us(timeline: Timeline, on_card: dict[str, float], on_recorded: dict[str, float]) -> float:
    """``timeline``'s step replayed (microseconds) with each kernel's time scaled by its part's predicted seconds on a
    card (``on_card``, :meth:`StepModel.predict`) over those on the GPU that recorded it (``on_recorded``); the
    host's issue times kept."""
    return timeline.replay(lambda part: on_card[part] / on_recorded[part] if on_recorded.get(part) else 1.0)


def tie_share(here: GpuSpec, a: GpuSpec, b: GpuSpec, flops: dict[str, float] | None = None) -> float:
    """The bandwidth parts' time over the matmuls' time (both on ``here``) at which ``a`` and ``b`` take the
    same device time: above it the card with more bandwidth is faster, below it the one with more FLOP/s.
    ``flops``: the matmuls' FLOPs by class (:func:`matmul_flops`); without them, all at the bf16 tensor rate."""
    matmul = rate(here, "matmul", flops)
    tensor = matmul / rate(b, "matmul", flops) - matmul / rate(a, "matmul", flops)
    bandwidth = here.bandwidth_gbps / b.bandwidth_gbps - here.bandwidth_gbps / a.bandwidth_gbps
    if tensor * bandwidth >= 0:
        raise ValueError(f"{a.name} and {b.name}: one has both more FLOP/s and more bandwidth; no tie")
    return -tensor / bandwidth


def rank(step_model: StepModel, rows: list[dict], a: GpuSpec, b: GpuSpec, errors: dict[str, float] | None = None,
         elasticities: dict[str, float] | None = None, timelines: dict[str, Timeline] | None = None,
         recorded_on: GpuSpec | None = None) -> list[dict]:
    """For each validated point (:func:`validate`'s rows): ``b``'s step time over ``a``'s as a range under that
    model's uncertainty (``errors`` per model, else :func:`uncertainty` of ``rows``; :func:`compare`, with
    ``elasticities``, and the point's timeline, recorded on ``recorded_on``, where ``timelines``, keyed
    "model:batch", holds one), the card it favours ("not decided by this run" where the range holds 1) and the
    deciding part."""
    errors, timelines = errors or uncertainty(rows), timelines or {}
    ranked = []
    for r in rows:
        if r["model"] not in errors:
            continue
        c = compare(step_model, r["model"], r["batch"], r["mean_padded_len"], a, b, min(errors[r["model"]], 0.99),
                    elasticities, timelines.get(f"{r['model']}:{r['batch']}"), recorded_on)
        winner = a.name if c["low"] > 1 else b.name if c["high"] < 1 else "not decided by this run"
        ranked.append({"model": r["model"], "batch": r["batch"], "uncertainty": errors[r["model"]], **c,
                       "faster": winner})
    return ranked


DEVICE_SCALINGS = ("bandwidth", "clock")  # what a decode step's device time may follow on another card


DECODERS = ("decode_parts", "graphed_decode_parts")  # stock generate(); the course's graphed decoder (notebook 07)


def decode_seconds(records: list[dict], here: GpuSpec, card: GpuSpec, new_tokens: int, scaling: str,
                   prompt_tokens: int = 32, what: str = "decode_parts", elasticity: float | None = None) -> float:
    """Seconds a decoder takes for ``new_tokens`` after a ``prompt_tokens`` prompt on ``card``, from its
    records measured on ``here`` (``what``: "decode_parts", stock ``generate()``; "graphed_decode_parts", the
    course's graphed decoder): each token's host time as measured at its context and its device time scaled by
    ``scaling`` ("bandwidth": HBM bandwidth; "clock": :func:`clock_rate`), both interpolated linearly between
    the measured contexts (the end values outside them). With the device time's measured bandwidth
    ``elasticity``, ``scaling`` is what the rest of it follows (``REST_SCALINGS``, :func:`elastic_factor`)."""
    scalings = DEVICE_SCALINGS if elasticity is None else REST_SCALINGS
    if scaling not in scalings:
        raise ValueError(f"scaling must be one of {scalings}, got {scaling!r}")
    if what not in DECODERS:
        raise ValueError(f"what must be one of {DECODERS}, got {what!r}")
    recs = sorted((r for r in records if r.get("what") == what and r.get("kv_cache")), key=lambda r: r["context"])
    if not recs or new_tokens < 1:
        raise ValueError(f"need {what} records (with the KV cache) and new_tokens >= 1, got {new_tokens}")
    if elasticity is None:  # not measured: all of the device's time follows the bandwidth (e = 1) or the clock (e = 0)
        elasticity, scaling = (1.0, "fixed") if scaling == "bandwidth" else (0.0, "clock")
    factor = elastic_factor(here, card, elasticity, scaling)
    context = np.arange(prompt_tokens, prompt_tokens + new_tokens)
    measured = [r["context"] for r in recs]
    host = np.interp(context, measured, [r["host_s_per_token"] for r in recs])
    device = np.interp(context, measured, [r["device_s_per_token"] for r in recs])
    return float((host + factor * device).sum())


def decode_lead(records: list[dict], here: GpuSpec, a: GpuSpec, b: GpuSpec, lengths: list[int],
                what: str = "decode_parts", elasticity: float | None = None) -> dict:
    """``b``'s tokens/s over ``a``'s for each output length in ``lengths``, under each device scaling (with a
    measured ``elasticity``: each scaling of the rest, :func:`decode_seconds`)."""
    scalings = DEVICE_SCALINGS if elasticity is None else REST_SCALINGS
    return {s: [decode_seconds(records, here, a, n, s, what=what, elasticity=elasticity)
                / decode_seconds(records, here, b, n, s, what=what, elasticity=elasticity) for n in lengths]
            for s in scalings}


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
    step = train_step(model)
    times = time_steps(step, batches, device, warmup)[0]
    todo = iter(batches[warmup - 1:])  # the last warm-up batch warms the profiler up, then the timed ones
    parts, matmul_kernels = split_parts(profile_kernels(lambda: step(next(todo)), reps=timed))
    with GemmCount() as count:  # one more step, its products counted by data type against matmul_flops' count
        step(batches[-1])
    padded_to = batches[-1]["input_ids"].shape[1]
    gemm_flops = {"GFLOP counted at padded length": padded_to,
                  **{f"{c} GFLOP counted": count.flops.get(c, 0.0) / 1e9 for c in GEMM_CLASSES},
                  **{f"{c} GFLOP from the shapes": f / 1e9
                     for c, f in matmul_flops(MODELS[model_name], batch, padded_to).items()}}
    device_ms = sum(parts.values())
    padded = statistics.fmean(b["input_ids"].shape[1] for b in batches[warmup:])
    return {"what": "train_parts", "model": model_name, "batch_size": batch, "mean_padded_len": padded,
            "weights": source, "checkpointing": checkpointing, "timed_steps": timed,
            "step_s": statistics.median(times), "step_s_mean": statistics.fmean(times), "step_s_min": min(times),
            "step_s_max": max(times), "device_ms": device_ms,
            "host ms": max(0.0, 1e3 * statistics.fmean(times) - device_ms),
            **{f"{p} ms": ms for p, ms in parts.items()}, **matmul_kernels, **gemm_flops}
