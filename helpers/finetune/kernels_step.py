"""The QLoRA training step with the course's kernels against the stock step (notebook 07, part 2).

Every variant builds the same nf4 model (same seed), attaches the same LoRA adapters with gradient
checkpointing and trains on the same batches (the eager variants with the same dropout masks). "stock" is transformers +
peft as they come (after peft's k-bit preparation its SDPA attention runs in fp32); "sdpa bf16" is
the strongest baseline, PyTorch's fused attention in bf16; "course" swaps in the course's
FlashAttention (bf16), fused RMSNorm, rotary embedding, SwiGLU and nf4 layers (``helpers.llama.patching``);
"course graphed" is the same model whose whole step replays CUDA graphs (``graphed_step``), on a GPU only.
"""
from __future__ import annotations

import gc
import re
import statistics
import time
from dataclasses import dataclass

import torch

from ..bench import profile_kernels
from ..card_fit import CardLimits
from ..kernels.flash_attention import tuning_bucket
from ..llama.patching import SDPA_BF16, use_attention, use_course_kernels
from ..llama.data import TokenizedData, make_batches
from .graphed_step import GraphedTrainStep
from ..llama.lora import LoraSettings, attach_lora, check_checkpointing
from ..llama.memory_caps import GiB
from ..llama.models import ModelSpec, build_model, nf4_bytes, spec_for
from .timing import run_timed_steps, sync, time_steps, to_device, train_step

GRAPHED = "course graphed"
VARIANTS = ("stock", "sdpa bf16", "course", GRAPHED)
# kernel name -> what it does, first match wins (CUDA kernel names of PyTorch, cuBLAS, bitsandbytes, Triton).
# PyTorch's own RMSNorm is a handful of elementwise and reduction kernels: it lands in "other".
CATEGORIES = (("RMSNorm", r"rms_norm"),
              ("rotary", r"_rotary_kernel"),
              ("SwiGLU", r"_swiglu_"),
              ("attention", r"flash|fmha|attn|attention|_fwd_kernel|_bwd_d"),
              ("nf4 dequantise", r"dequant"),
              ("matmul", r"gemm|cutlass|nvjet|sm90_|sm80_|matmul|splitk"))


GRAPHED_POOL_FACTOR, GRAPHED_POOL_BYTES = 1.3, GiB / 4  # the graphs' pool: padding to 64, blocks shapes leave unused
SLOW_CARD_STEPS = 8  # a card that emulates bf16 trains at most this many steps a batch size
PACING_ORDER = ("stock", "course", GRAPHED, "sdpa bf16")  # paced side by side while the card holds them together


def variant_model_bytes(spec: ModelSpec, lora: LoraSettings = LoraSettings()) -> float:
    """Device bytes of one built variant: the nf4 linears, the embedding and lm_head in fp32 (peft's k-bit
    preparation), and the LoRA weights with their gradients and AdamW's two moments (fp32)."""
    h, i = spec.hidden_size, spec.intermediate_size
    kv = h * spec.num_key_value_heads // spec.num_attention_heads
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, i),
              "up_proj": (h, i), "down_proj": (i, h)}
    adapters = spec.num_hidden_layers * sum(lora.r * sum(shapes[m]) for m in lora.target_modules)
    return nf4_bytes(spec) + 2 * spec.vocab_size * h * 4 + 4 * 4 * adapters


def activation_bytes(spec: ModelSpec, tokens: int) -> float:
    """Activations of one checkpointed step over ``tokens`` (batch x padded width), fp32 after peft's preparation:
    each layer's input kept, one layer recomputed with its backward, and the logits with their log-softmax and
    gradient. An upper bound of the eager peaks measured on the H200 (a test holds it there)."""
    h, i = spec.hidden_size, spec.intermediate_size
    return tokens * 4 * (spec.num_hidden_layers * h + 6 * h + 4 * i + 3 * spec.vocab_size)


def step_bytes(spec: ModelSpec, variant: str, batch_size: int, max_len: int) -> float:
    """Peak device bytes of one variant's training runs at ``batch_size`` (texts cut at ``max_len``; the first
    batch holds the longest texts): its model and the step's activations; for the graphed step, the graphs' pool
    that keeps them between steps."""
    act = activation_bytes(spec, batch_size * max_len)
    if variant == GRAPHED:
        act = GRAPHED_POOL_FACTOR * act + GRAPHED_POOL_BYTES
    return variant_model_bytes(spec) + act


def pacing_bytes(spec: ModelSpec, paced: tuple[str, ...], batch_size: int, max_len: int) -> float:
    """Device bytes of :func:`pacing_side_by_side`: every paced variant's model held together, the graphed step's
    pool (it stays reserved between replays) and one eager step's activations."""
    model = variant_model_bytes(spec)
    graphed = step_bytes(spec, GRAPHED, batch_size, max_len) - model if GRAPHED in paced else 0.0
    eager = activation_bytes(spec, batch_size * max_len) if set(paced) - {GRAPHED} else 0.0
    return len(paced) * model + graphed + eager


@dataclass(frozen=True)
class TrainingPlan:
    """What notebook 07's training part runs on one card (:func:`training_plan`)."""

    variants: tuple[str, ...]  # trained, in this order
    batches: dict[int, int]  # batch size -> steps, for every variant but the graphed one
    graphed_batches: tuple[int, ...]  # the batch sizes the graphed step trains
    hold: bool  # keep each variant's model built for the pacing (else built for its runs and freed)
    paced: dict[int, tuple[str, ...]]  # batch size -> the variants paced side by side
    lines: tuple[str, ...]  # one line for each thing left out or changed, and why

    @property
    def curve_batch(self) -> int:
        """The batch size of the loss curve: the one that trains the most steps."""
        return max(self.batches, key=self.batches.get)

    def runs(self, variant: str) -> list[int]:
        """The batch sizes ``variant`` trains."""
        return list(self.graphed_batches) if variant == GRAPHED else list(self.batches)


def training_plan(card: CardLimits | None, model_name: str, batches: dict[int, int], max_len: int,
                  vocab_size: int | None = None) -> TrainingPlan:
    """Notebook 07's training runs sized to ``card`` (None: a CPU, no graphs, no memory plan). A batch size
    whose eager step (:func:`step_bytes`) does not fit is left out for every variant; the graphed step only
    where its larger pool fits, and not at all if it does not fit the loss curve's batch. The models stay built
    for the pacing if all of them fit beside every run; the pacing at each of the smallest and the loss-curve
    batch takes the variants of ``PACING_ORDER`` while they fit together (stock and course at least)."""
    if card is None:
        eager = tuple(v for v in VARIANTS if v != GRAPHED)
        curve = max(batches, key=batches.get)
        return TrainingPlan(eager, dict(batches), (), True, {b: eager for b in sorted({min(batches), curve})}, ())
    spec, lines = spec_for(model_name, vocab_size), []
    if not card.native_bf16:
        batches = {b: min(n, SLOW_CARD_STEPS) for b, n in batches.items()}
        lines.append(f"{card.slow_triton_reason()}: {SLOW_CARD_STEPS} steps at most a batch size")
    fits = {}
    for b in batches:
        need = max(step_bytes(spec, v, b, max_len) for v in VARIANTS if v != GRAPHED)
        fits[b] = card.fits(need)
        if not fits[b]:
            lines.append(card.skip_line(f"the {model_name} QLoRA step at batch {b}", need))
    batches = {b: n for b, n in batches.items() if fits[b]}
    if not batches:
        raise ValueError(f"{card.name} fits no batch size of the {model_name} QLoRA step: " + "; ".join(lines))
    curve = max(batches, key=batches.get)
    graphed = []
    for b in batches:
        need = step_bytes(spec, GRAPHED, b, max_len)
        if card.fits(need):
            graphed.append(b)
        else:
            lines.append(card.skip_line(f"the graphed {model_name} step at batch {b}", need))
    variants = VARIANTS if curve in graphed else tuple(v for v in VARIANTS if v != GRAPHED)
    if curve not in graphed:
        lines.append(f"{GRAPHED} left out on {card.name}: its loss curve at batch {curve} does not fit")
        graphed = []
    model = variant_model_bytes(spec)
    held = max(i * model + step_bytes(spec, v, b, max_len) for i, v in enumerate(variants)
               for b in (graphed if v == GRAPHED else batches))
    hold = card.fits(held)
    if not hold:
        lines.append(f"each model built for its own runs, then freed: all four beside a run need about "
                     f"{held / GiB:.1f} GiB, over 85% of this card's {card.memory_gib:.1f} GiB")
    paced = {}
    for b in sorted({min(batches), curve}):
        chosen: tuple[str, ...] = ()
        for v in PACING_ORDER:
            if v in variants and card.fits(pacing_bytes(spec, chosen + (v,), b, max_len)):
                chosen += (v,)
        if {"stock", "course"} <= set(chosen):
            paced[b] = tuple(v for v in variants if v in chosen)
        else:
            lines.append(card.skip_line(f"the side-by-side pacing at batch {b}",
                                        pacing_bytes(spec, ("stock", "course"), b, max_len)))
    return TrainingPlan(variants, batches, tuple(graphed), hold, paced, tuple(lines))


def variants(device: torch.device) -> tuple[str, ...]:
    """The variants ``device`` can run: CUDA graphs need a GPU."""
    return VARIANTS if device.type == "cuda" else tuple(v for v in VARIANTS if v != GRAPHED)


def build(model_name: str, variant: str, data: TokenizedData, device: torch.device, seed: int = 0):
    """The model of one variant, ready to train; (model, what the course's kernels replaced). The
    model keeps its initial LoRA weights (``reset_lora`` puts them back), so one build serves several runs."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    model, _ = build_model(model_name, device, vocab_size=data.vocab_size, attn="sdpa", seed=seed)
    torch.manual_seed(seed)  # the same adapters for every variant
    model = attach_lora(model, LoraSettings(), gradient_checkpointing=True)
    if variant in ("course", GRAPHED):
        changed = use_course_kernels(model)
    elif variant == "sdpa bf16":
        use_attention(model, SDPA_BF16)
        changed = {"attention": SDPA_BF16}
    else:
        changed = {}
    model.train()  # checkpointing only recomputes in training mode
    model.initial_lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return model, changed


def reset_lora(model: torch.nn.Module) -> None:
    """Put a model from :func:`build` back to its initial LoRA weights (the frozen nf4 weights never change)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(model.initial_lora[n])
    model.zero_grad(set_to_none=True)


def lora_gradients(model: torch.nn.Module, batch: dict, seed: int = 0) -> torch.Tensor:
    """Every LoRA weight's gradient for one batch, as one fp32 vector on the CPU (gradients cleared after)."""
    torch.manual_seed(seed)
    model(**batch).loss.backward()
    grads = [p.grad.float().flatten().cpu() for n, p in model.named_parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    return torch.cat(grads)


def warm_up(model: torch.nn.Module, batches: list[dict], device: torch.device) -> int:
    """One forward + backward (no update) on a batch of each shape class among ``batches``: the padded
    width's autotuning bucket and whether it is a multiple of 16 (Triton compiles the two apart), so
    that autotuning and compiling stay out of timed steps. Every variant gets the same warm-up.
    Returns the number of batches run."""
    shapes: dict[tuple[int, bool], dict] = {}
    for batch in batches:
        width = batch["input_ids"].shape[1]
        shapes.setdefault((tuning_bucket(width), width % 16 == 0), batch)
    for batch in shapes.values():
        model(**{k: v.to(device) for k, v in batch.items()}).loss.backward()
    model.zero_grad(set_to_none=True)
    return len(shapes)


def train(model_name: str, variant: str, batch_size: int, data: TokenizedData, device: torch.device, *,
          steps: int = 50, warmup_steps: int = 2, max_len: int | None = 1024, seed: int = 0,
          built: tuple[torch.nn.Module, dict] | None = None,
          others_bytes: int = 0) -> tuple[dict, list[float], torch.Tensor]:
    """Train ``steps`` steps (the first ``warmup_steps`` untimed). Returns a flat record (for
    ``helpers.results``), every step's loss, and the LoRA gradients of the first batch before training.
    ``built``: :func:`build`'s result for this model, variant and seed, reused from its initial LoRA
    weights (the same start as a new build); None: built here and freed after. ``others_bytes``: device
    memory held meanwhile by other models (kept for a later comparison), left out of the peak."""
    if steps <= warmup_steps:
        raise ValueError(f"steps ({steps}) must be more than warmup_steps ({warmup_steps})")
    model, changed = built or build(model_name, variant, data, device, seed)
    reset_lora(model)
    batches = make_batches(data.token_ids, batch_size, steps, max_len, seed=seed)
    checkpointing = check_checkpointing(model, batches[0]["input_ids"][:1, :16].to(device))
    grads = lora_gradients(model, {k: v.to(device) for k, v in batches[0].items()}, seed)
    if variant != GRAPHED:  # a graph's capture warms its own shape up
        warm_up(model, batches[warmup_steps:], device)
    if device.type == "cuda":
        gc.collect()  # garbage of earlier work (a decoder's graphs and the model they hold) out of the peak
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(seed)  # the same LoRA dropout masks for every eager variant
    graphs = {}
    if variant == GRAPHED:
        times, losses, graphs = _graphed_steps(model, batches, device, warmup_steps)
        peak = max(torch.cuda.max_memory_allocated(device), graphs.pop("held_bytes"))
    else:
        times, _, losses = run_timed_steps(model, batches, device, warmup_steps, None)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    tokens = sum(int(b["attention_mask"].sum()) for b in batches[warmup_steps:])
    peak = None if peak is None else (peak - others_bytes) / GiB
    model.zero_grad(set_to_none=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    replaced = ", ".join(f"{k}: {v}" for k, v in changed.items()) or "nothing"
    return ({"model": model_name, "variant": variant, "batch_size": batch_size, "steps": steps, "max_len": max_len,
             "step_s": statistics.median(times), "tokens_per_s": tokens / sum(times), "peak_alloc_gb": peak,
             "final_loss": losses[-1], "checkpointing": checkpointing, "replaced": replaced, **graphs}, losses, grads)


def _graphed_steps(model: torch.nn.Module, batches: list[dict], device: torch.device,
                   warmup_steps: int) -> tuple[list[float], list[float], dict]:
    """``run_timed_steps``' contract through CUDA graphs: one captured per padded shape before the first step (an
    untimed one-off cost, returned as ``capture_s``), then each step a replay, timed with the device synchronised
    on both sides. The dict also holds ``held_bytes``: the device memory allocated after the last step plus what
    the graphs' pool reserves beyond its live tensors (the memory the graphs keep between steps)."""
    step = GraphedTrainStep(model)
    sync(device)
    t0 = time.perf_counter()
    graphs = step.capture(batches)
    capture_s = time.perf_counter() - t0
    times, losses, _ = time_steps(step.step, batches, device, warmup_steps)
    reserved, live = step.pool_bytes()
    held = torch.cuda.memory_allocated(device) + reserved - live
    return times, [float(x) for x in losses], {"graphs": graphs, "capture_s": capture_s, "held_bytes": held}


def category(kernel: str) -> str:
    """What a kernel does, from its name (see ``CATEGORIES``); "other" when nothing matches."""
    for name, pattern in CATEGORIES:
        if re.search(pattern, kernel, re.IGNORECASE):
            return name
    return "other"


def by_category(rows: list[dict]) -> dict[str, float]:
    """Milliseconds per kernel category of ``bench.profile_kernels``' rows (per repetition)."""
    out: dict[str, float] = {}
    for r in rows:
        out[category(r["name"])] = out.get(category(r["name"]), 0.0) + r["calls"] * r["us_per_call"] / 1e3
    return out


def _stepper(model: torch.nn.Module, variant: str, batches: list[dict], device: torch.device):
    """A function that trains ``model`` one step (forward, backward, AdamW) on a batch: eagerly, or for
    ``GRAPHED`` a graph replay (the graphs of ``batches``' shapes captured here)."""
    if variant == GRAPHED:  # its own AdamW (capturable, gradients zeroed in place): a graph replays fixed addresses
        graphed = GraphedTrainStep(model)
        graphed.capture(batches)
        return graphed.step
    step = train_step(model)
    return lambda batch: step(to_device(batch, device))  # the copy to the device timed too, as a replay's is


def _pacing_parts(step, batches: list[dict]) -> dict[str, float]:
    """Milliseconds per kernel category of one training step, the mean over ``batches[1:]`` under the
    profiler (``batches[0]`` warms up outside it)."""
    todo = iter(batches)
    return by_category(profile_kernels(lambda: step(next(todo)), reps=len(batches) - 1))


def _pacing_record(model_name: str, variant: str, batch_size: int, steps: int, walls: list[float],
                   by_category: dict[str, float]) -> dict:
    wall_ms, kernel_ms = 1e3 * statistics.median(walls), sum(by_category.values())
    return {"model": model_name, "variant": variant, "batch_size": batch_size, "steps": steps, "rounds": len(walls),
            "wall_ms": wall_ms, "wall_ms_min": 1e3 * min(walls), "wall_ms_max": 1e3 * max(walls),
            "kernel_ms": kernel_ms, "idle_ms": max(0.0, wall_ms - kernel_ms),
            **{f"{name} ms": ms for name, ms in by_category.items()}}


def pacing_side_by_side(model_name: str, variants: list[str], batch_size: int, data: TokenizedData,
                        device: torch.device, steps: int = 8, max_len: int | None = 1024, seed: int = 0,
                        rounds: int = 1, built: dict | None = None) -> list[dict]:
    """Who sets the pace of a training step (forward, backward, AdamW), for each variant, their models held
    together: the same ``steps`` batches (after one warm-up batch) are trained, timed with the device
    synchronised around each step (``wall_ms``), ``rounds`` times with the variants in turn (so that a drift
    of the host's speed touches them all alike; the median recorded, ``wall_ms_min``/``wall_ms_max`` the
    spread), then once under the profiler (``kernel_ms``: the time the device spends in kernels, on a CPU in
    ``aten`` operators; ``"<category> ms"``: its share per kernel category, see ``CATEGORIES``). The rest of
    the wall time (``idle_ms``) the device waits for the host; no kernel can take it. All per step.
    ``built``: variant -> :func:`build`'s result (trained further here), for those already built."""
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be >= 1, got rounds={rounds}, steps={steps}")
    if len(set(variants)) != len(variants):
        raise ValueError(f"each variant once, got {variants}")
    built = built or {}
    batches = make_batches(data.token_ids, batch_size, steps + 1, max_len, seed=seed)
    steppers = {}
    for variant in variants:
        model = (built.get(variant) or build(model_name, variant, data, device, seed))[0]
        warm_up(model, batches, device)
        steppers[variant] = _stepper(model, variant, batches, device)
    walls: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for variant, step in steppers.items():
            walls[variant].append(statistics.fmean(time_steps(step, batches, device, 1)[0]))
    return [_pacing_record(model_name, v, batch_size, steps, walls[v], _pacing_parts(steppers[v], batches))
            for v in variants]
