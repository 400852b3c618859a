"""Rebuild the README's headline results and seed-claims tables, and the full table in results/README.md,
from the committed results files.

    python scripts/update_readme.py           # rewrite both README blocks, results/README.md, results/<gpu>/summary.png
    python scripts/update_readme.py --check   # exit 1 if either file is out of date (the tests run this)

Every number is read from results/<gpu>/<topic>.json through helpers.results (the verdicts through
helpers.claims); a topic with no file yet is left out.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from helpers import claims, results, datasheets
from helpers.studies import memory_hierarchy, roofline
from helpers.studies.decoding_ladder import logits_ok, speedup_per_round
from helpers.finetune import analysis, transfer

README = results.REPO_ROOT / "README.md"
RESULTS_README = results.REPO_ROOT / "results" / "README.md"
START, END = "<!-- results-table -->", "<!-- /results-table -->"
CLAIMS_START, CLAIMS_END = "<!-- claims-table -->", "<!-- /claims-table -->"


def _ceilings(res: results.Result, spec: datasheets.GpuSpec | None) -> list[tuple[str, str, str]]:
    copy = res.where(what="copy")[0]["gbps"]
    bf16 = res.where(what="matmul", dtype="bf16")[0]["tflops"]
    ref_bw = f"{100 * copy / spec.bandwidth_gbps:.0f}% of the datasheet's {spec.bandwidth_gbps:,.0f}" if spec else ""
    ref_mm = f"{100 * bf16 / spec.bf16_tflops:.0f}% of the datasheet's {spec.bf16_tflops:,.0f}" if spec else ""
    return [("device copy bandwidth (read + write)", f"{copy:,.0f} GB/s", ref_bw),
            ("bf16 matmul 8192³", f"{bf16:,.0f} TFLOP/s", ref_mm)]


def _memory(res: results.Result, l2_bytes: int) -> list[tuple[str, str, str]]:
    windows = memory_hierarchy.level_windows(l2_bytes)
    bw = res.where(probe="bandwidth")
    lat = res.where(probe="latency")
    l2, hbm = (memory_hierarchy.level_value(bw, "gbps", windows[k]) for k in ("L2", "HBM"))
    ladder = " / ".join(f"{memory_hierarchy.level_value(lat, 'ns_per_load', windows[k]):,.0f}"
                        for k in ("L1", "L2", "HBM"))
    return [("streaming bandwidth, L2-resident vs HBM", f"{l2:,.0f} vs {hbm:,.0f} GB/s", f"L2 is {l2 / hbm:.1f}x HBM"),
            ("dependent-load latency L1 / L2 / HBM", f"{ladder} ns", "pointer chase, one load in flight")]


def _roofline(res: results.Result, spec: datasheets.GpuSpec | None) -> list[tuple[str, str, str]]:
    dial = res.where(probe="dial", dtype="fp32")
    kn = roofline.knee(dial)
    copy = res.where(probe="ceiling", what="copy")[0]["gbps"]
    peak = f"{100 * kn['top_gflops'] / 1e3 / spec.fp32_tflops:.0f}% of the fp32 datasheet peak" if spec else ""
    return [("intensity dial (fp32 FMAs): memory-bound end", f"{kn['low_gbps']:,.0f} GB/s",
             f"{100 * kn['low_gbps'] / copy:.0f}% of the copy bandwidth"),
            ("intensity dial: compute-bound end", f"{kn['top_gflops'] / 1e3:,.1f} TFLOP/s", peak)]


_TIMINGS = {"events": " (called from Python)", "graph": " (device time, CUDA graph)"}  # no "timing": events


def _fused(res: results.Result) -> list[tuple[str, str, str]]:
    rows = []
    for pass_, timing in (("fwd", "events"), ("fwd+bwd", "events"), ("fwd+bwd", "graph")):
        for dtype in ("bf16", "fp32"):
            picked = [r for r in res.where(**{"pass": pass_, "dtype": dtype}) if r.get("timing", "events") == timing]
            ms = {(r["impl"], r["N"]): r["ms"] for r in picked}
            ns = sorted(n for impl, n in ms if impl == "triton")
            if not ns:
                continue
            vs = {base: [ms[(base, n)] / ms[("triton", n)] for n in ns] for base in ("eager", "compile")}
            pct = [100 * r["gbps"] / r["copy_gbps"] for r in picked if r["impl"] == "triton"]
            rows.append((f"fused bias+GELU+LayerNorm {pass_}{_TIMINGS[timing] if pass_ == 'fwd+bwd' else ''}, {dtype}, "
                         f"N = {ns[0]}..{ns[-1]}",
                         f"{min(vs['eager']):.1f}-{max(vs['eager']):.1f}x eager, "
                         f"{min(vs['compile']):.2f}-{max(vs['compile']):.2f}x torch.compile",
                         f"{min(pct):.0f}-{max(pct):.0f}% of the copy bandwidth"))
    return rows


def _attention(res: results.Result) -> list[tuple[str, str, str]]:
    rows = []
    for pass_ in ("fwd", "fwd+bwd"):
        for causal in (False, True):
            pick = {r["impl"]: r["tflops"] for r in res.records if r["pass"] == pass_ and r["causal"] == causal
                    and (r["B"], r["H"], r["S"], r["D"]) == (4, 32, 4096, 128) and r["status"] == "ok"}
            if "triton" not in pick:
                continue
            label = f"FlashAttention (Triton) {pass_}, {'causal' if causal else 'non-causal'}, B4 H32 S4096 D128"
            vs = (f"{pick['triton'] / pick['sdpa_flash']:.2f}x SDPA flash, "
                  f"{pick['triton'] / pick['sdpa_cudnn']:.2f}x cuDNN")
            rows.append((label, f"{pick['triton']:,.0f} TFLOP/s", vs))
    return rows


def _one_card(res: results.Result) -> list[tuple[str, str, str]]:
    """Notebook 06's seed setting (eager attention, LoRA r=16, texts cut at 1,024 tokens, checkpointing):
    the largest batch each model trains at under each cap, and 4-bit generate() at batch 1."""
    seed = {"attn": "eager", "lora_r": 16, "checkpointing": True, "max_seq_len": 1024}
    rows = []
    for cap, card in ((40, "A100 40 GB"), (48, "RTX 6000 Ada 48 GB")):
        parts, notes = [], []
        for model in ("7b", "13b", "70b"):
            runs = analysis.train_runs(res.records, model, cap, **seed)
            if not runs:
                continue
            ok = [r for r in runs if r["status"] == "ok"]
            parts.append(f"{model.upper()} to batch {ok[-1]['batch_size']}" if ok
                         else f"{model.upper()} out of memory at batch {runs[0]['batch_size']}")
            if model == "70b" and ok:
                notes.append(f"70B batch {ok[0]['batch_size']}: {ok[0]['tokens_per_s']:,.0f} tokens/s, "
                             f"{ok[0]['peak_alloc_gb']:.1f} GiB allocated")
        if parts:
            rows.append((f"QLoRA on one GPU capped at {cap} GiB ({card} stand-in)", ", ".join(parts),
                         "; ".join(notes) or "eager attention, r = 16, texts cut at 1,024 tokens"))
    gen = [r for r in analysis.generate_runs(res.records)
           if r.get("attn") == seed["attn"] and r.get("lora_r") == seed["lora_r"]]
    speeds = {m: [r["tokens_per_s"] for r in gen if r["model"] == m] for m in ("7b", "13b", "70b")}
    if all(speeds.values()):
        rows.append(("4-bit generate() at batch 1, stock transformers + bitsandbytes",
                     ", ".join(f"{m.upper()} {min(v):.0f}-{max(v):.0f}" for m, v in speeds.items()) + " tokens/s",
                     "KV cache on; " + ", ".join(sorted({"whole card" if r.get("cap_gb") is None
                                                         else f"{r['cap_gb']:g} GiB" for r in gen}))
                     + "; 64 to 512 new tokens"))
    return rows


def _decode(res: results.Result) -> list[tuple[str, str, str]]:
    """Notebook 07's decoding ladder: stock generate() against every change, per model."""
    rows = []
    for model in dict.fromkeys(r["model"] for r in res.records):
        ladder = [r for r in res.records if r["model"] == model]
        first, last = ladder[0], ladder[-1]
        fastest = max(ladder, key=lambda r: r["tokens_per_s"])
        best = "" if fastest is last else f"; fastest rung '{fastest['variant']}' {fastest['tokens_per_s']:.0f}"
        rounds = ""  # the ratio's range over the rounds, where the rungs were timed in rounds taken in turn
        if "round 0 seconds" in first and "round 0 seconds" in last:
            ratios = speedup_per_round(last, first)
            rounds = f", {min(ratios):.1f}-{max(ratios):.1f}x over {len(ratios)} rounds"
        rows.append((f"4-bit decoding at batch 1, {model.upper()}: {first['variant']} -> {last['variant']}",
                     f"{first['tokens_per_s']:.0f} -> {last['tokens_per_s']:.0f} tokens/s "
                     f"({last['tokens_per_s'] / first['tokens_per_s']:.1f}x{rounds}{best})",
                     f"{100 * last['tokens_per_s'] / last['roofline_tokens_per_s']:.0f}% of the bandwidth roofline; "
                     + ("every rung's logits as close as transformers' own decoding" if all(map(logits_ok, ladder))
                        else "LOGITS CHECK FAILED at a rung")))
    return rows


def _train_kernels(res: results.Result) -> list[tuple[str, str, str]]:
    """Notebook 07's QLoRA step: the course's kernels (eager, and graphed where the run has it) against the stock
    step, per batch size."""
    speed = {(r["variant"], r["batch_size"]): r for r in res.records}
    batches = sorted({b for _, b in speed})
    model = res.records[0]["model"].upper()
    labels = {"course": "the course's kernels (FlashAttention, RMSNorm, rotary, SwiGLU, nf4 layers)",
              "course graphed": "the course's kernels and the whole step in CUDA graphs"}
    return [(f"{model} QLoRA step with {label} against stock",
             ", ".join(f"batch {b}: {speed[v, b]['tokens_per_s'] / speed['stock', b]['tokens_per_s']:.2f}x"
                       for b in batches),
             "tokens/s ratio; peak memory "
             + ", ".join(f"{speed[v, b]['peak_alloc_gb']:.1f} vs {speed['stock', b]['peak_alloc_gb']:.1f} GiB"
                         for b in batches))
            for v, label in labels.items() if all((v, b) in speed for b in batches)]


def _pacing(res: results.Result) -> list[tuple[str, str, str]]:
    """Notebook 07 (or scripts/qlora_step_pacing.py): a QLoRA step's wall time against its kernel time, stock
    against each course variant, the wall time the median of rounds taking the variants in turn."""
    rows = []
    for batch in dict.fromkeys(r["batch_size"] for r in res.records):
        by = {r["variant"]: r for r in res.records if r["batch_size"] == batch}
        if "stock" not in by:  # a run of other variants: nothing to set side by side
            continue
        stock = by["stock"]
        for name in ("course", "course graphed"):
            if name not in by:
                continue
            course = by[name]
            rows.append((f"{course['model'].upper()} QLoRA step at batch {batch}: wall time (median of "
                         f"{course.get('rounds', 1)} rounds), of it in kernels (stock -> {name})",
                         f"{stock['wall_ms']:.0f} ms, {stock['kernel_ms']:.0f} in kernels -> {course['wall_ms']:.0f} "
                         f"ms, {course['kernel_ms']:.0f} in kernels",
                         f"kernel time {stock['kernel_ms'] / course['kernel_ms']:.2f}x less, the step "
                         f"{stock['wall_ms'] / course['wall_ms']:.2f}x faster: the device waits for the host "
                         f"{course['idle_ms']:.0f} ms a step ({course['idle_ms'] / course['wall_ms']:.0%})"))
    return rows


def _step_model_transfer(res: results.Result) -> list[tuple[str, str, str]]:
    """scripts/step_model_transfer.py: the step model built on one GPU's parts, against this GPU's measured steps,
    judged again by the bar set before they were measured."""
    verdict = transfer.judge(res.records)
    outcome = "passed" if verdict.passed else "failed: " + "; ".join(verdict.failed)
    errors = [abs(r["error"]) for r in res.records]
    return [(f"QLoRA step model fit on the {gpu_label(res.records[0]['fit_gpu'], False)}'s step parts, predicting "
             "this GPU's steps (scripts/step_model_transfer.py)",
             f"median step error {statistics.median(errors):.1%} over {len(errors)} points "
             f"({', '.join(sorted({r['model'].upper() for r in res.records}))})",
             f"the bar set before measuring ({transfer.BAR.median_step_error:.0%} median, parts within "
             f"{transfer.BAR.part_error:.0%}): {outcome}")]


def _serving(res: results.Result) -> list[tuple[str, str, str]]:
    rows = []
    paged = {(r["batch"], r["context"]): r["ms"] for r in res.where(what="kernel", impl="paged", heads=32, kv_heads=32)}
    contiguous = {(r["batch"], r["context"]): r["ms"]
                  for r in res.where(what="kernel", impl="contiguous", heads=32, kv_heads=32)}
    if paged:
        speed = [contiguous[k] / paged[k] for k in paged if k in contiguous]
        rows.append(("paged decode attention (Triton), 7B's heads, batch 1-64, 512-4,096 tokens",
                     f"{min(speed):.2f}-{max(speed):.2f}x the contiguous kernel's speed",
                     "equal lengths, pages in random order"))
    sweep = {(r["batch"], r["context"]): r["tokens_per_s"] for r in res.where(what="batch_decode")}
    if (64, 512) in sweep and (1, 512) in sweep:
        best = max(sweep, key=sweep.get)
        rows.append(("batched decoding, 7B nf4, paged cache, 64 requests of 512 tokens",
                     f"{sweep[(64, 512)]:,.0f} tokens/s",
                     f"{sweep[(64, 512)] / sweep[(1, 512)]:.1f}x batch 1; {sweep[best]:,.0f} tokens/s at batch "
                     f"{best[0]}, {best[1]} tokens"))
    served = res.where(what="continuous")
    if served:
        rows.append((f"continuous batching, 7B nf4, {served[0]['requests']} requests of the data set's lengths",
                     f"{min(r['tokens_per_s'] for r in served):,.0f}-{max(r['tokens_per_s'] for r in served):,.0f} "
                     "tokens/s", f"median time per output token {min(r['tpot_ms'] for r in served):.0f}-"
                     f"{max(r['tpot_ms'] for r in served):.0f} ms over {len(served)} arrival rates"))
    held = sorted(((r["cap_gib"], r["context"]), r["requests"]) for r in res.where(what="capacity", measured=True))
    if held:
        rows.append(("requests a paged cache holds, 7B nf4, measured under the memory caps",
                     ", ".join(f"{cap:g} GiB: {n} of {context:,} tokens" for (cap, context), n in held),
                     "all of them decoding together under the cap"))
    return rows


def _two_gpus(res: results.Result, spec: datasheets.GpuSpec | None) -> list[tuple[str, str, str]]:
    rows = []
    train = [r for r in res.records if r.get("kind") == "train"]
    big = [r for r in train if r["model"] == "70b" and r["strategy"] == "fsdp" and r["gpus"] == 2 and r["cap_gb"] == 40]
    for expandable in (True, False):
        runs = sorted((r for r in big if bool(r.get("expandable_segments")) == expandable),
                      key=lambda r: r["batch_size"])
        if not runs:
            continue
        ok = [r for r in runs if r["status"] == "ok"]
        allocator = "expandable segments" if expandable else "default allocator"
        value = (f"trains to batch {ok[-1]['batch_size']}/GPU, {ok[-1]['tokens_per_s']:,.0f} tokens/s" if ok
                 else "out of memory at batch 1")
        first = runs[0]
        rows.append((f"Llama-2-70B QLoRA, FSDP on 2 GPUs capped at 40 GiB each, {allocator}", value,
                     f"batch {first['batch_size']}: {first['peak_alloc_gb_rank0']:.1f} GiB allocated, "
                     f"{first['peak_reserved_gb_rank0']:.1f} GiB reserved per GPU"))
    pairs = [r for r in train if r.get("scaling_efficiency") is not None]
    if pairs:
        rows.append((f"{pairs[0]['model'].upper()} QLoRA scaling, 1 to 2 GPUs",
                     ", ".join(f"{r['strategy'].upper()} {r['scaling_efficiency']:.2f}" for r in pairs),
                     "tokens/s on 2 / (2 x tokens/s on 1)"))
    ar = [r for r in res.records if r.get("kind") == "allreduce"]
    if ar:
        best = max(ar, key=lambda r: r["busbw_gbps"])
        ref = (f"{best['busbw_gbps'] / (spec.nvlink_gbps / 2):.0%} of NVLink's {spec.nvlink_gbps / 2:g} GB/s one way"
               if spec and spec.nvlink_gbps else "")
        rows.append((f"all-reduce bus bandwidth between 2 GPUs, {best['size_mb']:g} MiB",
                     f"{best['busbw_gbps']:,.0f} GB/s", ref))
    return rows


def summary_figure(gpu: str) -> Path | None:
    """results/<gpu>/summary.png: the attention race at the target shape, and the fused kernel against
    eager and torch.compile, as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.plots import use_course_style

    attention, fused = results.find("flash_attention", gpu), results.find("fused_bias_gelu_layernorm", gpu)
    if attention is None or fused is None:
        return None
    use_course_style()
    fig, (ax_a, ax_f) = plt.subplots(1, 2, figsize=(12, 4))
    impls = ["naive", "sdpa_efficient", "sdpa_flash", "triton", "sdpa_cudnn"]
    for i, pass_ in enumerate(("fwd", "fwd+bwd")):
        tf = {r["impl"]: r["tflops"]
              for r in attention.where(B=4, H=32, S=4096, D=128, causal=False, **{"pass": pass_})}
        ax_a.bar([x + 0.4 * i for x in range(len(impls))], [tf[k] for k in impls], 0.4, label=pass_)
    names = {"naive": "PyTorch\nnaive", "sdpa_efficient": "SDPA\nefficient", "sdpa_flash": "SDPA flash\n(FA2)",
             "triton": "this course\n(Triton)", "sdpa_cudnn": "SDPA\ncuDNN"}
    ax_a.set_xticks([x + 0.2 for x in range(len(impls))], [names[k] for k in impls])
    ax_a.set_ylabel("TFLOP/s")
    ax_a.set_title("attention, bf16, B4 H32 S4096 D128, non-causal")
    ax_a.legend()
    ns = sorted({r["N"] for r in fused.where(impl="triton", dtype="bf16")})
    for i, impl in enumerate(("eager", "compile", "triton")):
        ms = {r["N"]: r["ms"] for r in fused.where(impl=impl, dtype="bf16", **{"pass": "fwd"})
              if r.get("timing", "events") == "events"}
        ax_f.bar([x + 0.27 * i for x in range(len(ns))], [ms[n] * 1e3 for n in ns], 0.27,
                 label={"compile": "torch.compile", "triton": "fused Triton"}.get(impl, impl))
    ax_f.set_xticks([x + 0.27 for x in range(len(ns))], [f"N = {n}" for n in ns])
    ax_f.set_ylabel("time for 64M elements [µs]")
    ax_f.set_title("bias + GELU + LayerNorm forward, bf16")
    ax_f.legend()
    fig.suptitle(f"{attention.provenance['gpu']}: the course's kernels against PyTorch (from results/{gpu}/)")
    path = results.REPO_ROOT / "results" / gpu / "summary.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


Row = tuple[str, str, str, str]  # measurement, result, context, notebook
GPUS = (results.REFERENCE_GPU, results.SECOND_GPU)  # the reference first: its column leads

# The README's headline rows (at most 10): the first full-table row whose measurement starts with each prefix.
HEADLINES = ("device copy bandwidth", "bf16 matmul",
             "fused bias+GELU+LayerNorm fwd, bf16", "fused bias+GELU+LayerNorm fwd+bwd (device time, CUDA graph), bf16",
             "FlashAttention (Triton) fwd+bwd, non-causal", "QLoRA on one GPU capped at 40 GiB",
             "QLoRA on one GPU capped at 48 GiB", "4-bit decoding at batch 1, 7B", "batched decoding, 7B nf4",
             "Llama-2-70B QLoRA, FSDP on 2 GPUs capped at 40 GiB each, expandable")


def table_rows(gpu: str) -> tuple[list[Row], list[str]]:
    """Every result row from ``results/<gpu>/`` (and ``<gpu>x2/``), and one provenance line per file read."""
    ceilings = results.find("ceilings", gpu)
    if ceilings is None:
        return [], []
    spec = datasheets.lookup(ceilings.provenance["gpu"])
    device = results.find("device", gpu)
    l2_bytes = device.records[0]["l2_bytes"] if device else int(spec.l2_mb * 2**20)
    sections = [("ceilings", ceilings, lambda r: _ceilings(r, spec), "00"),
                ("memory_hierarchy", results.find("memory_hierarchy", gpu), lambda r: _memory(r, l2_bytes), "01"),
                ("roofline", results.find("roofline", gpu), lambda r: _roofline(r, spec), "02"),
                ("fused_bias_gelu_layernorm", results.find("fused_bias_gelu_layernorm", gpu), _fused, "04"),
                ("flash_attention", results.find("flash_attention", gpu), _attention, "05"),
                ("finetune", results.find("finetune", gpu), _one_card, "06"),
                ("decode", results.find("decode", gpu), _decode, "07"),
                ("finetune_kernels", results.find("finetune_kernels", gpu), _train_kernels, "07"),
                ("qlora_pacing", results.find("qlora_pacing", gpu), _pacing, "07"),
                ("serving", results.find("serving", gpu), _serving, "09"),
                ("step_model_validation", results.find("step_model_validation", gpu), _step_model_transfer, "06"),
                (f"{gpu}x2/fsdp", results.find("fsdp", f"{gpu}x2"), lambda r: _two_gpus(r, spec), "08")]
    rows, sources = [], []
    for topic, res, make, nb in sections:
        if res is None:
            continue
        rows += [(what, value, ref, nb) for what, value, ref in make(res)]
        sources.append(f"- `{gpu}/{topic.split('/')[-1]}.json`: {res.describe()}" if "/" not in topic
                       else f"- `{topic}.json`: {res.describe()}")
    return rows, sources


Merged = tuple[str, dict[str, str], str]  # measurement, {gpu folder: "result (context)"}, notebook


def side_by_side(gpus: tuple[str, ...] = GPUS) -> tuple[list[Merged], list[str]]:
    """Each measurement once, with every GPU's result where that GPU measured it, in notebook order; and the
    provenance lines of every file read."""
    merged: dict[str, Merged] = {}
    sources: list[str] = []
    for gpu in gpus:
        rows, lines = table_rows(gpu)
        sources += lines
        for what, value, ref, nb in rows:
            merged.setdefault(what, (what, {}, nb))[1][gpu] = f"{value} ({ref})" if ref else value
    return sorted(merged.values(), key=lambda row: row[2]), sources


def gpu_label(gpu: str, mark_reference: bool = True) -> str:
    """The GPU's name from its ceilings file; a column's heading adds "(reference)" for the reference GPU."""
    ceilings = results.find("ceilings", gpu)
    name = ceilings.provenance["gpu"].removeprefix("NVIDIA ") if ceilings else gpu
    return f"{name} (reference)" if mark_reference and gpu == results.REFERENCE_GPU else name


def _markdown(rows: list[Merged], gpus: tuple[str, ...]) -> list[str]:
    return ([f"| measurement | {' | '.join(gpu_label(g) for g in gpus)} | notebook |",
             "| --- |" + " --- |" * len(gpus) + " --- |"]
            + [f"| {what} | {' | '.join(by.get(g, 'not measured') for g in gpus)} | {nb} |" for what, by, nb in rows])


def headlines(rows: list) -> list:
    """The rows named by ``HEADLINES``, in that order (a prefix with no row is left out)."""
    picked = (next((row for row in rows if row[0].startswith(prefix)), None) for prefix in HEADLINES)
    return [row for row in picked if row is not None]


def _present(gpus: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(g for g in gpus if results.find("ceilings", g) is not None)


def render(gpus: tuple[str, ...] = GPUS) -> str:
    """The README's block: the headline rows, one column a GPU, and where the full table and the provenance are."""
    gpus = _present(gpus)
    rows, _ = side_by_side(gpus)
    if not rows:
        return "_No GPU results committed yet._"
    figure = next((g for g in gpus if (results.REPO_ROOT / "results" / g / "summary.png").exists()), None)
    lines = [f"Measured on one GPU of each kind (notebook 08: two); the reference GPU is the "
             f"{gpu_label(gpus[0], False)}. "
             f"{len(headlines(rows))} of the {len(rows)} rows of [the full table](results/README.md), which also "
             "gives every file's provenance. Every row is read from `results/<gpu>/` (`results/<gpu>x2/`) by "
             "`scripts/update_readme.py`; \"not measured\": that GPU has no run of it yet.", "",
             *([f"![summary](results/{figure}/summary.png)", ""] if figure else []),
             *_markdown(headlines(rows), gpus)]
    return "\n".join(lines + [line for g in gpus for line in _gpu_tests(g)])


def render_results(gpus: tuple[str, ...] = GPUS) -> str:
    """``results/README.md``: every result row, one column a GPU, then the provenance of each file."""
    gpus = _present(gpus)
    rows, sources = side_by_side(gpus)
    head = ["# Results", "", "<!-- generated by scripts/update_readme.py from the results files: do not edit -->", ""]
    if not rows:
        return "\n".join(head + ["_No GPU results committed yet._", ""])
    intro = (f"Every measurement the notebooks (and one script of notebook 07's) committed, one column a GPU "
             f"(notebook 08: two of them), read from `{'/`, `'.join(gpus)}/`; the reference GPU is the "
             f"{gpu_label(gpus[0], False)}. \"Called from Python\": the time a PyTorch user sees, host work (autograd, "
             "launches) included; \"device time, CUDA graph\": the same work replayed from a CUDA graph, so only "
             "the GPU's time counts.")
    return "\n".join(head + [intro, "", *_markdown(rows, gpus), "", "Provenance:", *sources]
                     + [line for g in gpus for line in _gpu_tests(g)] + [""])


def render_claims(gpu: str = results.REFERENCE_GPU) -> str:
    """The README's claims block: each seed claim, the notebooks that test it, and the verdict from the reference
    GPU's results (a topic it has not run is read from the second GPU's)."""
    table = claims.table(gpu=gpu)
    lines = [f"Each verdict is computed by `helpers.claims` from `results/{gpu}/` (a topic that GPU has not run: "
             f"from `results/{results.SECOND_GPU}/`) by a rule that the notebook prints beside it; \"not decided by "
             "this run\" says why.", "",
             "| claim | seed | notebook | verdict |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.claim} | {r.seed} | {r.notebooks} | {r.verdict.replace('|', '/')} |" for r in table.itertuples()]
    return "\n".join(lines)


def _gpu_tests(gpu: str) -> list[str]:
    """When the tests that only a GPU can run (``scripts/gpu_tests.py``) last ran, and what they gave."""
    res = results.find("gpu_tests", gpu)
    if res is None:
        return []
    counts: dict[str, int] = {}
    for r in res.records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    outcomes = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    return ["", f"The tests only a GPU can run (`python scripts/gpu_tests.py`, i.e. `pytest -m gpu`) last ran on the "
            f"{gpu_label(gpu, False)} on {res.provenance['timestamp'][:10]}: {outcomes}; `{gpu}/gpu_tests.json`: "
            f"{res.describe()}."]


def _replace(text: str, start: str, end: str, block: str) -> str:
    if start not in text or end not in text:
        sys.exit(f"README.md lacks the markers {start} ... {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block}\n{end}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if README.md or results/README.md is out of date")
    args = parser.parse_args()
    text = README.read_text()
    new = _replace(_replace(text, START, END, render()), CLAIMS_START, CLAIMS_END, render_claims())
    full = render_results()
    if args.check:
        stale = [str(p.relative_to(results.REPO_ROOT)) for p, want in ((README, new), (RESULTS_README, full))
                 if not p.exists() or p.read_text() != want]
        sys.exit(f"{', '.join(stale)} out of date: run python scripts/update_readme.py" if stale else 0)
    README.write_text(new)
    RESULTS_README.write_text(full)
    for gpu in _present(GPUS):
        summary_figure(gpu)


if __name__ == "__main__":
    main()
