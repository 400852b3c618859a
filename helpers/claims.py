"""The seed articles' nine claims (``../shared/seeds/README.md``) and this run's verdict on each.

Each verdict is computed from the committed results files (``results/<gpu>/<topic>.json``) by the rule
printed beside it; where those files cannot decide a claim, the verdict says "not decided by this run" and
why. A notebook shows its own claims with ``claims.show(notebook="04")``; the README's table comes from
:func:`table` (``scripts/update_readme.py``).
"""
from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass
from typing import Callable, NamedTuple

import pandas as pd

from .studies import attention_designs, bandwidth_elasticity, eager_chain, roofline
from . import results, datasheets
from .device import SCALE
from .finetune import analysis, launch_replay, retime, step_model, transfer
from .llama import models

CONFIRMED, REFUTED, PARTLY, UNDECIDED = "confirmed", "refuted", "partly", "not decided by this run"
Loader = Callable[[str, str], "results.Result | None"]  # (topic, gpu folder) -> the file, or None if absent


class Verdict(NamedTuple):
    """A claim's verdict, the rule that gave it, the numbers the rule read, and (when undecided) why."""

    verdict: str
    rule: str
    evidence: dict
    why: str = ""


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    seed: str
    notebooks: tuple[str, ...]
    judge: Callable[[Loader, str], Verdict]


def committed(topic: str, gpu: str) -> results.Result | None:
    """The committed results file ``results/<gpu>/<topic>.json``; where ``gpu`` has not measured ``topic``, the
    reference H100's, else the H200's (``results.source_gpu``; a folder such as "h200x2" names a run on that many
    GPUs); None where no GPU has."""
    many = re.fullmatch(r".+x(\d+)", gpu)
    try:
        return results.load(topic, gpu=results.source_gpu(topic, prefer=gpu, gpus=int(many[1]) if many else 1))
    except FileNotFoundError:
        return None


def _missing(rule: str, *topics: str) -> Verdict:
    return Verdict(UNDECIDED, rule, {}, f"no results file {', '.join(f'{t}.json' for t in topics)}")


def _card(res: results.Result) -> datasheets.GpuSpec | None:
    return datasheets.lookup(res.provenance.get("gpu", ""))


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


# --- VRAM paradox ------------------------------------------------------------------------------------------


def chain_memory_bound(load: Loader, gpu: str) -> Verdict:
    rule = ("each forward kernel of the eager chain (results/<gpu>/naive_chain.json: bias add, GELU, LayerNorm): "
            "its FLOPs (notebook 02's count) over the bytes it must move, against the fp32 ridge (datasheet fp32 "
            "peak / the copy bandwidth measured in the same run): all below: confirmed, none: refuted, some: "
            "partly. A kernel's % of copy says how near its memory roof it ran, not what bounds it")
    res = load("naive_chain", gpu)
    if res is None:
        return _missing(rule, "naive_chain")
    spec = _card(res)
    if spec is None:
        return Verdict(UNDECIDED, rule, {}, f"no datasheet row for {res.provenance.get('gpu')}")
    ops = res.where(what="op", **{"pass": "fwd"})
    if not ops:
        return Verdict(UNDECIDED, rule, {}, "no forward kernel timed")
    copy = ops[0]["copy_gbps"]
    ridge = spec.fp32_tflops * 1e3 / copy
    flops = eager_chain.eager_forward_flops(ops[0]["M"], ops[0]["N"])
    intensity = {o["op"]: flops[o["op"]] / o["bytes"] for o in ops}
    slowest = min(ops, key=lambda o: o["gbps"])
    evidence = {"fp32 ridge (FLOP/byte)": round(ridge, 1),
                **{f"{op} (FLOP/byte)": round(i, 2) for op, i in intensity.items()},
                "% of copy": ", ".join(f"{o['op']} {100 * o['gbps'] / copy:.0f}" for o in ops),
                "slowest kernel": slowest["op"]}
    below = [i < ridge for i in intensity.values()]
    verdict = CONFIRMED if all(below) else REFUTED if not any(below) else PARTLY
    return Verdict(verdict, rule, evidence)


FUSION_TARGET = 3.0  # the seed's "3-4x": at least 3x eager

_T = f"{FUSION_TARGET:g}x"
FUSION_RULES = {  # the three parts of the seed's "3-4x with the same FLOPs"
    "forward": f"the fused forward over eager PyTorch's at every measured N and dtype: >= {_T} at all: confirmed; "
               "at some: partly; at none: refuted",
    "forward + backward": f"the same for forward + backward, on both clocks (device time in a CUDA graph, and "
                          f"called from Python): >= {_T} at every point of both: confirmed; below {_T} at every "
                          "point of both: refuted; otherwise partly",
    "the same FLOPs": "the tuned kernel computes exact GELU in another form (erf_exp2 for 16-bit storage, "
                      "erf_fp32 for fp32) than eager's library erf, so its FLOPs are not eager's; the kernel "
                      "with eager's formula and the library erf is the ladder's rung 1: rung 1 over eager "
                      f">= {_T} at every N and dtype: confirmed; at some: partly; at none: refuted"}


def _speedups(records: list[dict], pass_: str, timing: str) -> list[float]:
    """eager time / fused time at every (dtype, N) measured with ``pass_`` and ``timing``."""
    ms = {(r["dtype"], r["N"], r["impl"]): r["ms"] for r in records
          if r["pass"] == pass_ and r.get("timing", "events") == timing}
    return [ms[d, n, "eager"] / ms[d, n, "triton"] for d, n, impl in ms if impl == "triton" and (d, n, "eager") in ms]


def _ladder_ratios(ladder: list[dict], over: str | int, under: int) -> list[float]:
    """ms of ``over`` (a rung, or "eager") / ms of rung ``under``, at every (dtype, N) the ladder timed."""
    ms = {(r["dtype"], r["N"], "eager" if r.get("impl") == "eager" else r.get("rung")): r["ms"] for r in ladder}
    return [ms[d, n, over] / ms[d, n, under] for d, n, k in ms if k == under and (d, n, over) in ms]


def _at_least(xs: list[float], target: float) -> str:
    return CONFIRMED if min(xs) >= target else REFUTED if max(xs) < target else PARTLY


def fusion_parts(bench: list[dict], ladder: list[dict] | None, scale: str = "full") -> dict[str, Verdict]:
    """The seed's "3-4x with the same FLOPs" in three parts, each with its rule: the forward, the forward +
    backward, and the same FLOPs. ``bench``: notebook 04's benchmark records (fused_bias_gelu_layernorm.json);
    ``ladder``: its ladder's (fused_ladder.json), or None; ``scale``: a smoke-scale run decides nothing."""
    fwd, graph, called = (_speedups(bench, p, timing) for p, timing in
                          (("fwd", "events"), ("fwd+bwd", "graph"), ("fwd+bwd", "events")))
    forward = FUSION_RULES["forward"]
    parts = {"forward": Verdict(_at_least(fwd, FUSION_TARGET), forward, {"over eager": f"{_span(fwd)}x"})
             if fwd else Verdict(UNDECIDED, forward, {}, "no forward timed against eager")}
    if graph and called:
        train = (CONFIRMED if min(graph + called) >= FUSION_TARGET
                 else REFUTED if max(graph + called) < FUSION_TARGET else PARTLY)
        parts["forward + backward"] = Verdict(train, FUSION_RULES["forward + backward"],
                                              {"device time (CUDA graph) over eager": f"{_span(graph)}x",
                                               "called from Python over eager": f"{_span(called)}x"})
    else:
        parts["forward + backward"] = Verdict(UNDECIDED, FUSION_RULES["forward + backward"], {},
                                              "forward + backward not timed on both clocks")
    same = _ladder_ratios(ladder or [], "eager", 1)
    if same:
        gelu = _ladder_ratios(ladder, 1, 2)
        evidence = {"rung 1 (eager's formula, library erf) over eager": f"{_span(same)}x"}
        if gelu:
            evidence["rung 2 (the cheaper exact GELU) over rung 1"] = f"{_span(gelu)}x"
        parts["the same FLOPs"] = Verdict(_at_least(same, FUSION_TARGET), FUSION_RULES["the same FLOPs"], evidence)
    else:
        parts["the same FLOPs"] = Verdict(UNDECIDED, FUSION_RULES["the same FLOPs"], {},
                                          "no ladder timed: no results file fused_ladder.json (notebook 04)")
    if scale != "full":
        why = f"a {scale}-scale run: the CPU interpreter's times decide nothing"
        return {part: v._replace(verdict=UNDECIDED, why=why) for part, v in parts.items()}
    return parts


def fusion_speedup(load: Loader, gpu: str) -> Verdict:
    rule = ("in three parts (notebook 04), each with its rule: "
            + "; ".join(f"({i}) {part}: {rule}" for i, (part, rule) in enumerate(FUSION_RULES.items(), 1))
            + ". All three confirmed: confirmed; the forward refuted: refuted; a part not decided and the others "
            "confirmed: not decided; otherwise partly")
    res = load("fused_bias_gelu_layernorm", gpu)
    if res is None:
        return _missing(rule, "fused_bias_gelu_layernorm")
    ladder = load("fused_ladder", gpu)
    parts = fusion_parts(res.records, ladder.records if ladder else None, res.provenance.get("scale", "full"))
    evidence = {part: v.verdict + (f", {v.why}" if v.why else "") + (f": {_evidence_text(v.evidence)}"
                                                                     if v.evidence else "")
                for part, v in parts.items()}
    got = [v.verdict for v in parts.values()]
    if all(g == CONFIRMED for g in got):
        return Verdict(CONFIRMED, rule, evidence)
    if parts["forward"].verdict == REFUTED:
        return Verdict(REFUTED, rule, evidence)
    if UNDECIDED in got and all(g in (CONFIRMED, UNDECIDED) for g in got):
        return Verdict(UNDECIDED, rule, evidence, "; ".join(f"{p}: {v.why}" for p, v in parts.items() if v.why))
    return Verdict(PARTLY, rule, evidence)


def _backward_band(both: dict, fwd: dict) -> tuple[float, float, float]:
    """A backward's time, forward + backward minus forward: the medians' difference, and a band from the
    20th/80th percentiles (the medians alone where a record has no percentiles)."""
    def q(r: dict, k: str) -> float:
        return r.get(k) if r.get(k) is not None else r["ms"]
    return both["ms"] - fwd["ms"], q(both, "ms_p20") - q(fwd, "ms_p80"), q(both, "ms_p80") - q(fwd, "ms_p20")


BACKWARD_OUTCOME_RULE = ("a backward's time is forward + backward minus forward, with a band from the timings' 20th "
                         "and 80th percentiles; flash's backward is faster where its band lies below standard "
                         "attention's, slower where above, not decided where the two overlap")


def backward_outcomes(records: list[dict], flash: str = "triton") -> list[dict]:
    """Per non-causal shape where standard attention ("naive") and a FlashAttention (``flash``: "triton", this
    course's kernels, or "sdpa_flash", PyTorch's FlashAttention-2) both timed a forward and a forward + backward:
    each backward's time (ms) and the outcome: "faster" where flash's band (:func:`_backward_band`) lies below
    standard's, "slower" where above, "not decided" where they overlap."""
    timed = {(r["impl"], r["pass"], r["B"], r["H"], r["S"], r["D"]): r for r in records
             if r["status"] == "ok" and r["ms"] is not None and not r["causal"]}
    rows = []
    for b, h, s, d in sorted({k[2:] for k in timed}, key=lambda k: (k[2], k[0], k[3])):
        try:
            std, fl = (_backward_band(timed[impl, "fwd+bwd", b, h, s, d], timed[impl, "fwd", b, h, s, d])
                       for impl in ("naive", flash))
        except KeyError:
            continue
        outcome = "faster" if fl[2] < std[1] else "slower" if fl[1] > std[2] else UNDECIDED
        rows.append({"S": s, "B": b, "H": h, "D": d, "standard bwd ms": std[0], "flash bwd ms": fl[0],
                     "standard / flash": std[0] / fl[0], "outcome": outcome})
    return rows


def _by_length(rows: list[dict]) -> dict[str, str]:
    """Per sequence length: how many of its shapes' backwards were faster, slower, not decided."""
    out = {}
    for s in sorted({r["S"] for r in rows}):
        at = [r for r in rows if r["S"] == s]
        counts = ", ".join(f"{k} {sum(r['outcome'] == o for r in at)}"
                           for k, o in (("faster", "faster"), ("slower", "slower"), ("not decided", UNDECIDED)))
        slow = [f"B = {r['B']}, D = {r['D']}: {r['flash bwd ms']:.3f} vs {r['standard bwd ms']:.3f} ms"
                for r in at if r["outcome"] != "faster"]
        out[f"S = {s}"] = f"{counts} of {len(at)} timed shapes" + (f" ({'; '.join(slow)})" if slow else "")
    return out


def flash_backward(load: Loader, gpu: str) -> Verdict:
    flops = {d: attention_designs.design_matmul_flops(d, 1, 1, 1, 1, 1) for d in attention_designs.BACKWARD_PRODUCTS}
    more = {d: f / flops["standard"] for d, f in flops.items() if d != "standard"}
    rule = ("'more FLOPs': the backward's matrix products counted per design (helpers.studies.attention_designs): "
            + ", ".join(f"{d} {x:.2f}x" for d, x in more.items()) + " standard attention's FLOPs. 'Runs faster': "
            "the seed's algorithm, FlashAttention-2 (PyTorch's sdpa_flash backend), against standard attention "
            "(PyTorch, P kept) at every non-causal shape of the race (results flash_attention.json, 16,384 tokens "
            "a step, B = 16384 / S: long kernels, so the device's time and not the launches decides), this "
            "course's kernels beside it; causal shapes left out (there the tiled kernels skip the masked tiles "
            "that standard attention computes, so they do fewer FLOPs): " + BACKWARD_OUTCOME_RULE + ". 'Never "
            "stores N x N': its peak memory below standard's at every S and growing at most 2.5x per doubling of "
            "S. Faster at every shape: confirmed; slower at every shape, or an N x N footprint: refuted; no shape "
            "decided: not decided; otherwise partly")
    res = load("flash_attention", gpu)
    if res is None:
        return _missing(rule, "flash_attention")
    if res.provenance.get("scale", "full") != "full":
        return Verdict(UNDECIDED, rule, {}, f"a {res.provenance.get('scale')}-scale run decides nothing")
    rows = backward_outcomes(res.records, flash="sdpa_flash")
    ours = backward_outcomes(res.records)
    memory = [r for r in res.records if r["pass"] == "fwd+bwd" and r["ms"] is None]  # the memory sweep
    peak = {(r["impl"], r["S"]): r["peak_mem_bytes"] for r in memory if r["status"] == "ok" and r["peak_mem_bytes"]}
    naive = {r["S"]: r["status"] for r in memory if r["impl"] == "naive"}
    flash_s = sorted(s for impl, s in peak if impl == "triton")
    if not rows or len(flash_s) < 2:
        return Verdict(UNDECIDED, rule, {}, "no backward timed for FlashAttention-2 and standard attention on "
                       "this card (sdpa_flash needs sm_80 or later), or no memory sweep")
    growth = max(2 ** (math.log(peak["triton", b] / peak["triton", a]) / math.log(b / a))  # per doubling of S
                 for a, b in zip(flash_s, flash_s[1:]))
    less = all(peak["triton", s] < peak["naive", s] for s in flash_s if ("naive", s) in peak)
    outcomes = [r["outcome"] for r in rows]
    evidence = {**{f"FlashAttention-2, {k}": v for k, v in _by_length(rows).items()},
                "standard / FlashAttention-2 backward time": _span([r["standard / flash"] for r in rows]),
                "standard / this course's backward time (beside it)": _span([r["standard / flash"] for r in ours]),
                "flash peak memory growth per doubling of S (max)": round(growth, 2),
                "flash peak memory below standard's at every S": less,
                "standard out of memory at S": [s for s in flash_s if naive.get(s) == "oom"],
                "standard too large for the card (not run) at S": [s for s in flash_s if naive.get(s) == "skipped"]}
    if not (less and growth <= 2.5 and min(more.values()) > 1) or all(o == "slower" for o in outcomes):
        return Verdict(REFUTED, rule, evidence)
    if all(o == "faster" for o in outcomes):
        return Verdict(CONFIRMED, rule, evidence)
    if all(o == UNDECIDED for o in outcomes):
        return Verdict(UNDECIDED, rule, evidence, "the backward's time bands overlap at every shape")
    return Verdict(PARTLY, rule, evidence)


# The data-centre flagship of each architecture at its launch: the cards the memory wall is about. The H200
# (2024) is the H100's chip with more and faster memory, a refresh rather than a new generation.
FLAGSHIPS = ("V100 SXM2", "A100 40GB SXM", "H100 SXM")


def memory_wall(load: Loader, gpu: str) -> Verdict:
    rule = (f"datasheets (helpers/datasheets.py), each architecture's flagship at launch ({', '.join(FLAGSHIPS)}): "
            "16-bit tensor FLOP/s, the rate ML training runs at, grew faster than HBM bandwidth at every new "
            "generation: confirmed; over the whole span only: partly; not over the span: refuted")
    cards = [datasheets.by_name(name) for name in FLAGSHIPS]
    steps = [(a, b, b.tensor_tflops / a.tensor_tflops, b.bandwidth_gbps / a.bandwidth_gbps)
             for a, b in zip(cards, cards[1:])]
    evidence = {f"{a.name} -> {b.name}": f"tensor x{t:.2f}, bandwidth x{bw:.2f}" for a, b, t, bw in steps}
    evidence.update({f"ridge (FLOP per byte), {c.name}": f"{1e3 * c.tensor_tflops / c.bandwidth_gbps:.0f}"
                     for c in [*cards, datasheets.by_name("H200")]})
    evidence["H200"] = "the H100's chip with 1.4x its bandwidth: a refresh, the one card here that lowered the ridge"
    every_step = all(t > bw for _, _, t, bw in steps)
    span = cards[-1].tensor_tflops / cards[0].tensor_tflops > cards[-1].bandwidth_gbps / cards[0].bandwidth_gbps
    return Verdict(CONFIRMED if every_step else PARTLY if span else REFUTED, rule, evidence)


# --- Selectel: A100 40 GB against RTX 6000 Ada 48 GB ----------------------------------------------------------

SEED_SETTING = {"attn": "eager", "lora_r": 16}  # notebook 06's main setting, the seed's (LoRA r = 16)


def seed_sweep(load: Loader, gpu: str) -> list[dict] | None:
    """The sweep's records in the seed's setting, each re-timed point's times in place of the sweep's own (the
    re-timing of the GPU whose sweep ``load`` gave: never one GPU's times inside another's sweep)."""
    res = load("finetune", gpu)
    return None if res is None else _seed_records(load, res)


def _seed_records(load: Loader, res: results.Result) -> list[dict]:
    """:func:`seed_sweep` of the sweep ``res``, already loaded."""
    timing = load(retime.TOPIC, res.path.parent.name)
    own = timing is not None and timing.path.parent == res.path.parent
    records = retime.merged(res.records, timing.records if own else [])
    return [r for r in records if all(r.get(k) == v for k, v in SEED_SETTING.items())
            and not r.get("point", "").endswith("/no-ckpt")]


SMALL_BATCH = 4  # "small batches": the seed's claim, judged at batch sizes up to this


def _own(load: Loader, topic: str, gpu: str) -> results.Result | None:
    """``gpu``'s own file of ``topic`` (not another GPU's standing in for it), or None."""
    got = load(topic, gpu)
    return got if got is not None and got.path.parent.name == gpu else None


def elasticity_rows(load: Loader, parts: dict[str, str]) -> dict[str, bandwidth_elasticity.Row]:
    """Notebook 10's rows, the H100's run against the H200's, of each part in ``parts`` (our name -> its name in
    ``bandwidth_elasticity.PARTS``) that both GPUs measured: each configuration's bandwidth elasticity."""
    gpus = (bandwidth_elasticity.SLOW, bandwidth_elasticity.FAST)
    ceilings = [_own(load, "ceilings", g) for g in gpus]
    if None in ceilings:
        return {}
    bw = tuple(roofline.ceiling_values(c.records)["copy"] for c in ceilings)
    devices = tuple((d.records[0] if (d := _own(load, "device", g)) else {}) for g in gpus)
    by_name = {p.name: p for p in bandwidth_elasticity.PARTS}
    found = {}
    for ours, name in parts.items():
        part = by_name[name]
        row = bandwidth_elasticity.build_row(part, *(_own(load, part.topic, g) for g in gpus), bw, devices)
        if row.status == "compared":
            found[ours] = row
    return found


def measured_elasticities(load: Loader, parts: dict[str, str]) -> dict[str, float]:
    """Each part's median bandwidth elasticity over the configurations both GPUs measured
    (:func:`elasticity_rows`). Parts that either GPU lacks are left out."""
    return {ours: row.e for ours, row in elasticity_rows(load, parts).items()}


STEP_ELASTIC_PARTS = {p: f"QLoRA step: {p}" for p, scale in step_model.PARTS.items() if scale == "bandwidth"}
DECODE_ELASTIC_PARTS = {"decode_parts": "decode parts, eager: device",
                        "graphed_decode_parts": "decode parts, graphed: device"}


def transfer_errors(load: Loader, fit_gpu: str) -> dict[str, float]:
    """The error of the step model built on ``fit_gpu`` on a GPU it was not built from, per model: the largest
    |step-time error| of the reference GPU's transfer test (``step_model_validation.json``, notebook 10) of that
    model, or {} without one."""
    test = _own(load, "step_model_validation", results.REFERENCE_GPU)
    errors: dict[str, float] = {}
    for r in (r for r in (test.records if test else []) if r.get("fit_gpu") == fit_gpu):
        errors[r["model"]] = max(errors.get(r["model"], 0.0), abs(r["error"]))
    return errors


def sweep_or_retimed(topic: str, gpu: str) -> results.Result | None:
    """A loader for :func:`seed_sweep` that reads ``gpu``'s own files only: where it has no sweep, its re-timed
    points (``finetune_timing.json``) stand for one."""
    return results.find(topic, gpu) or (results.find(retime.TOPIC, gpu) if topic == "finetune" else None)


def transfer_test(fit: str, target: str) -> tuple[list[dict], transfer.Judgement] | str:
    """The step model built on the GPU folder ``fit``'s step parts predicting ``target``'s measured steps at the
    points both GPUs timed in the seed's setting (``transfer.rows``, judged by the pre-registered bar), from the
    committed results: the rows and the judgement, or why the test cannot run."""
    parts = {gpu: results.find("step_parts", gpu) for gpu in (fit, target)}
    sweeps = {gpu: seed_sweep(sweep_or_retimed, gpu) for gpu in (fit, target)}
    lacking = [f"{gpu}'s {what}" for gpu in (fit, target) for what, got in (("step parts", parts[gpu]),
                                                                          ("timed steps", sweeps[gpu])) if got is None]
    if lacking:
        return "no " + ", no ".join(lacking)
    cards = {gpu: _card(parts[gpu]) for gpu in (fit, target)}
    if None in cards.values():
        return "no datasheet row for " + ", ".join(parts[g].provenance.get("gpu", g) for g in cards if cards[g] is None)
    model = step_model.StepModel.from_records(parts[fit].records, cards[fit])
    table = transfer.rows(model, cards[target], sweeps[target], parts[target].records, sweeps[fit])
    return table, transfer.judge(table)


SEED_CARD, OTHER_READING = "RTX 6000 Ada", "RTX A6000"  # the seed's "A6000 Ada"; read as the Ampere RTX A6000


def small_batch_projection(load: Loader, gpu: str, card: str = SEED_CARD) -> tuple[list[dict], dict] | str:
    """The A100-against-``card`` projection of every 7B and 13B batch <= ``SMALL_BATCH`` that trained under both
    caps (``step_model.rank``'s rows) and what it was built from; or why it cannot be made."""
    sweep_run = load("finetune", gpu)  # the model's error is measured on this sweep: its parts from the same GPU
    parts = load("step_parts", sweep_run.path.parent.name if sweep_run else gpu)
    if parts is None or not any(r.get("what") == "train_parts" for r in parts.records):
        return ("no measured part-by-part step model; the step model fitted to the sweep's step times has no "
                "bandwidth term that the data can separate, so it ranks the card with more FLOP/s first whatever "
                "the cards' bandwidths: it cannot rank the A100 against the Ada")
    if sweep_run is None:
        return "no sweep (finetune.json): the step model's error is not measured"
    main = _seed_records(load, sweep_run)
    here = _card(parts)
    if here is None:
        return f"no datasheet row for {parts.provenance.get('gpu')}"
    a100, ada = datasheets.by_name("A100 40GB SXM"), datasheets.by_name(card)
    model = step_model.StepModel.from_records(parts.records, here)
    rows = step_model.validate(model, main)
    transfer = transfer_errors(load, parts.path.parent.name)
    errors = {**step_model.uncertainty(rows), **transfer} if rows else {}
    elastic = measured_elasticities(load, STEP_ELASTIC_PARTS)
    timeline = load("step_timeline", parts.path.parent.name)  # that GPU's, else the reference H100's
    recorded_on = _card(timeline) if timeline else None
    timelines = launch_replay.load_events(timeline.path) if recorded_on else {}
    small = [r for r in step_model.rank(model, rows, a100, ada, errors, elastic or None, timelines, recorded_on)
             if r["model"] in ("7b", "13b") and r["batch"] <= SMALL_BATCH
             and all(analysis.status(main, r["model"], r["batch"], cap) == "ok" for cap in (40, 48))]
    if not small:
        return f"no 7B or 13B batch <= {SMALL_BATCH} trained under both caps"
    return small, {"model": model, "here": here, "a100": a100, "ada": ada, "rows": rows, "elastic": elastic,
                   "transfer": transfer, "errors": errors, "timeline": timeline if timelines else None,
                   "timelines": timelines, "recorded_on": recorded_on}


def a100_small_batches(load: Loader, gpu: str) -> Verdict:
    rule = ("the part-by-part step model (results/<gpu>/step_parts.json: each part's measured time scaled by the "
            "datasheet rate it depends on, the host's held fixed) projects the Ada's step time over the A100's at "
            f"every 7B and 13B batch <= {SMALL_BATCH} that trained under both caps, as a range: each scale's time "
            "off by the model's error per model (its largest on a GPU it was not built from, notebook 10's transfer "
            "test, where measured; else on the sweep's steps it was not built from), the host added or hidden, and "
            "each bandwidth part scaled by its bandwidth elasticity measured between the H100 and the H200 "
            "(notebook 10), the rest of its time fixed or following the SMs x boost clock (without that "
            f"measurement: a part streaming under {step_model.PACED_FRACTION:.0%} of the datasheet bandwidth "
            "follows the bandwidth or the clock). Where the step's launch timeline was recorded (step_timeline.json, "
            "appendix 06a), the host is neither added nor hidden: the recorded step is replayed with each kernel's "
            "time scaled by its part's projected time on the card, the host's issue times kept. Above 1 at every "
            "point: confirmed; below 1 at every point: refuted; above 1 at some: partly; otherwise (holding 1 "
            "everywhere, or below 1 at some and holding 1 at the others): not decided")
    got = small_batch_projection(load, gpu)
    if isinstance(got, str):
        return Verdict(UNDECIDED, rule, {}, got)
    small, built = got
    here, a100, ada, elastic = built["here"], built["a100"], built["ada"], built["elastic"]
    what_if = ("the rest of the bandwidth parts' time followed the SMs' clock" if elastic
               else "it followed the SMs' clock instead")
    evidence = {f"{r['model']} batch {r['batch']}: Ada / A100 step time": (
        f"{r['ratio']:.2f} ({r['low']:.2f}-{r['high']:.2f} at +-{r['uncertainty']:.0%}, host {r['host']}), "
        f"{r['deciding']} decides ({r['clock what-if']:.2f} if {what_if})") for r in small}
    padded = {(r["model"], r["batch"]): r["mean_padded_len"] for r in built["rows"]}
    ties = [step_model.tie_share(here, a100, ada, step_model.matmul_flops(
        models.MODELS[r["model"]], r["batch"], padded[r["model"], r["batch"]])) for r in small]
    evidence[f"tie: bandwidth parts / matmul time on the {here.name}"] = _span(ties)
    if built["transfer"]:
        evidence["error on another GPU (H200-built model, H100 steps)"] = ", ".join(
            f"{m} {e:.0%}" for m, e in sorted(built["transfer"].items()))
    if elastic:
        evidence["bandwidth elasticity, H100 against H200"] = ", ".join(f"{p} {e:.2f}" for p, e in elastic.items())
    if built["timeline"]:
        timeline = built["timeline"]
        evidence[f"host issue time / wall, recorded on the {_card(timeline).name}"] = ", ".join(
            f"{r['model']} batch {r['batch_size']} {r['host_issue_us'] / r['wall_us']:.2f}" for r in timeline.records)
    other = small_batch_projection(load, gpu, OTHER_READING)
    if not isinstance(other, str):
        evidence[f"the other reading, {OTHER_READING} / A100 step time"] = "; ".join(
            f"{r['model']} batch {r['batch']} {r['ratio']:.2f} ({r['low']:.2f}-{r['high']:.2f})" for r in other[0])
    unpaced = () if elastic else built["model"].unpaced_parts()
    if not elastic:
        evidence["parts paced by the bandwidth or the clock (under "
                 f"{step_model.PACED_FRACTION:.0%} of the {here.name}'s bandwidth)"] = ", ".join(unpaced) or "none"
    faster = [r["faster"] for r in small]
    if all(f == a100.name for f in faster):
        return Verdict(CONFIRMED, rule, evidence)
    if all(f == ada.name for f in faster):
        return Verdict(REFUTED, rule, evidence)
    if a100.name in faster:
        return Verdict(PARTLY, rule, evidence)
    if ada.name in faster:
        return Verdict(UNDECIDED, rule, evidence, "the Ada is projected faster at " + ", ".join(
            f"{r['model']} batch {r['batch']}" for r in small if r["faster"] == ada.name)
            + "; the other points' ranges hold 1. Deciding those needs the steps timed on an A100 and an Ada")
    deciding = sorted({r["deciding"] for r in small})
    if elastic:
        return Verdict(UNDECIDED, rule, evidence, (
            "every projected range holds 1: the model's error on another GPU and whether the rest of "
            f"{', '.join(deciding)}'s time follows the SMs' clock span both sides; deciding it needs the step "
            "timed on an A100 and an Ada, or the parts' clock elasticity (the same GPU at two SM clocks)"))
    return Verdict(UNDECIDED, rule, evidence, "every projected range holds 1" + (
        f": {', '.join(deciding)} decides, and whether the bandwidth or the SMs' clock paces it sets the sign"
        if set(deciding) <= set(unpaced) else ""))


CAP_CARDS = {40: ("A100 40GB SXM",), 48: (SEED_CARD, OTHER_READING)}  # the cards each memory cap stands in for


def memory_margin(records: list[dict], model: str, batch: int, cap: int) -> str | None:
    """GiB to spare at a point that trained under ``cap``: its need (peak reserved + the CUDA context) against the
    cap, and against the memory each card it stands for shows programs (``datasheets.VISIBLE_MEMORY_MIB``, less
    the same context); None where the point did not train."""
    run = next((r for r in analysis.train_runs(records, model, cap)
                if r["batch_size"] == batch and r["status"] == "ok"), None)
    if run is None or run.get("peak_reserved_gb") is None:
        return None
    need = run["peak_reserved_gb"] + (run.get("context_gb") or 0.0)
    margins = [f"{cap - need:+.2f} under the {cap} GiB cap"]
    for card in CAP_CARDS.get(cap, ()):
        mib = datasheets.VISIBLE_MEMORY_MIB.get(card)
        margins.append(f"{mib / 1024 - need:+.2f} on the {card}'s {mib / 1024:.2f} GiB" if mib
                       else f"the {card}'s visible memory not on record")
    return f"needs {need:.2f} GiB (peak reserved + CUDA context): " + ", ".join(margins)


def oom_7b(load: Loader, gpu: str) -> Verdict:
    rule = ("7B in notebook 06's seed setting (eager attention, r = 16): the first batch that runs out of memory "
            "under a 40 GiB cap (the A100 stand-in) is 20-27 and comes before any under 48 GiB: confirmed; "
            "the 40 GiB cap fails first, at another batch: partly; otherwise: refuted")
    main = seed_sweep(load, gpu)
    if main is None:
        return _missing(rule, "finetune")
    if analysis.status(main, "7b", 1, 40) is None or analysis.status(main, "7b", 1, 48) is None:
        return Verdict(UNDECIDED, rule, {}, "7B not measured under both caps")
    fo40, fo48 = (analysis.first_oom(main, "7b", cap) for cap in (40, 48))
    largest48 = max(r["batch_size"] for r in analysis.train_runs(main, "7b", 48))
    evidence = {"first OOM batch under 40 GiB": fo40,
                "first OOM batch under 48 GiB": fo48 if fo48 is not None else f"none up to {largest48}"}
    for cap in (40, 48):
        largest = max((r["batch_size"] for r in analysis.train_runs(main, "7b", cap) if r["status"] == "ok"),
                      default=None)
        margin = None if largest is None else memory_margin(main, "7b", largest, cap)
        if margin:
            evidence[f"largest batch under {cap} GiB, {largest}: margin in GiB"] = margin
    first = fo40 is not None and (fo48 is None or fo48 > fo40)
    verdict = CONFIRMED if first and 20 <= fo40 <= 27 else PARTLY if first else REFUTED
    return Verdict(verdict, rule, evidence)


def only_48gb_70b(load: Loader, gpu: str) -> Verdict:
    rule = ("70B in the seed setting (4-bit, r = 16): out of memory at batch 1 under a 40 GiB cap, trains at "
            "batch 1 under 48 GiB and not at batch 2: confirmed; 40 GiB fails and 48 GiB trains batch 1 but "
            "also batch 2: partly; 40 GiB trains or 48 GiB fails at batch 1: refuted")
    main = seed_sweep(load, gpu)
    if main is None:
        return _missing(rule, "finetune")
    got = {"batch 1 under 40 GiB": analysis.status(main, "70b", 1, 40),
           "batch 1 under 48 GiB": analysis.status(main, "70b", 1, 48),
           "batch 2 under 48 GiB": analysis.status(main, "70b", 2, 48)}
    if None in got.values():
        return Verdict(UNDECIDED, rule, got, "a point of the three was not measured")
    b1_40, b1_48, b2_48 = got.values()
    verdict = (REFUTED if b1_40 == "ok" or b1_48 != "ok" else CONFIRMED if b2_48 == "oom" else PARTLY)
    evidence = dict(got)
    for batch in (1, 2):
        margin = memory_margin(main, "70b", batch, 48)
        if margin:
            evidence[f"batch {batch} under 48 GiB: margin in GiB"] = margin
    return Verdict(verdict, rule, evidence)


OUTPUT_LENGTHS = (64, 256, 1024, 2048)  # new tokens after a 32-token prompt


def _lead_text(lead: list[float]) -> str:
    return ", ".join(f"{n}: {x:.2f}" for n, x in zip(OUTPUT_LENGTHS, lead))


def ada_generates_faster(load: Loader, gpu: str) -> Verdict:
    rule = ("stock generate()'s time per token, split into device and host (results/<gpu>/step_parts.json, "
            "contexts 64-2048), summed over outputs of " + ", ".join(map(str, OUTPUT_LENGTHS)) + " new tokens with "
            "the host's time held at its measured value and the device's scaled by HBM bandwidth with its "
            "bandwidth elasticity measured between the H100 and the H200 (notebook 10), the rest fixed or "
            "following the SMs x boost clock (without that measurement: by the bandwidth or by the clock): the "
            "Ada's tokens/s over the A100's above 1 under both at every length: confirmed if it grows with the "
            "length under both, else partly; below 1 under both at every length: refuted; otherwise: not decided. "
            "The course's graphed decoder (notebook 07), projected the same way, is shown beside it as evidence")
    parts = load("step_parts", gpu)
    decode = [r for r in parts.records if r.get("what") == "decode_parts" and r.get("kv_cache")] if parts else []
    if len(decode) < 2:
        return Verdict(UNDECIDED, rule, {},
                       "no measured split of decoding (with the KV cache) into the device's and the host's time "
                       "at several context lengths")
    here = _card(parts)
    if here is None:
        return Verdict(UNDECIDED, rule, {}, f"no datasheet row for {parts.provenance.get('gpu')}")
    a100, ada = datasheets.by_name("A100 40GB SXM"), datasheets.by_name(SEED_CARD)
    elastic = measured_elasticities(load, DECODE_ELASTIC_PARTS)

    def scaling(what: str, s: str) -> str:
        e = elastic.get(what)
        if e is None:
            return f"device x {s}"
        return f"device x bandwidth^{e:.2f}" + (f" x clock^{1 - e:.2f}" if s == "clock" else ", the rest fixed")

    lead = step_model.decode_lead(decode, here, a100, ada, list(OUTPUT_LENGTHS),
                                  elasticity=elastic.get("decode_parts"))
    evidence = {f"Ada tokens/s over the A100's, {scaling('decode_parts', s)}": _lead_text(v) for s, v in lead.items()}
    evidence["host share of the measured time per token"] = _span(
        [r["host_s_per_token"] / r["s_per_token"] for r in decode if r["s_per_token"] > 0])
    graphed = [r for r in parts.records if r.get("what") == "graphed_decode_parts"]
    if graphed:  # the course's decoder, the host out of the way: what the device alone gives (not the seed's path)
        for s, v in step_model.decode_lead(graphed, here, a100, ada, list(OUTPUT_LENGTHS), what="graphed_decode_parts",
                                           elasticity=elastic.get("graphed_decode_parts")).items():
            evidence[f"course's graphed decoder, Ada over A100, {scaling('graphed_decode_parts', s)}"] = _lead_text(v)
    other = step_model.decode_lead(decode, here, a100, datasheets.by_name(OTHER_READING), list(OUTPUT_LENGTHS),
                                   elasticity=elastic.get("decode_parts"))
    for s, v in other.items():
        evidence[f"the other reading, {OTHER_READING} over A100, {scaling('decode_parts', s)}"] = _lead_text(v)
    every = [x for v in lead.values() for x in v]
    if all(x > 1 for x in every):
        growing = all(all(q > p for p, q in zip(v, v[1:])) for v in lead.values())
        return Verdict(CONFIRMED if growing else PARTLY, rule, evidence)
    if all(x < 1 for x in every):
        return Verdict(REFUTED, rule, evidence)
    if "decode_parts" in elastic:
        return Verdict(UNDECIDED, rule, evidence, (
            f"the device's time follows the bandwidth by {elastic['decode_parts']:.2f} (measured); the Ada leads if "
            "the rest follows the SMs' clock and trails if it is fixed. Deciding it needs that rest's clock "
            "elasticity (the same GPU at two SM clocks) or the two cards"))
    return Verdict(UNDECIDED, rule, evidence, "the Ada leads if a decode kernel's time follows the clock and "
                   "trails if it follows the bandwidth; the host's time, the same on both, is most of each token")


def two_gpus_70b(load: Loader, gpu: str) -> Verdict:
    rule = ("a full-scale two-GPU run (results/<gpu>x2/fsdp.json): 70B QLoRA sharded with FSDP over 2 GPUs capped "
            "at 40 GiB each trains, and the measured all-reduce bus bandwidth is above PCIe x16's (NVLink-class): "
            "confirmed; it trains but the link is PCIe-class: partly; it does not train: refuted")
    res = load("fsdp", f"{gpu}x2")
    if res is None:
        return _missing(rule, f"{gpu}x2/fsdp")
    if res.provenance.get("scale") != "full":
        return Verdict(UNDECIDED, rule, {}, f"the two-GPU run is at {res.provenance.get('scale')} scale")
    big = [r for r in res.records if r.get("kind") == "train" and r["model"] == "70b" and r["strategy"] == "fsdp"
           and r["gpus"] == 2 and r["cap_gb"] == 40]
    if not big:
        return Verdict(UNDECIDED, rule, {}, "no 70B run sharded over 2 GPUs capped at 40 GiB")
    ok = [r for r in big if r["status"] == "ok"]
    ar = [r["busbw_gbps"] for r in res.records if r.get("kind") == "allreduce"]
    pcie = max(datasheets.PCIE_X16_GBPS.values())
    evidence = {"largest batch per GPU that trains": max((r["batch_size"] for r in ok), default=None),
                "tokens/s there": round(max(ok, key=lambda r: r["batch_size"])["tokens_per_s"]) if ok else None,
                "all-reduce bus bandwidth (GB/s)": round(max(ar)) if ar else None,
                "PCIe x16 (GB/s, datasheet)": pcie}
    if not ok:
        return Verdict(REFUTED, rule, evidence)
    if not ar:
        return Verdict(UNDECIDED, rule, evidence, "no all-reduce measured: the link is not characterised")
    return Verdict(CONFIRMED if max(ar) > pcie else PARTLY, rule, evidence)


CLAIMS: tuple[Claim, ...] = (
    Claim("chain-memory-bound", "the naive bias+GELU+LayerNorm chain is memory-bound (low arithmetic intensity)",
          "VRAM paradox", ("02", "03"), chain_memory_bound),
    Claim("fusion-3-4x", "fusing it gives 3-4x with the same FLOPs", "VRAM paradox", ("04",), fusion_speedup),
    Claim("flash-backward", "FlashAttention's backward does more FLOPs than standard attention yet runs faster "
          "and never stores N x N", "VRAM paradox", ("05",), flash_backward),
    Claim("memory-wall", "compute grows faster than bandwidth (the memory wall)", "VRAM paradox", ("01", "02"),
          memory_wall),
    Claim("a100-small-batches", "A100 trains small batches faster than Ada despite fewer cores", "Selectel",
          ("06",), a100_small_batches),
    Claim("7b-oom-batch-25", "7B: A100 40 GB OOMs at batch ~25 where Ada 48 GB does not", "Selectel", ("06",),
          oom_7b),
    Claim("70b-48gb-batch-1", "70B 4-bit + LoRA r16 trains on 48 GB at batch 1 only, not on 40 GB", "Selectel",
          ("06",), only_48gb_70b),
    Claim("ada-generates-faster", "Ada generates text faster, more so for longer outputs", "Selectel",
          ("06", "07"), ada_generates_faster),
    Claim("two-a100-nvlink-70b", "two A100s over NVLink are the practical way to train 70B", "Selectel", ("08",),
          two_gpus_70b),
)


def default_gpu() -> str:
    """This GPU's results folder at full scale when it has results, else the reference H100's (a topic a
    folder lacks is read from the reference, then the H200: ``committed``)."""
    if SCALE == "full":
        mine = results.gpu_slug()
        if (results.results_dir() / mine).is_dir():
            return mine
    return results.REFERENCE_GPU


def verdicts(gpu: str | None = None, load: Loader = committed) -> dict[str, Verdict]:
    """Every claim's verdict from ``results/<gpu>/`` (default: :func:`default_gpu`), by claim id."""
    gpu = gpu or default_gpu()
    return {c.id: c.judge(load, gpu) for c in CLAIMS}


def _evidence_text(evidence: dict) -> str:
    return "; ".join(f"{k}: {v}" for k, v in evidence.items())


def table(notebook: str | None = None, gpu: str | None = None, load: Loader = committed) -> pd.DataFrame:
    """One row per claim (those ``notebook`` tests, or all): seed, notebooks, verdict (with why, when
    undecided), rule and evidence."""
    if notebook is not None and not any(notebook in c.notebooks for c in CLAIMS):
        raise ValueError(f"no seed claim is tested in notebook {notebook!r}; "
                         f"notebooks with claims: {sorted({n for c in CLAIMS for n in c.notebooks})}")
    gpu = gpu or default_gpu()
    rows = []
    for c in CLAIMS:
        if notebook is not None and notebook not in c.notebooks:
            continue
        read: list[str] = []

        def recorded(topic: str, folder: str) -> results.Result | None:
            res = load(topic, folder)
            if res is not None:
                read.append(f"{res.path.parent.name}/{res.path.name} ({res.provenance.get('gpu', '?')})")
            return res

        v = c.judge(recorded, gpu)
        rows.append({"claim": c.text, "seed": c.seed, "notebooks": ", ".join(c.notebooks),
                     "verdict": f"{v.verdict}: {v.why}" if v.why else v.verdict, "rule": v.rule,
                     "evidence": _evidence_text(v.evidence), "read": ", ".join(dict.fromkeys(read))})
    return pd.DataFrame(rows)


def show(notebook: str | None = None, gpu: str | None = None) -> None:
    """Print the claims that ``notebook`` tests (or all), each with its verdict, the rule and the evidence."""
    gpu = gpu or default_gpu()
    print(textwrap.fill(f"Seed claims judged from results/{gpu}/ (a topic it lacks: the reference H100's, else the "
                        "H200's; the rule beside each verdict):", 116))
    for row in table(notebook, gpu).itertuples():
        print(f"\n* {row.claim} ({row.seed}; notebook {row.notebooks})")
        for field, text in (("verdict", row.verdict), ("rule", row.rule), ("evidence", row.evidence or "-"),
                            ("read", row.read or "-")):
            print(textwrap.fill(f"{field}: {text}", 116, initial_indent="  ", subsequent_indent="      "))
