"""Bandwidth elasticity: how each part the course measures follows memory bandwidth between two GPUs of one chip.

The H100 80GB and the H200 share the GH100 die, its SMs and clocks; the H200's HBM is faster. A part's
elasticity ``e = ln(t_slow / t_fast) / ln(copy_fast / copy_slow)`` is 1 when its time follows the measured copy
bandwidth, 0 when it does not move. Everything here reads committed results (``results/<gpu>/``): no GPU needed.
"""
from __future__ import annotations

import math
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt

from .. import results
from . import memory_hierarchy, roofline

SLOW, FAST = results.REFERENCE_GPU, results.SECOND_GPU  # H100 80GB (3.35 TB/s datasheet), H200 (4.8 TB/s)
UNITS = {"fp32": "fp32", "tf32": "tf32", "tensor": "bf16"}  # a part's roof -> the ceilings record that sets it


def elasticity(t_slow: float, t_fast: float, bw_slow: float, bw_fast: float) -> float:
    """``ln(t_slow / t_fast) / ln(bw_fast / bw_slow)``: 1 when the time shrinks as the bandwidth grows, 0 when
    it does not change, negative when the faster-memory GPU is slower."""
    if min(t_slow, t_fast, bw_slow, bw_fast) <= 0:
        raise ValueError(f"times and bandwidths must be positive, got {t_slow}, {t_fast}, {bw_slow}, {bw_fast}")
    if bw_slow == bw_fast:
        raise ValueError("the two bandwidths are equal: the elasticity is undefined")
    return math.log(t_slow / t_fast) / math.log(bw_fast / bw_slow)


def predicted(intensity: float, peak_slow: float, peak_fast: float, bw_slow: float, bw_fast: float) -> float:
    """The roofline's elasticity for a kernel of ``intensity`` FLOP per byte: its time per byte is
    ``max(intensity / peak, 1 / bandwidth)`` on each GPU (peaks in GFLOP/s, bandwidths in GB/s): 1 below both
    ridges, 0 above both when the peaks are equal, in between where one GPU is past its ridge and the other not."""
    if intensity < 0:
        raise ValueError(f"intensity must be >= 0, got {intensity}")
    per_byte = [max(intensity / peak, 1 / bw) for peak, bw in ((peak_slow, bw_slow), (peak_fast, bw_fast))]
    return elasticity(*per_byte, bw_slow, bw_fast)


def combined(parts: list[tuple[float, float]]) -> float:
    """The share of a whole's time that follows bandwidth: ``sum(t_i * clip(e_i, 0, 1)) / sum(t_i)`` over its
    parts ``(t_i on the slower-memory GPU, e_i)``. For small changes a sum's elasticity is its parts' mean
    weighted by time; clipping reads e below 0 as "not bandwidth" and above 1 as "all bandwidth"."""
    total = sum(t for t, _ in parts)
    if not parts or total <= 0:
        raise ValueError("need parts with positive total time")
    return sum(t * min(max(e, 0.0), 1.0) for t, e in parts) / total


# --- one GPU's records -> samples -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One configuration of a part on one GPU: its time (``lo``/``hi``: the spread of repeated timings, if
    recorded), its arithmetic intensity in FLOP per DRAM byte where known, and the roof that applies to it."""

    t: float
    lo: float | None = None
    hi: float | None = None
    intensity: float | None = None
    unit: str = "fp32"
    commit: str | None = None  # the record's own commit, where it carries one (else the file's applies)


Extract = Callable[[list[dict], dict], dict[tuple, Sample]]


@dataclass(frozen=True)
class Part:
    """A part the course measures: where its records are (``topic``), how to read one GPU's into samples
    keyed by configuration (``extract(records, device)``; ``device``: that GPU's ``device`` record), the
    source files whose change would change it, and its expected e where a mechanism fixes it (host, latency)."""

    name: str
    topic: str
    group: str
    unit: str
    extract: Extract
    sources: tuple[str, ...]
    expected: float | None = None


def _spread(r: dict, lo: str, hi: str, scale: float = 1.0) -> tuple[float | None, float | None]:
    """The record's repeat extremes ``lo`` and ``hi`` (times ``scale``), or none."""
    both = r.get(lo) is not None and r.get(hi) is not None
    return (scale * r[lo], scale * r[hi]) if both else (None, None)


def _by(fields: tuple[str, ...], select: Callable[[dict], bool], time: Callable[[dict], float | None],
        spread: Callable[[dict], tuple] = lambda r: (None, None),
        intensity: Callable[[dict], float | None] = lambda r: None, unit: str = "fp32") -> Extract:
    """An extractor: records that ``select`` keeps, keyed by ``fields``, timed by ``time`` (None: skipped)."""
    def extract(records: list[dict], device: dict) -> dict[tuple, Sample]:
        out = {}
        for r in records:
            if select(r) and (t := time(r)) is not None and t > 0:
                out[tuple(r.get(f) for f in fields)] = Sample(t, *spread(r), intensity(r), unit, r.get("git_commit"))
        return out
    extract.fields = fields  # names the key's values in the verdict
    return extract


def _level(probe: str, level: str, value: str, per: Callable[[float], float]) -> Extract:
    """Notebook 01's probe records inside one level's window of working sets (from the GPU's L2 size)."""
    def extract(records: list[dict], device: dict) -> dict[tuple, Sample]:
        if not device.get("l2_bytes"):
            return {}  # no device record: the level's window is unknown
        lo, hi = memory_hierarchy.level_windows(device["l2_bytes"])[level]
        streams_hbm = probe == "bandwidth" and level == "HBM"  # no FLOPs: intensity 0; latency and L2: none
        return {(r["working_set_bytes"],): Sample(per(r[value]), intensity=0.0 if streams_hbm else None)
                for r in records if r.get("probe") == probe and lo <= r["working_set_bytes"] <= hi and r.get(value)}
    return extract


def _square_intensity(r: dict) -> float:
    op = next(o for o in roofline.operations(square=r["n"], itemsize=2 if r["dtype"] == "bf16" else 4)
              if o["operation"].startswith("matmul square"))
    return op["flops_per_byte"]


def _fused_intensity(r: dict) -> float | None:
    """Notebook 02's count for the fused forward (the minimum bytes); None for a backward pass."""
    if r.get("pass", "fwd") != "fwd":
        return None
    ops = roofline.operations(tokens=r["M"], hidden=r["N"], itemsize=4 if r["dtype"] == "fp32" else 2)
    return next(o for o in ops if o["operation"].startswith("fused"))["flops_per_byte"]


def _attention_intensity(r: dict) -> float | None:
    """A forward pass's FLOPs (from its TFLOP/s) over the bytes it must move: q, o (H heads) and k, v (H_kv)."""
    if r.get("pass") != "fwd" or not r.get("tflops"):
        return None
    nbytes = 2 * r["B"] * r["S"] * r["D"] * (2 * r["H"] + 2 * r.get("H_kv", r["H"]))
    return r["tflops"] * 1e12 * r["ms"] * 1e-3 / nbytes


def _gemv_intensity(r: dict) -> float:
    """One row times an nf4 matrix: 2 N K FLOPs over the bytes the record's GB/s counts."""
    return 2 * r["N"] * r["K"] / (r["gbps"] * 1e9 * r["ms"] * 1e-3)


def _rounds_per_token(r: dict) -> tuple[float | None, float | None]:
    rounds = [v for k, v in r.items() if k.startswith("round ") and k.endswith(" seconds") and v]
    return (min(rounds) / r["new_tokens"], max(rounds) / r["new_tokens"]) if rounds else (None, None)


_BENCH = ("helpers/bench.py",)
_PROBES = ("helpers/kernels/probes", *_BENCH)
_FUSED = ("helpers/kernels/fused_bias_gelu_layernorm.py", "helpers/kernels/gelu.py", "helpers/kernels/teaching",
          "helpers/studies/fused_kernel_timing.py", *_BENCH)
_NF4 = ("helpers/kernels/nf4_*", "helpers/studies/decoding_ladder.py", *_BENCH)
_DECODE = ("helpers/llama", "helpers/kernels", "helpers/studies/decoding_ladder.py", "scripts/decode_ladder.py")
_STEP = ("scripts/step_parts.py", "helpers/finetune", "helpers/llama", "helpers/kernels")
_SERVING = ("helpers/studies/continuous_batching.py", "helpers/studies/kv_cache.py", "helpers/llama",
            "helpers/kernels/paged_decode_attention.py", "helpers/kernels/decode_attention.py", *_BENCH)
_HOST = ("scripts/host_overhead.py", "helpers/kernels/rms_norm.py", "helpers/kernels/fused_bias_gelu_layernorm.py",
         *_BENCH)
_PEERS = ("scripts/peers_side_by_side.py", "helpers/studies/peer_kernels.py", "helpers/kernels", *_BENCH)
_SHAPE = ("pass", "dtype", "M", "N")


def _ms(r: dict) -> float | None:
    return r.get("ms")


def _parts() -> list[Part]:
    per_gb = lambda r: 1e3 / r["gbps"] if r.get("gbps") else None  # noqa: E731  (ms to move a GB)
    parts = [
        Part("copy 1 GiB (the yardstick, nb 00)", "ceilings", "memory", "ms/GB",
             _by(("what",), lambda r: r["what"] == "copy", per_gb, intensity=lambda r: 0.0), _BENCH),
        Part("stream from HBM (nb 01)", "memory_hierarchy", "memory", "ms/GB",
             _level("bandwidth", "HBM", "gbps", lambda v: 1e3 / v), ("helpers/studies/memory_hierarchy.py", *_PROBES)),
        Part("stream from L2 (nb 01)", "memory_hierarchy", "memory", "ms/GB",
             _level("bandwidth", "L2", "gbps", lambda v: 1e3 / v), ("helpers/studies/memory_hierarchy.py", *_PROBES),
             expected=0.0),
        Part("latency of an L2 hit (nb 01)", "memory_hierarchy", "latency", "ns/load",
             _level("latency", "L2", "ns_per_load", float), ("helpers/studies/memory_hierarchy.py", *_PROBES),
             expected=0.0),
        Part("latency of an HBM miss (nb 01)", "memory_hierarchy", "latency", "ns/load",
             _level("latency", "HBM", "ns_per_load", float), ("helpers/studies/memory_hierarchy.py", *_PROBES),
             expected=0.0),
        Part("roofline dial, fp32 FMA (nb 02)", "roofline", "compute", "ms/TFLOP",
             _by(("k",), lambda r: r.get("probe") == "dial",
                 lambda r: 1e6 / r["gflops"] if r.get("gflops") else (1e3 / r["gbps"] if r.get("gbps") else None),
                 intensity=lambda r: r["flops_per_byte"]), ("helpers/studies/roofline.py", *_PROBES)),
    ]
    for dtype, unit in (("bf16", "tensor"), ("tf32", "tf32"), ("fp32", "fp32")):
        parts.append(Part(f"matmul 8192^3, {dtype} (nb 00)", "ceilings", "compute", "ms",
                          _by(("n",), lambda r, d=dtype: r["what"] == "matmul" and r.get("dtype") == d, _ms,
                              intensity=_square_intensity, unit=unit), _BENCH))
    chain = ("helpers/studies/eager_chain.py", *_BENCH)
    parts += [
        Part("eager chain, each op (nb 03)", "naive_chain", "kernel", "ms",
             _by(("op", *_SHAPE), lambda r: r["what"] == "op", _ms, intensity=lambda r: r.get("flops_per_byte")),
             chain),
        Part("eager chain, whole (nb 03)", "naive_chain", "kernel", "ms",
             _by(_SHAPE, lambda r: r["what"] == "chain", _ms), chain),
        Part("launches issued from Python (nb 03)", "naive_chain", "host", "us/call",
             _by(("kernels",), lambda r: r["what"] == "launch overhead", lambda r: r.get("python_us"),
                 lambda r: _spread(r, "python_us_min", "python_us_max")), chain, expected=0.0),
        Part("launches replayed from a CUDA graph", "naive_chain", "launch", "us/call",
             _by(("kernels",), lambda r: r["what"] == "launch overhead", lambda r: r.get("graph_us")), chain,
             expected=0.0),
    ]
    for impl in ("triton", "compile", "eager"):
        for step in ("fwd", "fwd+bwd"):
            parts.append(Part(f"bias+GELU+LN {step}, {impl} (nb 04)", "fused_bias_gelu_layernorm", "kernel",
                              "ms", _by(("timing", *_SHAPE), lambda r, i=impl, s=step: (r["impl"], r["pass"]) == (i, s),
                                        _ms, intensity=_fused_intensity), _FUSED))
    parts.append(Part("fused ladder, Triton rungs (nb 04)", "fused_ladder", "kernel", "ms",
                      _by(("rung", "dtype", "M", "N"), lambda r: r.get("rung") is not None, _ms,
                          intensity=_fused_intensity), _FUSED))
    flash = ("helpers/kernels/flash_attention.py", "helpers/studies/attention_designs.py", *_BENCH)
    for impl in ("triton", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive"):
        parts.append(Part(f"attention, {impl} (nb 05)", "flash_attention", "kernel", "ms",
                          _by(("pass", "B", "H", "H_kv", "S", "D", "causal"),
                              lambda r, i=impl: r["impl"] == i and r.get("status") == "ok", _ms,
                              lambda r: _spread(r, "ms_p20", "ms_p80"), _attention_intensity, "tensor"), flash))
    for rung in (None, *range(1, 7)):
        parts.append(Part(f"nf4 GEMV, {'bitsandbytes' if rung is None else f'rung {rung}'} (nb 07)",
                          "nf4_ladder", "kernel", "ms",
                          _by(("N", "K"), lambda r, k=rung: r.get("rung") == k and (k or r["impl"] == "bitsandbytes"),
                              _ms, intensity=_gemv_intensity), _NF4))
    variants = ("stock generate", "static cache", "static cache + CUDA graph", "+ fused nf4 GEMV", "+ fused RMSNorm",
                "+ fused rotary & KV write", "+ fused SwiGLU & residual add", "+ attention over the live cache")
    for variant in variants:
        parts.append(Part(f"decode: {variant.replace(' the ', ' ')}", "decode", "decode", "ms/token",
                          _by(("model", "batch_size"), lambda r, v=variant: r["variant"] == v,
                              lambda r: 1e3 / r["tokens_per_s"] if r.get("tokens_per_s") else None,
                              lambda r: tuple(None if v is None else 1e3 * v for v in _rounds_per_token(r))),
                          _DECODE, expected=0.0 if variant == "stock generate" else None))
    train = lambda r: r["what"] == "train_parts"  # noqa: E731
    for column in ("matmul ms", "nf4 dequantise ms", "softmax ms", "element-wise ms", "optimizer ms", "host ms"):
        parts.append(Part(f"QLoRA step: {column[:-3]}", "step_parts", "step", "ms",
                          _by(("model", "batch_size"), train, lambda r, c=column: r.get(c)), _STEP,
                          expected=0.0 if column == "host ms" else None))
    parts.append(Part("QLoRA step: whole step", "step_parts", "step", "ms",
                      _by(("model", "batch_size"), train, lambda r: 1e3 * r["step_s"] if r.get("step_s") else None,
                          lambda r: _spread(r, "step_s_min", "step_s_max", 1e3)),
                      _STEP))
    for what, label in (("decode_parts", "eager"), ("graphed_decode_parts", "graphed")):
        for column, name in (("s_per_token", "token"), ("device_s_per_token", "device"),
                             ("host_s_per_token", "host")):
            parts.append(Part(f"decode parts, {label}: {name}", "step_parts", "decode", "ms/token",
                              _by(("model", "context", "variant"), lambda r, w=what: r["what"] == w,
                                  lambda r, c=column: 1e3 * r[c] if r.get(c) else None,
                                  (lambda r: _spread(r, "s_per_token_min", "s_per_token_max", 1e3))
                                  if column == "s_per_token" else (lambda r: (None, None))), _STEP,
                              expected=0.0 if name == "host" else None))
    parts += [
        Part("batched decoding step (nb 09)", "serving", "serving", "ms/step",
             _by(("batch", "context"), lambda r: r["what"] == "batch_decode", lambda r: r.get("step_ms"),
                 lambda r: _spread(r, "step_ms_min", "step_ms_max")), _SERVING),
        Part("batched decoding step, nf4 row kernel", "serving", "serving", "ms/step",
             _by(("batch", "context", "nf4_rows"), lambda r: r["what"] == "batch_decode_nf4_rows",
                 lambda r: r.get("step_ms"), lambda r: _spread(r, "step_ms_min", "step_ms_max")), _SERVING),
        Part("decode attention, paged kernel", "serving", "kernel", "ms",
             _by(("batch", "context", "heads", "kv_heads", "head_dim"),
                 lambda r: r["what"] == "kernel" and r.get("impl") == "paged", _ms,
                 lambda r: _spread(r, "ms_p20", "ms_p80")), _SERVING),
        Part("decode attention, contiguous kernel", "serving", "kernel", "ms",
             _by(("batch", "context", "heads", "kv_heads", "head_dim"),
                 lambda r: r["what"] == "kernel" and r.get("impl") == "contiguous", _ms,
                 lambda r: _spread(r, "ms_p20", "ms_p80")), _SERVING),
        Part("continuous-batching server", "serving", "serving", "ms/token",
             _by(("arrival_rate",), lambda r: r["what"] == "continuous",
                 lambda r: 1e3 / r["tokens_per_s"] if r.get("tokens_per_s") else None), _SERVING),
        Part("host time of a call (host_overhead)", "host_overhead", "host", "ms",
             _by(("what", "shape", "dtype", "order"), lambda r: "host_ms" in r, lambda r: r.get("host_ms"),
                 lambda r: _spread(r, "host_ms_p20", "host_ms_p80")), _HOST, expected=0.0),
        Part("device time of the same calls", "host_overhead", "kernel", "ms",
             _by(("what", "shape", "dtype", "order"), lambda r: "device_ms" in r, lambda r: r.get("device_ms")),
             _HOST),
    ]
    for kernel in ("rms_norm", "layer_norm", "swiglu", "rotary", "attention", "nf4_gemv"):
        parts.append(Part(f"peers, {kernel} (device time)", "peers", "kernel", "ms",
                          _by(("impl", "shape", "dtype", "causal", "pass"),
                              lambda r, k=kernel: r["kernel"] == k and r["timing"] == "device"
                              and r.get("status") == "ok", _ms, lambda r: _spread(r, "ms_p20", "ms_p80")), _PEERS))
    parts.append(Part("peers, timed from Python", "peers", "host", "ms",
                      _by(("kernel", "impl", "shape", "dtype", "causal", "pass"),
                          lambda r: r["timing"] == "python" and r.get("status") == "ok", _ms,
                          lambda r: _spread(r, "ms_p20", "ms_p80")), _PEERS))
    return parts


PARTS: list[Part] = _parts()


# --- did the code change between the two runs? ------------------------------------------------------------------

def code_status(commit_a: str | None, commit_b: str | None, sources: tuple[str, ...],
                repo: Path = results.REPO_ROOT) -> str:
    """Whether ``sources`` are the same at the two runs' commits: "same", "same*" (same files at both commits,
    but a run came from a checkout with uncommitted edits), "changed: <the files that differ>", or "unknown" (a
    commit not recorded, not in this checkout's history, or no git here)."""
    if not commit_a or not commit_b:
        return "unknown"
    dirty = commit_a.endswith("-dirty") or commit_b.endswith("-dirty")
    a, b = commit_a.removesuffix("-dirty"), commit_b.removesuffix("-dirty")
    git = ["git", "-c", f"safe.directory={repo}"]
    try:
        for c in (a, b):
            if subprocess.run([*git, "cat-file", "-e", f"{c}^{{commit}}"], cwd=repo, capture_output=True,
                              timeout=10).returncode != 0:
                return "unknown"
        diff = subprocess.run([*git, "diff", "--name-only", a, b, "--", *sources], cwd=repo, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if diff.returncode != 0:
        return "unknown"
    if diff.stdout.strip():
        return "changed: " + ", ".join(sorted(diff.stdout.split()))
    return "same*" if dirty else "same"


CODE_LEGEND = ("code: same = the part's source files are identical at both runs' commits; same* = identical at the\n"
               "commits, but a run came from a checkout with uncommitted edits; changed = some differ (listed below);\n"
               "unknown = a commit is missing from the records or from this checkout's history")


def changed_files(rows: list["Row"]) -> dict[str, str]:
    """The parts whose source files differ between the two runs, and those files."""
    return {r.part.name: r.code[9:] for r in rows if r.code.startswith("changed: ")}


def _commits(samples: list[Sample], result: results.Result) -> set[str | None]:
    """The commits the compared samples came from: their records' own where they carry one, else the file's."""
    own = {s.commit for s in samples if s.commit}
    return own or {result.provenance.get("git_commit")}


# --- the two GPUs side by side ----------------------------------------------------------------------------------

@dataclass
class Point:
    """One configuration measured on both GPUs."""

    key: tuple
    slow: Sample
    fast: Sample
    e: float
    e_lo: float | None
    e_hi: float | None


@dataclass
class Row:
    """One part on both GPUs: ``status`` is "compared" or says why not; ``e`` the median over its matched
    configurations, ``spread`` the median e from the repeats' extremes, ``points`` the configurations."""

    part: Part
    status: str
    points: list[Point] = field(default_factory=list)
    code: str = "unknown"

    @property
    def e(self) -> float | None:
        return statistics.median(p.e for p in self.points) if self.points else None

    @property
    def spread(self) -> tuple[float, float] | None:
        pairs = [(p.e_lo, p.e_hi) for p in self.points if p.e_lo is not None]
        if not pairs:
            return None
        return statistics.median(lo for lo, _ in pairs), statistics.median(hi for _, hi in pairs)

    @property
    def intensity(self) -> float | None:
        known = [p.slow.intensity for p in self.points if p.slow.intensity is not None]
        return statistics.median(known) if known else None

    def time(self, side: str) -> float | None:
        """The geometric mean of the part's times on one GPU ("slow" or "fast") over its configurations."""
        ts = [getattr(p, side).t for p in self.points]
        return math.exp(statistics.fmean(math.log(t) for t in ts)) if ts else None


def _pair(key: tuple, slow: Sample, fast: Sample, bw: tuple[float, float]) -> Point:
    """One configuration's e, and e from its repeats' extremes (slow GPU's fastest against fast GPU's slowest,
    and the reverse) where either GPU kept them."""
    e = elasticity(slow.t, fast.t, *bw)
    if slow.lo is None and fast.lo is None:
        return Point(key, slow, fast, e, None, None)
    s_lo, s_hi = (slow.lo, slow.hi) if slow.lo is not None else (slow.t, slow.t)
    f_lo, f_hi = (fast.lo, fast.hi) if fast.lo is not None else (fast.t, fast.t)
    return Point(key, slow, fast, e, elasticity(s_lo, f_hi, *bw), elasticity(s_hi, f_lo, *bw))


def build_row(part: Part, slow: results.Result | None, fast: results.Result | None, bw: tuple[float, float],
              devices: tuple[dict, dict], names: tuple[str, str] = (SLOW, FAST)) -> Row:
    """``part`` compared between the slower-memory GPU's result and the faster one's (None: not measured there);
    ``bw``: their copy bandwidths, ``devices``: their ``device`` records."""
    missing = [n for n, r in zip(names, (slow, fast)) if r is None]
    if missing:
        return Row(part, f"not measured on {' or '.join(missing)} yet")
    samples = [part.extract(r.records, d) for r, d in zip((slow, fast), devices)]
    keys = [k for k in samples[0] if k in samples[1]]
    if not keys:
        empty = [n for n, s in zip(names, samples) if not s]
        return Row(part, f"no records of it on {' or '.join(empty)} yet" if empty else "no configuration on both")
    points = [_pair(k, samples[0][k], samples[1][k], bw) for k in keys]
    status = worst(code_status(a, b, part.sources) for a in _commits([p.slow for p in points], slow)
                   for b in _commits([p.fast for p in points], fast))
    return Row(part, "compared", points, status)


def worst(statuses) -> str:
    """The least reassuring of several code statuses."""
    found = set(statuses)
    changed = sorted({f for s in found if s.startswith("changed: ") for f in s[9:].split(", ")})
    if changed:
        return "changed: " + ", ".join(changed)
    return next((s for s in ("unknown", "same*", "same") if s in found), "unknown")


def copy_bandwidths(slow: str = SLOW, fast: str = FAST) -> tuple[float, float]:
    """Each GPU's measured copy bandwidth (GB/s), from its committed ceilings (notebook 00)."""
    return tuple(roofline.ceiling_values(results.load("ceilings", gpu=g).records)["copy"] for g in (slow, fast))


def table(parts: list[Part] = PARTS, slow: str = SLOW, fast: str = FAST) -> list[Row]:
    """Every part compared between the two GPUs' committed results (parts one GPU lacks say so)."""
    bw = copy_bandwidths(slow, fast)
    devices = tuple((got.records[0] if (got := results.find("device", g)) else {}) for g in (slow, fast))
    cache: dict[tuple[str, str], results.Result | None] = {}
    rows = []
    for part in parts:
        loaded = [cache.setdefault((part.topic, g), results.find(part.topic, g)) for g in (slow, fast)]
        rows.append(build_row(part, *loaded, bw, devices, (slow, fast)))
    return rows


def runs(parts: list[Part] = PARTS, slow: str = SLOW, fast: str = FAST) -> list[str]:
    """One line a topic: the commit and date of each GPU's run of it, or that it has none yet."""
    def run(gpu: str, topic: str) -> str:
        got = results.find(topic, gpu)
        if got is None:
            return "none yet"
        p = got.provenance
        return f"{(p.get('git_commit') or 'no commit')[:7]}{'-dirty' * ('dirty' in (p.get('git_commit') or ''))} " \
               f"{(p.get('timestamp') or '')[:10]}"
    return [f"{topic:<26} {slow}: {run(slow, topic):<24} {fast}: {run(fast, topic)}"
            for topic in dict.fromkeys(p.topic for p in parts)]


def compare(name: str, slow: str = SLOW, fast: str = FAST) -> Row:
    """The row of the part called ``name``, from the two GPUs' committed results."""
    part = next((p for p in PARTS if p.name == name), None)
    if part is None:
        raise KeyError(f"no part {name!r}; the parts: {[p.name for p in PARTS]}")
    return table([part], slow, fast)[0]


def roof_peaks(slow: str = SLOW, fast: str = FAST) -> dict[str, tuple[float, float]]:
    """Each roof's measured peak on the two GPUs, GFLOP/s: ``{"fp32" | "tf32" | "tensor": (slow, fast)}``."""
    values = [roofline.ceiling_values(results.load("ceilings", gpu=g).records) for g in (slow, fast)]
    return {unit: (values[0][c] * 1e3, values[1][c] * 1e3) for unit, c in UNITS.items() if all(c in v for v in values)}


def expected(row: Row, peaks: dict[str, tuple[float, float]], bw: tuple[float, float]) -> float | None:
    """What the part's e should be: fixed by its mechanism (host, latency, L2), else the roofline's prediction at
    its median intensity, else None (unknown)."""
    if row.part.expected is not None:
        return row.part.expected
    if row.intensity is None or not row.points:
        return None
    unit = row.points[0].slow.unit
    return predicted(row.intensity, *peaks[unit], *bw) if unit in peaks else None


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _time(v: float | None) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.3g}")


def format_table(rows: list[Row], peaks: dict, bw: tuple[float, float], names: tuple[str, str] = ("H100", "H200"),
                 width: int = 38) -> str:
    """The rows as text: the part, its time on each GPU, e with its spread and its range over configurations,
    the intensity, the expected e and whether the code was the same."""
    head = (f"{'part':<{width}} {'unit':>8} {names[0]:>7} {names[1]:>7} {'e':>5} {'repeats':>12} {'n':>3} "
            f"{'e range':>12} {'FLOP/B':>6} {'exp.':>4} code")
    lines = [head]
    for row in rows:
        name = row.part.name[:width]
        if row.status != "compared":
            lines.append(f"{name:<{width}} {row.status}")
            continue
        spread = row.spread
        es = [p.e for p in row.points]
        lines.append(
            f"{name:<{width}} {row.part.unit:>8} {_time(row.time('slow')):>7} {_time(row.time('fast')):>7} "
            f"{_num(row.e):>5} {(f'{spread[0]:.2f}..{spread[1]:.2f}' if spread else 'none'):>12} "
            f"{len(row.points):>3} {(f'{min(es):.2f}..{max(es):.2f}' if len(es) > 1 else '-'):>12} "
            f"{_num(row.intensity, 1) if row.intensity is None or row.intensity < 100 else f'{row.intensity:,.0f}':>6}"
            f" {_num(expected(row, peaks, bw), 1):>4} {row.code.split(':')[0]}")
    return "\n".join(lines)


def off_prediction(rows: list[Row], peaks: dict, bw: tuple[float, float], margin: float = 0.3) -> list[Row]:
    """The compared parts whose e is more than ``margin`` from what they should be."""
    return [r for r in rows if r.status == "compared" and (x := expected(r, peaks, bw)) is not None
            and abs(r.e - x) > margin]


def shares(rows: list[Row], names: list[str], whole: str) -> dict[tuple, tuple[float, float]] | None:
    """For each configuration measured on both GPUs for every part in ``names``: (the share of the time that
    follows bandwidth by :func:`combined`, the ``whole`` part's own e). None where a part is not compared."""
    by_name = {r.part.name: r for r in rows}
    if any(by_name.get(n) is None or by_name[n].status != "compared" for n in [*names, whole]):
        return None
    points = [{p.key: p for p in by_name[n].points} for n in names]
    wholes = {p.key: p.e for p in by_name[whole].points}
    keys = [k for k in points[0] if all(k in p for p in points) and k in wholes]
    return {k: (combined([(p[k].slow.t, p[k].e) for p in points]), wholes[k]) for k in keys} or None


STEP_PARTS = [f"QLoRA step: {c}" for c in ("matmul", "nf4 dequantise", "softmax", "element-wise", "optimizer",
                                             "host")]
TOKEN_PARTS = ["decode parts, eager: device", "decode parts, eager: host"]


def verdict(rows: list[Row]) -> list[str]:
    """The verdict lines: the share of a QLoRA step's time and of a decoded token's time that follows bandwidth,
    by :func:`combined` over the parts' times on the reference GPU; where the data are missing, what would decide."""
    lines = []
    by_name = {r.part.name: r for r in rows}
    for what, names, whole, fix in (
            ("a QLoRA step", STEP_PARTS, "QLoRA step: whole step", "scripts/step_parts.py on the H100"),
            ("a decoded token (eager)", TOKEN_PARTS, "decode parts, eager: token",
             "scripts/step_parts.py on the H100 (its decode parts)")):
        got = shares(rows, names, whole)
        if got is None:
            lines.append(f"{what}: not decided; the parts are not measured on both GPUs. Deciding it needs {fix}.")
            continue
        fields = getattr(by_name[whole].part.extract, "fields", ())
        for key, (share, e) in got.items():
            where = ", ".join(f"{f} {v}" for f, v in zip(fields, key) if v is not None)
            lines.append(f"{what} ({where}): {100 * share:.0f}% of its time follows bandwidth (its own e: {e:.2f})")
    for name in ("decode: + attention over live cache", "decode: stock generate"):
        row = by_name.get(name)
        if row is not None and row.status == "compared":
            lines.append(f"{name}: e = {row.e:.2f}, so {100 * min(max(row.e, 0), 1):.0f}% of its token time follows "
                         "bandwidth")
        elif row is not None:
            lines.append(f"{name}: {row.status}; deciding it needs notebook 07's decoding ladder on that GPU")
    return lines


def plot(rows: list[Row], peaks: dict, bw: tuple[float, float], ax: plt.Axes | None = None) -> plt.Axes:
    """e against arithmetic intensity, one marker a configuration, with the roofline's prediction for the fp32
    and the bf16 tensor roofs and each GPU's ridges."""
    from ..plots import labelled_axes

    ax = labelled_axes("bandwidth elasticity against arithmetic intensity", "arithmetic intensity [FLOP per byte]",
                       "elasticity e", logx=True, ax=ax)
    xs = [0.05 * (1e4 / 0.05) ** (i / 300) for i in range(301)]
    for unit, style in (("fp32", "-"), ("tensor", "--")):
        if unit in peaks:
            ax.plot(xs, [predicted(x, *peaks[unit], *bw) for x in xs], "k" + style, lw=1,
                    label=f"roofline's prediction, {UNITS[unit]} roof")
    shown = [r for r in rows if r.status == "compared" and r.intensity is not None]
    for i, row in enumerate(shown):  # intensity 0 (a pure copy) drawn at the left edge
        pts = [(max(p.slow.intensity, 0.06), p.e) for p in row.points if p.slow.intensity is not None]
        ax.plot(*zip(*pts), "os^vD<>"[i % 7], color=f"C{i % 10}", ms=4, alpha=0.8, ls="none", label=row.part.name)
    ax.axhline(0, color="grey", lw=0.5)
    ax.axhline(1, color="grey", lw=0.5)
    ax.set_xlim(0.05, 1e4)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax
