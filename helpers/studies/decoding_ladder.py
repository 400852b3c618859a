"""The decoding ladder of notebook 07: the stock path, then one change at a time, each timed and checked.

Every variant decodes the same model greedily at batch ``B``; tokens/s counts new tokens of all
sequences. Each variant's correctness is checked teacher-forced: the logits it computes, fed the
same token sequence one token at a time, against the model's own forward over the whole sequence.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

import torch
from torch import nn

from ..card_fit import GiB, CardLimits
from ..llama import kernel_set
from ..llama.decoding import Decoder
from ..llama.models import ModelSpec, nf4_bytes, spec_for

VARIANTS = ("stock generate", "static cache", "static cache + CUDA graph", "+ fused nf4 GEMV", "+ fused RMSNorm",
            "+ fused rotary & KV write", "+ fused SwiGLU & residual add", "+ attention over the live cache")


PROMPT_LEN, NEW_TOKENS = 16, 128  # the ladder's prompt and new tokens at full scale (notebook 07's settings)


# the first rung at which each Decoder hook is the course's kernel (kernel_set.COURSE) instead of the stock one
FIRST_RUNG = {"linear": 3, "linear_group": 3, "norm": 4, "rope": 5, "swiglu_linear": 6, "add_norm": 6, "attention": 7}


def ladder_bytes(spec: ModelSpec, max_len: int, batch_size: int = 1) -> float:
    """Device bytes of the ladder on one model: the nf4 weights, the bf16 embedding and lm_head, a static KV cache
    of ``max_len`` positions for each rung's decoder (every rung stays built until the rounds end), and 1 GiB for
    the graphs' activations, the check's logits and the libraries' workspaces."""
    caches = (len(VARIANTS) - 1) * batch_size * max_len * spec.kv_bytes_per_token()
    return nf4_bytes(spec) + 2 * spec.vocab_size * spec.hidden_size * 2 + caches + GiB


def ladder_plan(card: CardLimits | None, names: list[str], vocab_size: int,
                max_len: int) -> tuple[list[str], list[str]]:
    """The models whose ladder this card holds (:func:`ladder_bytes`), and one line for each it skips (and one on
    a card that emulates bf16). Without a GPU (card None) every model runs (smoke scale: tiny models on the CPU)."""
    if card is None:
        return list(names), []
    keep, lines = [], []
    if not card.native_bf16:
        lines.append(f"{card.slow_triton_reason()}: every (bf16) rung runs slower than on an sm_80 card")
    for name in names:
        need = ladder_bytes(spec_for(name, vocab_size), max_len)
        if card.fits(need):
            keep.append(name)
        else:
            lines.append(card.skip_line(f"the {name} decoding ladder", need))
    return keep, lines


def rung_kernels(variant: str) -> dict[str, Callable]:
    """The Decoder hooks of a rung: each rung keeps the kernels of the one before it and takes one more part
    of the model from ``kernel_set.COURSE``; the rest stays ``kernel_set.STOCK``'s."""
    rung = VARIANTS.index(variant)
    course, stock = kernel_set.COURSE.decoder_hooks(), kernel_set.STOCK.decoder_hooks()
    return {part: (course if rung >= first else stock)[part] for part, first in FIRST_RUNG.items()}


def decoder(model: nn.Module, variant: str, max_len: int, batch_size: int = 1) -> Decoder:
    """The ``Decoder`` of a ladder step (every step but the stock one)."""
    if variant not in VARIANTS[1:]:
        raise ValueError(f"variant must be one of {VARIANTS[1:]}, got {variant!r}")
    # a model on the CPU (smoke scale) runs the same code without the graph
    graph = variant != "static cache" and next(model.parameters()).device.type == "cuda"
    return Decoder(model, max_len, batch_size, graph=graph, **rung_kernels(variant))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def runner(model: nn.Module, variant: str, prompt: torch.Tensor, new_tokens: int) -> Callable[[], float]:
    """A function that decodes ``new_tokens`` after ``prompt`` (B, T) once and returns the seconds it took.

    The stock variant is ``model.generate`` (it also encodes the prompt: one forward, a negligible
    share at 64+ new tokens); the others time ``Decoder.generate`` after their prefill (the decoder built
    once, here).
    """
    device = prompt.device
    if variant == VARIANTS[0]:
        @torch.no_grad()
        def run() -> float:
            _sync(device)
            start = time.perf_counter()
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, use_cache=True)
            _sync(device)
            return time.perf_counter() - start
    else:
        dec = decoder(model, variant, prompt.shape[1] + new_tokens, prompt.shape[0])

        @torch.no_grad()
        def run() -> float:
            dec.prefill(prompt)
            _sync(device)
            start = time.perf_counter()
            dec.generate(new_tokens)
            _sync(device)
            return time.perf_counter() - start
    return run


def relative_error(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest error over every position, relative to the largest reference logit at that position."""
    return float(((logits - reference).abs() / reference.abs().amax(-1, keepdim=True)).max())


@torch.no_grad()
def logits_error(model: nn.Module, variant: str, tokens: torch.Tensor, reference: torch.Tensor) -> float:
    """Error of a variant's teacher-forced logits over every position of ``tokens`` (B, T) against
    ``reference``, the model's own forward over the whole sequence (fp32 logits)."""
    return relative_error(decoder(model, variant, tokens.shape[1], tokens.shape[0]).teacher_forced(tokens),
                          reference)


@torch.no_grad()
def cached_decode_error(model: nn.Module, tokens: torch.Tensor, reference: torch.Tensor) -> float:
    """The same measure for transformers' own token-by-token decoding (its KV cache): how far apart two
    correct bf16 computations of the same logits are, the floor that a variant's error is judged against."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.24 / 5.17
    cache, steps = None, []
    for t in range(tokens.shape[1]):
        out = model(tokens[:, t:t + 1], use_cache=True, **({name: cache} if cache is not None else {}))
        cache = out[name]
        steps.append(out.logits[:, -1].float())
    return relative_error(torch.stack(steps, dim=1), reference)


def logits_ok(record: dict, margin: float = 1.5, minimum: float = 2e-2) -> bool:
    """A rung's logits check: its error at most ``margin`` x transformers' own decoding error on the same
    tokens, and never held below ``minimum`` (bf16 roundings compounded over a few layers)."""
    error = record["logits_max_rel_error"]
    return error is None or error <= max(margin * record["transformers_decode_error"], minimum)


def ladder(model: nn.Module, model_name: str, bytes_per_step: float, bandwidth_gbps: float, *,
           batch_size: int = 1, prompt_len: int = PROMPT_LEN, new_tokens: int = NEW_TOKENS, eager_new_tokens: int = 64,
           check_len: int = 80, repeats: int = 3, variants: tuple[str, ...] = VARIANTS, seed: int = 0,
           progress: bool = True) -> list[dict]:
    """Time and check every variant; one record each. A variant's logits error is recorded beside
    transformers' own decoding error on the same tokens (``transformers_decode_error``), its yardstick.

    ``bytes_per_step``: what one decode step (one token for each of the B sequences) must read at
    least; ``bandwidth_gbps``: the measured copy bandwidth. The roofline is B x bandwidth / bytes per
    step: the tokens/s if every step only moved its bytes.
    The rungs without a CUDA graph, one or two orders of magnitude slower, are timed on ``eager_new_tokens``.
    Timing: each variant runs once untimed, then ``repeats`` rounds take the variants in turn, one timed
    run each (a drift of the host's speed touches every rung alike); ``seconds`` is the median,
    ``"round {r} seconds"`` each round's time (round r of every variant taken in the same pass; see
    :func:`round_seconds`).
    """
    from tqdm.auto import tqdm

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {VARIANTS}")
    device = model.model.embed_tokens.weight.device
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, vocab, (batch_size, prompt_len), generator=gen).to(device)
    check = torch.randint(3, vocab, (batch_size, check_len), generator=gen).to(device)
    roofline = bandwidth_gbps * 1e9 / bytes_per_step * batch_size
    with torch.no_grad():
        reference = model(check).logits.float()
    floor = cached_decode_error(model, check, reference)
    if repeats < 1:
        raise ValueError(f"repeats (rounds) must be >= 1, got {repeats}")
    tokens = {v: eager_new_tokens if v in VARIANTS[:2] else new_tokens for v in variants}
    runs = {}
    for variant in tqdm(variants, desc=f"{model_name} decoding ladder: warm-up", disable=not progress):
        runs[variant] = runner(model, variant, prompt, tokens[variant])
        runs[variant]()
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in tqdm(range(repeats), desc=f"{model_name} decoding ladder: rounds", disable=not progress):
        for variant, run in runs.items():
            times[variant].append(run())
    del runs
    records = []
    for variant in variants:
        n, seconds = tokens[variant], statistics.median(times[variant])
        records.append({"model": model_name, "variant": variant, "batch_size": batch_size, "new_tokens": n,
                        "prompt_tokens": prompt_len, "seconds": seconds, "tokens_per_s": batch_size * n / seconds,
                        **{f"round {i} seconds": t for i, t in enumerate(times[variant])},
                        "roofline_tokens_per_s": roofline,
                        "logits_max_rel_error": None if variant == VARIANTS[0]
                        else logits_error(model, variant, check, reference),
                        "transformers_decode_error": floor,  # the same check of transformers' own decoding
                        "checked_positions": check_len})  # the stock path is the reference itself
    return records


@torch.no_grad()
def graphed_decode_parts(model: nn.Module, contexts: list[int], new_tokens: int = 32, rounds: int = 5,
                         variant: str = VARIANTS[-1]) -> list[dict]:
    """Time per new token of the course's decoder (``variant``: the ladder's last rung by default, one CUDA graph
    a step on a GPU) at each context length, split as ``finetune.generate.decode_parts`` splits stock
    ``generate()``: the device's time (CUDA events around the run; the host queues replays faster than the GPU
    runs them, so the device never waits) and the host's (the rest of the wall time). Each run decodes
    ``new_tokens`` from position ``context``: the cache before it holds whatever is there, since a step's time
    depends on how many positions it reads, not on their values. Medians of ``rounds`` after one round of
    warm-up, the contexts in turn within each round. On a CPU the device is the host: its time is all device."""
    if not contexts or min(contexts) < 1 or new_tokens < 1 or rounds < 1:
        raise ValueError(f"need contexts >= 1, new_tokens >= 1 and rounds >= 1, got {contexts}, {new_tokens}, "
                         f"{rounds}")
    device = model.model.embed_tokens.weight.device
    dec = decoder(model, variant, max(contexts) + new_tokens)
    dec.prefill(torch.full((1, 1), 3, dtype=torch.long, device=device))  # captures the graph; logits in place
    walls: dict[int, list[float]] = {c: [] for c in contexts}
    busy: dict[int, list[float]] = {c: [] for c in contexts}
    for round_ in range(rounds + 1):
        for c in contexts:
            dec.pos.fill_(c)
            _sync(device)
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            dec.generate(new_tokens)
            if device.type == "cuda":
                end.record()
            _sync(device)
            wall = time.perf_counter() - t0
            if round_:  # round 0 warms up
                walls[c].append(wall / new_tokens)
                busy[c].append((start.elapsed_time(end) / 1e3 if device.type == "cuda" else wall) / new_tokens)
    records = []
    for c in contexts:
        per_token, dev = statistics.median(walls[c]), statistics.median(busy[c])
        records.append({"what": "graphed_decode_parts", "variant": variant, "kv_cache": True, "context": c,
                        "new_tokens": new_tokens, "rounds": rounds, "s_per_token": per_token,
                        "s_per_token_min": min(walls[c]), "s_per_token_max": max(walls[c]),
                        "device_s_per_token": min(dev, per_token), "host_s_per_token": max(0.0, per_token - dev)})
    return records


LLAMA_7B_SHAPES = {"q, k, v, o (4096 x 4096)": (4096, 4096), "gate, up (11008 x 4096)": (11008, 4096),
                   "down (4096 x 11008)": (4096, 11008), "vocabulary-sized (32000 x 4096)": (32000, 4096)}
GEMV_IMPLS = ("bitsandbytes", "dequantize + matmul", "course")


def nf4_gemv_bytes(n: int, k: int, rows: int = 1) -> float:
    """Bytes ``x @ W^T`` must move for an nf4 ``W`` (N, K), nested scales, and bf16 ``x`` (rows, K) and y."""
    return n * k / 2 + n * k / 64 + 4 * n * k / (64 * 256) + 2 * rows * (n + k)


def nf4_weights(n: int, k: int, min_bytes: float = 150e6, seed: int = 0) -> list[tuple]:
    """Random (N, K) weights quantised by bitsandbytes (nf4, nested scales), as many distinct copies as
    it takes to hold ``min_bytes`` (three H200 L2 caches by default): timed one after the other, each
    call reads its weight from HBM, as in a model."""
    import bitsandbytes.functional as bnbf

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    copies = max(2, -int(-min_bytes // nf4_gemv_bytes(n, k))) if device == "cuda" else 1
    weights = []
    for _ in range(copies):
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
        weights.append(bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True))
    return weights


def _gemv_inputs(shapes: dict[str, tuple[int, int]], rows: int, seed: int):
    """Per shape: ``(label, n, k, weights, ops, x)``: :func:`nf4_weights`' copies of a random (N, K) weight,
    the course kernel's operands for each, and a random bf16 ``x`` (rows, K)."""
    from ..kernels.nf4_format import nf4_operands

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    for label, (n, k) in shapes.items():
        weights = nf4_weights(n, k, seed=seed)
        item = (label, n, k, weights, [nf4_operands(w) for w in weights],
                torch.randn(rows, k, device=device, dtype=torch.bfloat16, generator=gen))
        del weights
        yield item
        del item  # this frame holds no weights while the next shape's are made


def gemv_bandwidth(shapes: dict[str, tuple[int, int]], rows: int = 1, seed: int = 0) -> list[dict]:
    """Time ``x @ W^T`` for an nf4 ``W`` (N, K) and bf16 ``x`` (rows, K) three ways: bitsandbytes'
    ``matmul_4bit`` (what ``Linear4bit`` runs at inference: its fused 4-bit kernel), bitsandbytes'
    dequantisation then a bf16 matmul (what training runs), and the course's fused kernel.
    Timed as a decoder runs them (``bench.time_in_graph``: one CUDA graph over copies of the weight that
    together exceed the L2 cache). ``gbps`` counts the bytes the fused kernel must move (packed codes,
    nested scales, x, y), so it is comparable with the copy bandwidth whatever the implementation does."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    from ..bench import time_in_graph
    from ..kernels.nf4_gemv import nf4_matmul

    records = []
    for label, n, k, weights, ops, x in _gemv_inputs(shapes, rows, seed):
        impls = {"bitsandbytes": [lambda w=w: bnb.matmul_4bit(x, w[0].t(), quant_state=w[1]) for w in weights],
                 "dequantize + matmul": [lambda w=w: torch.nn.functional.linear(x, bnbf.dequantize_4bit(*w))
                                         for w in weights],
                 "course": [lambda o=o: nf4_matmul(x, o) for o in ops]}
        moved = nf4_gemv_bytes(n, k, rows)
        for impl in GEMV_IMPLS:
            timing = time_in_graph(impls[impl])
            records.append({"shape": label, "N": n, "K": k, "rows": rows, "impl": impl, "ms": timing.ms,
                            "gbps": moved / (timing.ms * 1e-3) / 1e9, "copies": len(weights)})
        del weights, ops
    return records


def round_seconds(record: dict) -> list[float]:
    """A ladder record's time in each round, in order (``record``: a dict or a row of a DataFrame of them)."""
    rounds = sorted(int(key.split()[1]) for key in record.keys()
                    if key.startswith("round ") and key.endswith(" seconds"))
    return [record[f"round {r} seconds"] for r in rounds]


def speedup_per_round(fast: dict, slow: dict) -> list[float]:
    """Tokens/s of ladder record ``fast`` over ``slow``'s, round by round (rounds taken in the same pass)."""
    f, s = round_seconds(fast), round_seconds(slow)
    if len(f) != len(s) or not f:
        raise ValueError(f"the two records must hold the same rounds, got {len(f)} and {len(s)}")
    return [(fast["new_tokens"] / a) / (slow["new_tokens"] / b) for a, b in zip(f, s)]


def _nf4_rungs(x: torch.Tensor, ops, scales: torch.Tensor) -> dict[str, tuple[str, list[Callable]]]:
    """Notebook 07's nf4 ladder for one row of ``x``: rung name -> (launch, the calls on each weight)."""
    from ..kernels.nf4_gemv import Config, config_for, nf4_matmul
    from ..kernels.teaching.nf4_gemv_simple import BLOCK_K, BLOCK_N, nf4_matvec

    narrow = Config(BLOCK_N, BLOCK_K, 4)  # rung 1's tile, kept until rung 5 widens it
    tuned = config_for(1, ops[0].n, ops[0].k, ops[0].blocksize, x.dtype)
    wide = dataclasses.replace(tuned, prefetch=False)
    tile = f"{BLOCK_N} x {BLOCK_K}"
    wide_tile = f"{tuned.block_n} x {tuned.block_k}" + (f", K in {tuned.split_k} slices" if tuned.split_k > 1 else "")
    return {"1 plain kernel": (f"{tile}, fp32 scales",
                               [lambda o=o, s=s: nf4_matvec(x, o, s) for o, s in zip(ops, scales)]),
            "2 1-byte scale codes": (f"{tile}, scales decoded in the kernel",
                                     [lambda o=o: nf4_matvec(x, o, nested_scales=True) for o in ops]),
            "3 32-bit words": (f"{tile}, a block's sum scaled once, table in memory",
                               [lambda o=o: nf4_matmul(x, o, config=narrow, asm=False) for o in ops]),
            "4 PTX lookup": (f"{tile}, table in registers", [lambda o=o: nf4_matmul(x, o, config=narrow) for o in ops]),
            "5 wider tile": (f"{wide_tile}, table in registers",
                             [lambda o=o: nf4_matmul(x, o, config=wide) for o in ops]),
            "6 next chunk ahead": (f"{wide_tile}, prefetch: the tuned kernel",
                                   [lambda o=o: nf4_matmul(x, o) for o in ops])}


def nf4_ladder(shapes: dict[str, tuple[int, int]], bandwidth_gbps: float, seed: int = 0, reps: int = 10) -> list[dict]:
    """Notebook 07's nf4 matrix-vector ladder for one bf16 row of x, each rung one change to the one before
    (rung 6: the tuned kernel as the decoder runs it), with bitsandbytes' ``matmul_4bit`` as the
    reference (rung None). Each rung is checked on the first weight against float64 (``rel_err``: largest
    error over the largest |y|) and timed as :func:`gemv_bandwidth` times (``bench.time_in_graph``, ``reps``
    replays); ``pct_of_copy`` counts the bytes the tuned kernel must move against ``bandwidth_gbps``."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    from ..bench import time_in_graph
    from ..kernels.teaching.nf4_gemv_simple import block_scales

    records = []
    for label, n, k, weights, ops, x in _gemv_inputs(shapes, 1, seed):
        reference = x.double() @ bnbf.dequantize_4bit(*weights[0]).double().T
        moved = nf4_gemv_bytes(n, k)
        bnb_calls = [lambda w=w: bnb.matmul_4bit(x, w[0].t(), quant_state=w[1]) for w in weights]
        rungs = {"bitsandbytes": ("matmul_4bit (its fused 4-bit kernel)", bnb_calls),
                 **_nf4_rungs(x, ops, [block_scales(o) for o in ops])}
        for name, (launch, calls) in rungs.items():
            error = float((calls[0]().double() - reference).abs().max() / reference.abs().max())
            ms = time_in_graph(calls, reps=reps).ms
            records.append({"shape": label, "N": n, "K": k, "rung": None if name == "bitsandbytes" else int(name[0]),
                            "impl": name, "launch": launch, "ms": ms, "gbps": moved / (ms * 1e-3) / 1e9,
                            "pct_of_copy": 100 * moved / (ms * 1e-3) / 1e9 / bandwidth_gbps,
                            "copy_gbps": bandwidth_gbps, "rel_err": error, "copies": len(weights)})
        del weights, ops
    return records

