"""Memory-hierarchy probes: the card's levels, bandwidth against working-set size, and the latency
of one dependent load at each level (pointer chasing).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

from .. import bench, datasheets, results
from ..device import DEVICE, HAS_CUDA, gpu_name, pick
from ..kernels.probes import pointer_chase, stream


@dataclass(frozen=True)
class Card:
    """The sizes of one card's memory levels, and where they came from."""

    name: str
    sms: int
    registers_per_sm_bytes: int
    smem_per_sm_bytes: int
    smem_per_block_bytes: int
    l2_bytes: int
    hbm_bytes: int
    hbm_datasheet_gbps: float | None
    source: str


def card(stand_in: str = "H100 SXM") -> Card:
    """This GPU's levels from its device properties (HBM bandwidth from ``helpers.datasheets``); without a
    GPU, the datasheet row ``stand_in`` (labelled so in ``source``)."""
    if HAS_CUDA:
        props = torch.cuda.get_device_properties(0)
        spec = datasheets.lookup(props.name)
        smem_block = getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block
        return Card(props.name, props.multi_processor_count, 4 * props.regs_per_multiprocessor,
                    props.shared_memory_per_multiprocessor, smem_block, props.L2_cache_size,
                    props.total_memory, spec.bandwidth_gbps if spec else None,
                    "device properties" + (f"; HBM bandwidth: datasheet ({spec.name})" if spec else ""))
    spec = datasheets.by_name(stand_in)
    return Card(spec.name, spec.sms, 4 * 65536, spec.smem_per_sm_kb * 1024, (spec.smem_per_sm_kb - 1) * 1024,
                int(spec.l2_mb * 2**20), int(spec.memory_gb * 1e9), spec.bandwidth_gbps,
                f"datasheet {spec.name} (no GPU here: 64K 32-bit registers per SM, 1 KB of shared memory "
                "per SM reserved)")


def hierarchy_rows(c: Card) -> list[dict]:
    """One row per level: what it is, its size per SM and on the whole card."""
    return [
        {"level": "registers", "per SM": f"{c.registers_per_sm_bytes // 1024} KB",
         "whole card": f"{c.sms * c.registers_per_sm_bytes / 2**20:.1f} MB", "seed's picture": "hands"},
        {"level": "shared memory / L1", "per SM": f"{c.smem_per_sm_bytes // 1024} KB "
         f"(one block: up to {c.smem_per_block_bytes // 1024} KB)",
         "whole card": f"{c.sms * c.smem_per_sm_bytes / 2**20:.1f} MB", "seed's picture": "workbench"},
        {"level": "L2 cache", "per SM": "shared by all SMs", "whole card": f"{c.l2_bytes / 2**20:.0f} MB",
         "seed's picture": "(not in the picture)"},
        {"level": "HBM", "per SM": "shared by all SMs", "whole card": f"{c.hbm_bytes / 2**30:.0f} GiB"
         + (f", {c.hbm_datasheet_gbps:,.0f} GB/s datasheet" if c.hbm_datasheet_gbps else ""),
         "seed's picture": "warehouse"},
    ]


def sizes(lo: int, hi: int, per_octave: int = 2, multiple: int = 4096) -> list[int]:
    """Geometric sizes from ``lo`` to ``hi`` bytes, ``per_octave`` per doubling, each a multiple of ``multiple``."""
    if not 0 < lo <= hi or per_octave < 1 or multiple < 1:
        raise ValueError(f"need 0 < lo <= hi, per_octave >= 1, multiple >= 1; got {lo}, {hi}, {per_octave}, {multiple}")
    steps = round(math.log2(hi / lo) * per_octave)
    out = sorted({max(multiple, round(lo * 2 ** (i / per_octave) / multiple) * multiple) for i in range(steps + 1)})
    return out


def _sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if HAS_CUDA else 1


def bandwidth_sweep(working_sets: list[int], *, programs: int | None = None, block: int = 4096,
                    num_warps: int = 8, target_bytes: int | None = None, progress: bool = True) -> list[dict]:
    """Read-only bandwidth for each working set (bytes): ``stream_sum`` over the first S bytes of one
    buffer, with enough passes that each launch reads about ``target_bytes``. Records:
    ``{"probe": "bandwidth", "working_set_bytes", "gbps", "passes", "ms"}``."""
    if not working_sets or any(s < 4 or s % 4 for s in working_sets):
        raise ValueError("working_sets must be a non-empty list of positive multiples of 4 bytes")
    programs = programs or pick(full=4 * _sm_count(), smoke=4)
    target_bytes = target_bytes or pick(full=2**31, smoke=2**17)
    buf = torch.rand(max(working_sets) // 4, device=DEVICE)
    out = torch.empty(programs, device=DEVICE)
    records = []
    for ws in _progress(working_sets, progress, "bandwidth sweep"):
        x = buf[: ws // 4]
        per_pass = stream.bytes_read(x.numel(), programs, block, 1)
        passes = max(1, target_bytes // per_pass)
        timing = bench.time_fn(lambda: stream.stream_sum(x, passes, programs, block, num_warps, out),
                               rep_ms=pick(full=100.0, smoke=1.0))
        records.append({"probe": "bandwidth", "working_set_bytes": ws, "gbps": timing.gbps(passes * per_pass),
                        "passes": passes, "ms": timing.ms})
    return records


def latency_ladder(working_sets: list[int], *, min_steps: int | None = None, full_cycle_nodes: int | None = None,
                   seed: int = 0, progress: bool = True) -> list[dict]:
    """Nanoseconds per dependent load for each working set (bytes; nodes one 128-byte line apart).

    Each chain is timed for s and 2s steps and the difference divided by s, so launch overhead and
    the cold first lap (time_fn empties the L2 before every run) cancel. Chains of up to
    ``full_cycle_nodes`` nodes are walked at least once round before the timed extra steps; longer
    ones (far beyond L2) are walked part-way, every load a miss. Records:
    ``{"probe": "latency", "working_set_bytes", "ns_per_load", "steps"}``."""
    node = 4 * pointer_chase.LINE_ELEMS
    if not working_sets or any(s < node or s % node for s in working_sets):
        raise ValueError(f"working_sets must be a non-empty list of positive multiples of {node} bytes")
    min_steps = min_steps or pick(full=2**15, smoke=64)
    full_cycle_nodes = full_cycle_nodes or pick(full=2**18, smoke=2**10)
    gen = torch.Generator().manual_seed(seed)
    records = []
    for ws in _progress(working_sets, progress, "latency ladder"):
        chain = pointer_chase.build_chain(ws, device=DEVICE, generator=gen)
        n_nodes = ws // node
        steps = max(min_steps, n_nodes) if n_nodes <= full_cycle_nodes else 2 * min_steps
        short, long = (bench.time_fn(lambda s=s, chain=chain: pointer_chase.chase(chain, s), warmup_ms=0, rep_ms=1,
                                     min_reps=3) for s in (steps, 2 * steps))
        records.append({"probe": "latency", "working_set_bytes": ws,
                        "ns_per_load": (long.ms - short.ms) * 1e6 / steps, "steps": steps})
        del chain
    return records


def level_windows(l2_bytes: int, l1_max: int = 32 * 1024, l2_min: int = 2**20) -> dict[str, tuple[float, float]]:
    """Working-set ranges (bytes) read as one level: L1 (up to ``l1_max``), L2 (``l2_min`` to half
    the L2) and HBM (four times the L2 and beyond)."""
    if not 0 < l1_max < l2_min <= l2_bytes / 2:
        raise ValueError(f"need 0 < l1_max < l2_min <= l2_bytes / 2, got {l1_max}, {l2_min}, {l2_bytes}")
    return {"L1": (0, l1_max), "L2": (l2_min, l2_bytes / 2), "HBM": (4 * l2_bytes, math.inf)}


def level_value(records: list[dict], key: str, window: tuple[float, float]) -> float:
    """Median of ``key`` over the records whose working set lies in ``window``; NaN if none does."""
    values = [r[key] for r in records if window[0] <= r["working_set_bytes"] <= window[1]]
    return statistics.median(values) if values else math.nan


@dataclass(frozen=True)
class Levels:
    """One run's sweeps read level by level, as notebook 01 reads its own: the plateaus (GB/s) of L2 and HBM
    and the latency (ns per load) of L1, L2 and HBM, each the median over its level's window."""

    bandwidth: list[dict]
    latency: list[dict]
    l2_bytes: int
    windows: dict[str, tuple[float, float]]
    gbps: dict[str, float]
    ns: dict[str, float]


def levels_of(records: list[dict], l2_bytes: int) -> Levels:
    """``records`` of a ``memory_hierarchy`` run (probe "bandwidth" and "latency") read with the windows of
    :func:`level_windows` for an L2 of ``l2_bytes``."""
    windows = level_windows(l2_bytes)
    bandwidth = [r for r in records if r["probe"] == "bandwidth"]
    latency = sorted((r for r in records if r["probe"] == "latency"), key=lambda r: r["working_set_bytes"])
    return Levels(bandwidth, latency, l2_bytes, windows,
                  {level: level_value(bandwidth, "gbps", windows[level]) for level in ("L2", "HBM")},
                  {level: level_value(latency, "ns_per_load", window) for level, window in windows.items()})


def reference_levels() -> tuple[Levels, results.Result]:
    """The reference GPU's committed sweeps (:func:`levels_of`, with the L2 its driver reported) and that run."""
    run = results.reference("memory_hierarchy")
    l2_bytes = results.load("device", gpu=run.path.parent.name).records[0]["l2_bytes"]
    return levels_of(run.records, l2_bytes), run


def littles_law(bandwidth_gbps: float, latency_ns: float, sms: int, threads_per_sm: int = 2048) -> dict:
    """Bytes that must be in flight to sustain ``bandwidth_gbps`` at ``latency_ns`` per load: on the
    card, per SM and per thread (all ``threads_per_sm`` resident)."""
    if bandwidth_gbps <= 0 or latency_ns <= 0 or sms < 1 or threads_per_sm < 1:
        raise ValueError("bandwidth, latency, sms and threads_per_sm must be positive")
    total = bandwidth_gbps * latency_ns  # (1e9 B/s) * (1e-9 s)
    return {"bytes_in_flight": total, "per_sm": total / sms, "per_thread": total / sms / threads_per_sm}


def plot_bandwidth(records: list[dict], l2_bytes: int, hbm_datasheet_gbps: float | None,
                   l2_gbps: float, hbm_gbps: float, ax: plt.Axes | None = None, name: str | None = None) -> plt.Axes:
    """GB/s against working set (log x) with the L2 size, the datasheet HBM rate and both plateaus marked;
    ``name``: whose run it is (this GPU's by default)."""
    from ..plots import labelled_axes

    ax = labelled_axes(f"{name or gpu_name()}: read bandwidth against working set", "working set [bytes]",
                       "read bandwidth [GB/s]", logx=True, ax=ax)
    ws = [r["working_set_bytes"] for r in records]
    ax.plot(ws, [r["gbps"] for r in records], "o-", label="measured (sum over the buffer, many passes)")
    ax.axvline(l2_bytes, color="C3", ls="--", lw=1, label=f"L2 size ({bytes_label(l2_bytes)})")
    if hbm_datasheet_gbps:
        ax.axhline(hbm_datasheet_gbps, color="0.5", ls=":", lw=1,
                   label=f"HBM datasheet ({hbm_datasheet_gbps:,.0f} GB/s)")
    for value, name, color in ((l2_gbps, "L2 plateau", "C1"), (hbm_gbps, "HBM plateau", "C2")):
        if math.isfinite(value):
            ax.axhline(value, color=color, lw=1, alpha=0.7, label=f"{name}: {value:,.0f} GB/s")
    if math.isfinite(l2_gbps) and math.isfinite(hbm_gbps) and hbm_gbps > 0:
        ax.annotate(f"leaving L2: {l2_gbps / hbm_gbps:.1f}x slower", xy=(l2_bytes, (l2_gbps + hbm_gbps) / 2),
                    xytext=(12, 0), textcoords="offset points", fontsize=10, color="C3")
    ax.set_xticks([2**p for p in range(int(math.log2(min(ws))), int(math.log2(max(ws))) + 1, 2)])
    ax.set_xticklabels([bytes_label(2**p) for p in range(int(math.log2(min(ws))), int(math.log2(max(ws))) + 1, 2)])
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left")
    return ax


def plot_latency(records: list[dict], l2_bytes: int, levels: dict[str, float], ax: plt.Axes | None = None,
                 name: str | None = None) -> plt.Axes:
    """Nanoseconds per dependent load against working set (log-log), each level's latency labelled; ``name``:
    whose run it is (this GPU's by default)."""
    from ..plots import labelled_axes

    ax = labelled_axes(f"{name or gpu_name()}: latency of one dependent load", "working set [bytes]",
                       "latency [ns per load]", logx=True, logy=True, ax=ax)
    ws = [r["working_set_bytes"] for r in records]
    ax.plot(ws, [max(r["ns_per_load"], 1e-3) for r in records], "o-", label="pointer chase (one thread)")
    ax.axvline(l2_bytes, color="C3", ls="--", lw=1, label=f"L2 size ({bytes_label(l2_bytes)})")
    for i, (name, value) in enumerate(levels.items()):
        if math.isfinite(value) and value > 0:
            ax.axhline(value, color=f"C{i + 1}", lw=1, alpha=0.6, label=f"{name}: {value:,.0f} ns")
    ax.set_xticks([2**p for p in range(int(math.log2(min(ws))), int(math.log2(max(ws))) + 1, 2)])
    ax.set_xticklabels([bytes_label(2**p) for p in range(int(math.log2(min(ws))), int(math.log2(max(ws))) + 1, 2)])
    ax.legend(loc="upper left")
    return ax


def bytes_label(n: float) -> str:
    """A byte count for people: "64 KB", "1.5 MB", "4 GB" (binary units)."""
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def _progress(items, enabled: bool, desc: str):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False)
