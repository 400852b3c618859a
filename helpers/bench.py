"""Timing on the GPU (CUDA events, L2 flushed, median of many runs) and on the CPU (perf_counter,
same interface), and the two ceilings every later notebook compares against: device copy
bandwidth and dense matmul throughput.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar

import torch

from .device import HAS_CUDA, pick

T = TypeVar("T")

_FLUSH_BYTES = 256 * 2**20  # larger than any L2 in helpers.datasheets


@dataclass(frozen=True)
class Timing:
    """Summary of repeated timings of one callable, in milliseconds."""

    ms: float  # median
    ms_p20: float
    ms_p80: float
    reps: int
    timer: str  # "cuda-events", "cuda-graph", "perf_counter", "host", "host, GPU busy" or "host, GPU caught up"

    def gbps(self, nbytes: float) -> float:
        """Bandwidth in GB/s (1e9 bytes/s) if the call moves ``nbytes``."""
        return nbytes / (self.ms * 1e-3) / 1e9

    def tflops(self, flops: float) -> float:
        """Throughput in TFLOP/s if the call does ``flops`` floating-point operations."""
        return flops / (self.ms * 1e-3) / 1e12


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def time_fn(fn: Callable[[], object], *, warmup_ms: float = 25.0, rep_ms: float = 100.0,
            min_reps: int = 5, max_reps: int = 1000, flush_l2: bool | str = True,
            device: str | None = None) -> Timing:
    """Time ``fn()``: warm up for ``warmup_ms``, then repeat for about ``rep_ms`` (within
    ``min_reps``..``max_reps`` runs) and return the median. On CUDA each run is bracketed by
    events and preceded by a write of 256 MB that evicts the L2, so every run starts cold;
    on the CPU the same loop uses ``time.perf_counter``.

    ``flush_l2``: True or "write" (the zero-fill above), "read" (evict by reading 256 MB instead, so
    the L2 holds no dirty lines that the timed call would have to write back), False (no flush).
    """
    if flush_l2 not in (True, False, "write", "read"):
        raise ValueError(f"flush_l2 must be True, False, 'write' or 'read', got {flush_l2!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not (0 < min_reps <= max_reps):
        raise ValueError(f"need 0 < min_reps <= max_reps, got {min_reps}, {max_reps}")
    if warmup_ms < 0 or rep_ms <= 0:
        raise ValueError(f"need warmup_ms >= 0 and rep_ms > 0, got {warmup_ms}, {rep_ms}")
    use_cuda = HAS_CUDA if device is None else device == "cuda"
    if use_cuda and not HAS_CUDA:
        raise RuntimeError("device='cuda' asked for, but this machine has no CUDA GPU")
    return _time_cuda(fn, warmup_ms, rep_ms, min_reps, max_reps, flush_l2) if use_cuda \
        else _time_cpu(fn, warmup_ms, rep_ms, min_reps, max_reps)


def _reps_for(estimate_ms: float, budget_ms: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(budget_ms / max(estimate_ms, 1e-6))))


def _time_cuda(fn, warmup_ms, rep_ms, min_reps, max_reps, flush_l2) -> Timing:
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda") if flush_l2 else None
    evict = flush.zero_ if flush_l2 in (True, "write") else (lambda: flush.max()) if flush_l2 else None
    fn()  # compile / autotune / allocate outside the timings
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = start.elapsed_time(end) / 3
    for _ in range(_reps_for(estimate, warmup_ms, 1, max_reps)):
        fn()
    reps = _reps_for(estimate, rep_ms, min_reps, max_reps)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        if evict is not None:
            evict()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return _summary([s.elapsed_time(e) for s, e in zip(starts, ends)], "cuda-events")


def _time_cpu(fn, warmup_ms, rep_ms, min_reps, max_reps) -> Timing:
    t0 = time.perf_counter()
    fn()
    estimate = (time.perf_counter() - t0) * 1e3
    for _ in range(_reps_for(estimate, warmup_ms, 0, max_reps)):
        fn()
    times = []
    for _ in range(_reps_for(estimate, rep_ms, min_reps, max_reps)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return _summary(times, "perf_counter")


def _summary(times_ms: list[float], timer: str) -> Timing:
    ordered = sorted(times_ms)
    return Timing(statistics.median(ordered), _quantile(ordered, 0.2), _quantile(ordered, 0.8), len(ordered), timer)


def capture_graph(fn: Callable[[], T], *, warmup: int = 1, after_each: Callable[[], object] | None = None,
                  pool: tuple | None = None, device: torch.device | None = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """Record one call of ``fn`` into a CUDA graph, without running it; the graph and what the recorded call
    returned (tensors the graph refills at every replay).

    First ``fn`` runs ``warmup`` times on a side stream, as capture requires: lazy initialisation, autotuning,
    cuBLAS workspaces and allocations happen there, not in the graph. ``after_each()`` runs after every
    warm-up call, on the side stream: it undoes what a call changed (a position, weights, an optimizer's state)
    so that the captured call starts where the first warm-up did. ``pool``: a memory pool shared with other
    graphs (``graph.pool()`` of one captured before).
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
            if after_each is not None:
                after_each()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def time_in_graph(calls: Sequence[Callable[[], object]], reps: int = 20) -> Timing:
    """Time a stream of calls as a decoder runs them: captured once, in order, into one CUDA graph
    (no launch gaps from the CPU), the graph replayed ``reps`` times; ms per call, median over replays.
    Give calls on distinct data larger than L2 together (e.g. one per copy of a weight), so each
    call starts cold as it would in a model. On the CPU the calls run eagerly under ``time_fn``.
    """
    calls = list(calls)
    if not calls or not all(callable(c) for c in calls):
        raise ValueError("calls must be a non-empty sequence of callables")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")

    def run_all() -> None:
        for c in calls:
            c()

    if not HAS_CUDA:
        t = time_fn(run_all, warmup_ms=0, rep_ms=1, min_reps=reps, max_reps=reps)
        return Timing(t.ms / len(calls), t.ms_p20 / len(calls), t.ms_p80 / len(calls), t.reps, t.timer)
    graph, _ = capture_graph(run_all)
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    return _summary(times, "cuda-graph")



STEADY_CALLS = pick(full=5, smoke=1)  # calls in one graph: the graph's own launch weighs a fifth as much on each
STEADY_REPS = pick(full=20, smoke=1)
STEADY_ROUNDS = pick(full=3, smoke=1)  # steady_state_rounds: rounds, every callable timed once in each, in turn


def steady_state_time(fn: Callable[[], object]) -> Timing:
    """``fn``'s device time in steady state, as inside a model: ``STEADY_CALLS`` calls back to back in one CUDA
    graph, replayed ``STEADY_REPS`` times (:func:`time_in_graph`; ms per call)."""
    return time_in_graph([fn] * STEADY_CALLS, reps=STEADY_REPS)


def median_round(rounds: Sequence[Timing]) -> Timing:
    """One timing from several rounds of the same call: the median round's (the lower of the two middle ones),
    its spread spanning every round's."""
    if not rounds:
        raise ValueError("median_round needs at least one round")
    ordered = sorted(rounds, key=lambda t: t.ms)
    mid = ordered[(len(ordered) - 1) // 2]
    return Timing(mid.ms, min(t.ms_p20 for t in ordered), max(t.ms_p80 for t in ordered),
                  sum(t.reps for t in ordered), mid.timer)


def steady_state_rounds(fns: Mapping[str, Callable[[], object]]) -> dict[str, Timing]:
    """:func:`steady_state_time` of each of ``fns``, in ``STEADY_ROUNDS`` rounds that take them in turn; each
    one's :func:`median_round`. A slow stretch of the GPU then weighs on every callable alike, not on whichever
    ran at that moment."""
    rounds: dict[str, list[Timing]] = {name: [] for name in fns}
    for _ in range(STEADY_ROUNDS):
        for name, fn in fns.items():
            rounds[name].append(steady_state_time(fn))
    return {name: median_round(ts) for name, ts in rounds.items()}


BUSY_CYCLES = 200_000_000  # host_time(busy_gpu=True)'s spin: about 0.1 s at an H100's or H200's clock


def host_time(fn: Callable[[], object], calls: int = 100, rounds: int = 5, busy_gpu: bool = False) -> Timing:
    """The host's time to issue one ``fn()``: ``calls`` back-to-back calls on the wall clock, the device never
    waited for inside a round (synchronised only before it starts), ms per call, median of ``rounds``. What a
    call costs the CPU (Python, argument checks, allocations, launches), apart from how long its kernels run;
    while it is above the device's time, the call is paced by the host. A call that waits for the device
    (``.item()``, a copy to the host) or more queued kernels than the driver's queue holds (about a thousand)
    measure the device too. On the CPU the call's whole time.
    ``busy_gpu`` (GPU only): each round first queues a kernel that spins ``BUSY_CYCLES`` clocks, so every launch
    joins a queue instead of finding the GPU idle; the timer then reads "host, GPU busy", or "host, GPU caught
    up" if the spin ended before a round did. Beside the plain timing: less here, a launch onto an idle GPU costs
    the host more; more, something in the call waits for the GPU."""
    if calls < 1 or rounds < 1:
        raise ValueError(f"calls and rounds must be >= 1, got {calls} and {rounds}")
    if busy_gpu and not HAS_CUDA:
        raise ValueError("busy_gpu=True needs a CUDA GPU to keep busy")
    fn()  # warm-up: compilation, the allocator's blocks, the dispatcher's caches
    times, caught_up = [], False
    for _ in range(rounds):
        if HAS_CUDA:
            torch.cuda.synchronize()
        if busy_gpu:
            torch.cuda._sleep(BUSY_CYCLES)
            spun = torch.cuda.Event()
            spun.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append(1e3 * (time.perf_counter() - t0) / calls)
        caught_up = caught_up or (busy_gpu and spun.query())
    if HAS_CUDA:
        torch.cuda.synchronize()
    return _summary(times, ("host, GPU caught up" if caught_up else "host, GPU busy") if busy_gpu else "host")


def launch_overhead(kernels: int = 1000, rounds: int = 5) -> dict:
    """A kernel launch's own cost: ``kernels`` additions of one element (a kernel with nothing to do) issued from
    Python, timed on the wall clock with the device synchronised before and after (median of ``rounds``), and the
    same additions captured once in a CUDA graph and replayed (GPU only: the host issues one replay). Returns
    microseconds per kernel each way; ``graph_us`` is None without a GPU."""
    if kernels < 1 or rounds < 1:
        raise ValueError(f"kernels and rounds must be >= 1, got {kernels} and {rounds}")
    x = torch.zeros(1, device="cuda" if HAS_CUDA else "cpu")

    def issue() -> None:
        for _ in range(kernels):
            x.add_(1.0)

    issue()  # warm-up: the kernel loaded, the allocator and the dispatcher's caches filled
    walls = []
    for _ in range(rounds):
        if HAS_CUDA:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        issue()
        if HAS_CUDA:
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    graph = time_in_graph([lambda: x.add_(1.0)] * kernels, reps=rounds) if HAS_CUDA else None
    return {"kernels": kernels, "rounds": rounds, "python_us": 1e6 * statistics.median(walls) / kernels,
            "python_us_min": 1e6 * min(walls) / kernels, "python_us_max": 1e6 * max(walls) / kernels,
            "graph_us": 1e3 * graph.ms if graph else None}


def copy_bandwidth(nbytes: int | None = None) -> dict:
    """Measured device copy bandwidth: ``dst.copy_(src)`` of ``nbytes``, counting read + write.

    Default size: 1 GiB on the GPU (far beyond L2), 16 MiB on the CPU.
    """
    nbytes = nbytes or pick(full=2**30, smoke=2**24)
    if nbytes < 4 or nbytes % 4:
        raise ValueError(f"nbytes must be a positive multiple of 4, got {nbytes}")
    device = "cuda" if HAS_CUDA else "cpu"
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    timing = time_fn(lambda: dst.copy_(src))
    if not torch.equal(dst, src):
        raise RuntimeError("copy ceiling: destination differs from source after the timed copies")
    return {"what": "copy", "bytes": nbytes, "ms": timing.ms, "gbps": timing.gbps(2 * nbytes)}


_MATMUL_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}


def matmul_tflops(dtype: str = "bf16", n: int | None = None) -> dict:
    """Measured dense matmul throughput of an ``n x n @ n x n`` product on random data.

    ``dtype``: "bf16", "fp16", "fp32" (true fp32, TF32 off) or "tf32" (fp32 storage, TF32 tensor cores).
    Default n: 8192 on the GPU, 256 on the CPU.
    """
    if dtype not in _MATMUL_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_MATMUL_DTYPES)}, got {dtype!r}")
    n = n or pick(full=8192, smoke=256)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    device = "cuda" if HAS_CUDA else "cpu"
    a = torch.randn(n, n, device=device, dtype=_MATMUL_DTYPES[dtype])
    b = torch.randn(n, n, device=device, dtype=_MATMUL_DTYPES[dtype])
    out = torch.empty(n, n, device=device, dtype=a.dtype)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        timing = time_fn(lambda: torch.matmul(a, b, out=out))
    finally:
        torch.set_float32_matmul_precision(previous)
    return {"what": "matmul", "dtype": dtype, "n": n, "ms": timing.ms, "tflops": timing.tflops(2.0 * n**3)}


def peak_memory_bytes(fn: Callable[[], object], warmup: bool = False) -> int | None:
    """Bytes the CUDA allocator held at its peak during ``fn()`` beyond what was allocated before it
    (the outputs and intermediates ``fn`` creates); None without a GPU (the CPU allocator keeps no peak).

    ``warmup=True`` calls ``fn`` once first, so one-off allocations (autotuning, workspaces) stay out.
    """
    if not HAS_CUDA:
        return None
    if warmup:
        fn()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak


def profiled(fn: Callable[[], object], reps: int = 1) -> torch.profiler.profile:
    """``fn()`` once to warm up, then ``reps`` times under ``torch.profiler`` (the host's operators, and on a GPU
    the device's kernels), the device synchronised before and after: the finished profile."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    fn()  # warm-up outside the profile
    activities = [torch.profiler.ProfilerActivity.CPU]
    if HAS_CUDA:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    # acc_events=True changes nothing here (one profiling cycle, no schedule); without it torch 2.11 warns
    # "Profiler clears events at the end of each cycle" even when there are no cycles (fixed in later torch)
    with torch.profiler.profile(activities=activities, acc_events=True) as prof:
        for _ in range(reps):
            fn()
        if HAS_CUDA:
            torch.cuda.synchronize()
    return prof


def profile_kernels(fn: Callable[[], object], reps: int = 5) -> list[dict]:
    """Run ``fn`` ``reps`` times under ``torch.profiler`` (:func:`profiled`) and list what ran, slowest first:
    ``{"name", "calls", "us_per_call"}``. On a GPU these are the CUDA kernels and their device
    time; on the CPU the ``aten::`` operators and their CPU time."""
    prof = profiled(fn, reps)
    rows = []
    for evt in prof.key_averages():
        if HAS_CUDA:
            if evt.device_type != torch.autograd.DeviceType.CUDA or evt.self_device_time_total <= 0:
                continue
            total = evt.self_device_time_total
        else:
            if not evt.key.startswith("aten::") or evt.self_cpu_time_total <= 0:
                continue
            total = evt.self_cpu_time_total
        rows.append({"name": evt.key, "calls": evt.count // reps, "us_per_call": total / max(evt.count, 1)})
    return sorted(rows, key=lambda r: -r["us_per_call"] * r["calls"])


# What a profiled kernel does, by a fragment of its name (lower-cased), first match wins: PyTorch's own
# kernels name their functor deep inside C++ templates, the libraries' kernels by their library's prefix.
KERNEL_ROLES: tuple[tuple[str, str], ...] = (
    ("layer_norm_grad_input", "LayerNorm backward: dx"),
    ("gammabetabackward", "LayerNorm backward: dW, db"),
    ("layer_norm", "LayerNorm forward"),
    ("rowwisemoments", "LayerNorm statistics"),
    ("gelubackward", "GELU backward"),
    ("gelu", "GELU"),
    ("gemm_4bit", "bitsandbytes nf4 matmul"),
    ("kdequantize", "bitsandbytes nf4 dequantise"),
    ("nvjet", "cuBLAS matmul"),
    ("gemm", "matmul (cuBLAS/CUTLASS)"),
    ("xmma", "matmul (cuBLAS)"),
    ("flash", "attention (FlashAttention)"),
    ("fmha", "attention (fused)"),
    ("argmaxops", "argmax (greedy token)"),
    ("meanops", "mean (RMSNorm's variance)"),
    ("sum_functor", "sum over rows"),
    ("reduce_kernel", "reduction"),
    ("catarray", "concatenate (torch.cat)"),
    ("indexselect", "gather rows (embedding)"),
    ("direct_copy", "copy / dtype cast"),
    ("memset", "fill with zeros"),
    ("memcpy", "copy"),
    ("mulfunctor", "multiply"),
    ("functor_add", "add"),
    ("neg_kernel", "negate (rotary)"),
    ("silu", "SiLU"),
    ("softmax", "softmax"),
    ("rsqrt", "reciprocal square root"),
    ("pow_tensor", "square"),
)


def _kernel_role(name: str) -> str:
    key = name.lower()
    if name.startswith("aten::"):
        return "PyTorch operator (CPU time)"
    if not any(c in name for c in "<(:") and name.startswith("_") and name.endswith("_kernel"):
        return "the course's Triton kernel"
    return next((role for fragment, role in KERNEL_ROLES if fragment in key), "other")


def short_kernel_name(name: str, width: int = 48) -> str:
    """A profiled kernel's name without its C++ template arguments, parameters and namespaces, at most
    ``width`` characters: ``void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDA...>(...)``
    becomes ``vectorized_elementwise_kernel<...>``."""
    if name.startswith("aten::"):  # a CPU run's operator names are short already
        return name[:width]
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "").strip()
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list starts at the first "(" outside the template brackets
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    head, bracket, _ = name[:cut].partition("<")
    short = head.split("::")[-1] + ("<...>" if bracket else "")
    return short if len(short) <= width else short[:width - 3] + "..."


def kernel_table(rows: list[dict], top: int = 12):
    """:func:`profile_kernels` rows as a readable table (a ``pandas.DataFrame``): a short name, what each kernel
    does, calls, microseconds a call and its share of the device time; the ``top`` slowest in total, then one
    row for the rest."""
    import pandas as pd

    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    total = sum(r["us_per_call"] * r["calls"] for r in rows) or 1.0
    table = [{"kernel": short_kernel_name(r["name"]), "what": _kernel_role(r["name"]), "calls": r["calls"],
              "us_per_call": r["us_per_call"], "% of time": 100 * r["us_per_call"] * r["calls"] / total}
             for r in rows[:top]]
    rest = rows[top:]
    if rest:
        table.append({"kernel": f"({len(rest)} other kernels)", "what": "", "calls": sum(r["calls"] for r in rest),
                      "us_per_call": float("nan"),
                      "% of time": 100 * sum(r["us_per_call"] * r["calls"] for r in rest) / total})
    return pd.DataFrame(table)
