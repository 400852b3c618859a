"""The roofline model: attainable FLOP/s = min(peak FLOP/s, intensity x bandwidth); the arithmetic
intensity of the course's operations; the intensity-dial sweep; the plots.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

from .. import bench, datasheets, results
from ..card_fit import CardLimits
from ..device import DEVICE, HAS_CUDA, gpu_name, pick
from ..kernels.probes import intensity_dial


@dataclass(frozen=True)
class Roof:
    """One roofline: a compute ceiling (GFLOP/s) and a memory ceiling (GB/s)."""

    name: str
    peak_gflops: float
    bandwidth_gbps: float

    def __post_init__(self) -> None:
        if not (self.peak_gflops > 0 and self.bandwidth_gbps > 0):
            raise ValueError(f"{self.name}: peak and bandwidth must be positive, got "
                             f"{self.peak_gflops}, {self.bandwidth_gbps}")

    @property
    def ridge(self) -> float:
        """FLOP per byte where the memory slope meets the compute ceiling."""
        return self.peak_gflops / self.bandwidth_gbps

    def attainable(self, flops_per_byte: float) -> float:
        """The most GFLOP/s a kernel of this intensity can reach under this roof."""
        if flops_per_byte < 0:
            raise ValueError(f"intensity must be >= 0, got {flops_per_byte}")
        return min(self.peak_gflops, flops_per_byte * self.bandwidth_gbps)


def spec_roof(spec: datasheets.GpuSpec, unit: str = "tensor") -> Roof:
    """A card's datasheet roof: 16-bit tensor cores ("tensor") or plain fp32 FMA ("fp32")."""
    if unit not in ("tensor", "fp32"):
        raise ValueError(f"unit must be 'tensor' or 'fp32', got {unit!r}")
    peak = spec.tensor_tflops if unit == "tensor" else spec.fp32_tflops
    return Roof(f"{spec.name} {'bf16 tensor' if unit == 'tensor' else 'fp32'}", peak * 1e3, spec.bandwidth_gbps)


# the architecture of each compute capability the course runs on (CUDA C++ Programming Guide, compute capabilities)
ARCHITECTURES = {(7, 5): "Turing", (8, 0): "Ampere", (8, 6): "Ampere", (8, 7): "Ampere", (8, 9): "Ada Lovelace",
                 (9, 0): "Hopper"}


def measured_spec(ceilings: list[dict], props=None) -> datasheets.GpuSpec:
    """A row for this GPU without a datasheet one: its own properties (``props``: the CUDA device's), NVML's
    highest clock and power limit, and in place of the datasheet's peaks the ceilings measured on it
    (notebook 00's ``ceilings`` records: the copy and the bf16, tf32 and fp32 matmuls). Measured ceilings sit
    below datasheet peaks: ridge points and shares of the peak read against them are the card's practical ones."""
    props = props or torch.cuda.get_device_properties(DEVICE)
    got = {r.get("dtype", r["what"]): r for r in ceilings}
    missing = [k for k in ("copy", "bf16", "fp32") if k not in got]
    if missing:
        raise ValueError(f"measured_spec needs the copy and the bf16 and fp32 matmul ceilings; missing {missing}")
    from ..monitor import card_limits

    boost_mhz, tdp_w = card_limits()
    tensor = got["bf16"]["tflops"]
    return datasheets.GpuSpec(
        props.name, ARCHITECTURES.get((props.major, props.minor), f"sm_{props.major}{props.minor}"), None,
        tensor, tensor, got["tf32"]["tflops"] if "tf32" in got else None, got["fp32"]["tflops"],
        props.total_memory / 1e9, got["copy"]["gbps"], props.L2_cache_size / 2**20, props.multi_processor_count,
        getattr(props, "shared_memory_per_multiprocessor", 0) // 1024, boost_mhz, tdp_w, None, 0,
        "measured here: the copy and matmul ceilings of notebook 00 in place of datasheet peaks; the rest from the "
        "driver", re.escape(props.name))


def card_spec(ceilings: list[dict] | None = None) -> tuple[datasheets.GpuSpec, str]:
    """This GPU's datasheet row and a note on where it came from. A GPU without a row gets one from its own
    properties and measured ceilings (:func:`measured_spec`): ``ceilings`` measured in this run, else the ones
    notebook 00 saved for it, else measured now. Without a GPU: the reference H100's row, labelled as such."""
    if not HAS_CUDA:
        return datasheets.by_name("H100 SXM"), "no GPU here: the reference H100's datasheet row stands in"
    spec = datasheets.lookup(gpu_name())
    if spec is not None:
        return spec, f"datasheet row {spec.name!r} for {gpu_name()}"
    if ceilings is None:
        try:
            ceilings = results.load("ceilings", gpu=results.gpu_slug()).records
        except FileNotFoundError:
            ceilings = [bench.copy_bandwidth(), *(bench.matmul_tflops(d) for d in ("bf16", "tf32", "fp32"))]
    return measured_spec(ceilings), (f"no datasheet row for {gpu_name()}: its own properties and the ceilings "
                                     "measured on it stand in for the datasheet's peaks")


def support_line(card: CardLimits | None) -> str | None:
    """One line on what the course can do on ``card``: nothing to say (None) from sm_80 up or without a GPU."""
    if card is None or card.triton_tensor_cores:
        return None
    if not card.supported:
        return (f"{card.name} ({card.arch}) is not supported: the course needs sm_75 (T4) or newer, and the CUDA 13 "
                "builds of PyTorch no longer run on older cards")
    return f"{card.slow_triton_reason()}: the course's kernels run correctly but slower than on sm_80 and newer"


def ceiling_values(records: list[dict]) -> dict[str, float]:
    """Notebook 00's ceiling records as ``{"copy": GB/s, "bf16" | "tf32" | "fp32": TFLOP/s}``."""
    return {r.get("dtype", r["what"]): r["gbps"] if r["what"] == "copy" else r["tflops"] for r in records}


def reference_ceilings() -> tuple[dict[str, float], results.Result]:
    """The reference GPU's committed ceilings (:func:`ceiling_values` of its run) and that run, for provenance."""
    ref = results.reference("ceilings")
    return ceiling_values(ref.records), ref


def saved_roofline(records: list[dict]) -> tuple[list[dict], float, dict[str, dict]]:
    """Notebook 02's saved ``roofline`` records read back: the dial records, the copy ceiling (GB/s), and each
    matmul ceiling by dtype as ``bench.matmul_tflops`` returns it (``{"n": ..., "tflops": ...}``)."""
    dial = [r for r in records if r["probe"] == "dial"]
    ceilings = [r for r in records if r["probe"] == "ceiling"]
    copy_gbps = next(r["gbps"] for r in ceilings if r["what"] == "copy")
    matmuls = {r["dtype"]: {"n": int(r["what"].split("n=")[1]), "tflops": r["gflops"] / 1e3}
               for r in ceilings if r["what"].startswith("matmul n=")}
    return dial, copy_gbps, matmuls


# FLOPs per element (tanh and exp counted as one operation each): the counting convention of the course.
GELU_FLOPS = 9  # tanh form: x^3 (2), *0.044715, +x, *sqrt(2/pi), tanh, +1, *x, *0.5
LAYERNORM_FLOPS = 8  # mean (1), variance (3), normalise (2), scale and shift (2)
SOFTMAX_FLOPS = 5  # max, subtract, exp, sum, divide


def _op(name: str, kind: str, flops: float, nbytes: float, unit: str) -> dict:
    return {"operation": name, "kind": kind, "flops": float(flops), "bytes": float(nbytes),
            "flops_per_byte": flops / nbytes, "unit": unit}


def _matmul(name: str, m: int, n: int, k: int, itemsize: int) -> dict:
    return _op(name, "matmul", 2 * m * n * k, itemsize * (m * k + k * n + m * n), "tensor")


def operations(tokens: int = 16384, hidden: int = 4096, seq: int = 4096, head_dim: int = 128,
               square: int = 8192, itemsize: int = 2) -> list[dict]:
    """FLOPs, minimum bytes and intensity of the course's operations on ``itemsize``-byte (bf16) data.

    Element-wise kernels act on a ``tokens x hidden`` activation; attention is one head's forward
    pass over ``seq`` tokens of ``head_dim`` (the intensity does not depend on batch or heads).
    ``square``: the side of the square matmul (notebook 00 measures 8192).
    ``unit``: which roof applies ("fp32" for CUDA-core math, "tensor" for matrix products)."""
    if min(tokens, hidden, seq, head_dim, square, itemsize) < 1:
        raise ValueError("all sizes must be >= 1")
    e, b = tokens * hidden, itemsize
    s, d = seq, head_dim
    return [
        _op("vector add (x + y)", "elementwise", e, 3 * b * e, "fp32"),
        _op("naive chain 1: bias add", "elementwise", e, 2 * b * e + b * hidden, "fp32"),
        _op("naive chain 2: GELU", "elementwise", GELU_FLOPS * e, 2 * b * e, "fp32"),
        _op("naive chain 3: LayerNorm", "elementwise", LAYERNORM_FLOPS * e, 2 * b * e + 2 * b * hidden, "fp32"),
        _op("fused bias+GELU+LayerNorm (predicted)", "elementwise",
            (1 + GELU_FLOPS + LAYERNORM_FLOPS) * e, 2 * b * e + 3 * b * hidden, "fp32"),
        _op("softmax (rows of S x S scores)", "elementwise", SOFTMAX_FLOPS * s * s, 2 * b * s * s, "fp32"),
        _matmul(f"matmul square {square}^3", square, square, square, b),
        _matmul(f"matmul skinny {tokens}x{hidden} @ {hidden}x16", tokens, 16, hidden, b),
        _matmul(f"decode GEMV 1x{hidden} @ {hidden}x{hidden}", 1, hidden, hidden, b),
        _op(f"attention naive (S={s}, d={d})", "attention", 4 * s * s * d + SOFTMAX_FLOPS * s * s,
            b * (2 * s * d + s * s) + b * 2 * s * s + b * (s * s + 2 * s * d), "tensor"),
        _op(f"attention flash (S={s}, d={d})", "attention", 4 * s * s * d + SOFTMAX_FLOPS * s * s,
            b * 4 * s * d, "tensor"),
    ]


def dial_sweep(ks: list[int], n_elements: int | None = None, *, block: int = 2048, num_warps: int = 4,
               progress: bool = True) -> list[dict]:
    """Time the intensity dial for each k on ``n_elements`` float32 values. Records:
    ``{"probe": "dial", "dtype": "fp32", "k", "flops_per_byte", "gflops", "gbps", "ms"}``."""
    if not ks or any(not isinstance(k, int) or k < 0 for k in ks):
        raise ValueError("ks must be a non-empty list of non-negative ints")
    n_elements = n_elements or pick(full=2**28, smoke=2**12)
    x = torch.rand(n_elements, device=DEVICE)
    out = torch.empty_like(x)
    records = []
    items = ks
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(ks, desc="intensity dial", leave=False)
    for k in items:
        timing = bench.time_fn(lambda: intensity_dial.dial(x, k, out=out, block=block, num_warps=num_warps),
                               rep_ms=pick(full=100.0, smoke=1.0))
        flops, nbytes = intensity_dial.flops_and_bytes(n_elements, k)
        records.append({"probe": "dial", "dtype": "fp32", "k": k, "flops_per_byte": flops / nbytes,
                        "gflops": flops / timing.ms / 1e6, "gbps": timing.gbps(nbytes), "ms": timing.ms})
    return records


def knee(records: list[dict], memory_fraction: float = 0.9) -> dict:
    """Where the dial turns from memory-bound to compute-bound, read off its own records:
    ``asymptotes``: the intensity where its low-intensity bandwidth meets its top FLOP/s;
    ``bandwidth_drops``: the first intensity whose bandwidth falls under ``memory_fraction`` of the
    lowest-intensity one."""
    ordered = sorted(records, key=lambda r: r["flops_per_byte"])
    if len(ordered) < 2:
        raise ValueError("need at least two dial records")
    bw0, top = ordered[0]["gbps"], max(r["gflops"] for r in ordered)
    drops = next((r["flops_per_byte"] for r in ordered if r["gbps"] < memory_fraction * bw0), math.nan)
    return {"asymptotes": top / bw0, "bandwidth_drops": drops, "low_gbps": bw0, "top_gflops": top}


def plot_roofline(roofs: list[Roof], ax: plt.Axes | None = None, lo: float = 0.05, hi: float = 1e4,
                  title: str | None = None) -> plt.Axes:
    """Draw each roof (log-log GFLOP/s against FLOP per byte) with its ridge point marked."""
    from ..plots import labelled_axes

    ax = labelled_axes(title or "roofline", "arithmetic intensity [FLOP per byte]", "attainable [GFLOP/s]",
                       logx=True, logy=True, ax=ax)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for i, roof in enumerate(roofs):
        color = f"C{i}"
        ax.plot(xs, [roof.attainable(x) for x in xs], color=color, lw=1.5, label=roof.name)
        ax.plot([roof.ridge], [roof.peak_gflops], "o", color=color, ms=5)
        ax.annotate(f"ridge {roof.ridge:,.0f}", (roof.ridge, roof.peak_gflops), xytext=(4, 6),
                    textcoords="offset points", fontsize=8, color=color)
    ax.set_xlim(lo, hi)
    return ax


def generations(names: list[str]) -> list[dict]:
    """Datasheet compute, bandwidth and FLOP per byte of the cards ``names`` (``helpers.datasheets``)."""
    rows = []
    for name in names:
        s = datasheets.by_name(name)
        rows.append({"card": s.name, "year": s.year, "16-bit tensor TFLOP/s": s.tensor_tflops,
                     "fp32 TFLOP/s": s.fp32_tflops, "HBM GB/s": s.bandwidth_gbps,
                     "tensor FLOP per byte": s.ridge_flops_per_byte,
                     "fp32 FLOP per byte": s.fp32_tflops * 1e3 / s.bandwidth_gbps})
    return rows
