"""The course's kernels beside what a user would pick instead, timed side by side in one run.

Each :class:`Case` is one kernel (:data:`KERNELS`) on one shape and dtype, computed by several
implementations (``impl``): the course's kernel, the same PyTorch code eager and under ``torch.compile``, and the
strongest library peer where there is one (Liger-Kernel for the norms, SwiGLU and rotary; cuDNN and flash SDPA
for attention; bitsandbytes for the nf4 matrix-vector product). Each is timed forward and, where it has one,
forward+backward, two ways:

* ``python``: CUDA events around back-to-back calls from Python, no cache flush in between, so the host's work
  (autograd, argument checks, launches) is in the time when it is longer than the GPU's: what a user sees;
* ``device``: the same call captured ``bench.STEADY_CALLS`` times in a row into one CUDA graph and replayed
  (``bench.steady_state_time``): the GPU's time alone, the replay's own launch (a few microseconds) shared by
  those calls. The implementations take turns, ``bench.STEADY_ROUNDS`` rounds of one graph each; the time is the
  median round's, the spread spans every round's (``bench.median_round``). A slow stretch of the GPU, or an
  unlucky placement of one graph's memory, then weighs on each implementation alike instead of on whichever ran
  at that moment;
* ``host``: the host's time to issue the call, the GPU running behind (``bench.host_time``): where ``python`` is
  above ``device``, this is what paces the call.

Every implementation's output is compared with eager PyTorch's on the same inputs (``max_abs_diff``), so a fast
row that computes something else shows. Liger-Kernel is optional (``pip install liger-kernel``): without it,
or without a GPU (its kernels need CUDA), its rows are left out. On a CPU every kernel runs once, tiny, in the
Triton interpreter: the code paths are checked, the times mean nothing.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from . import attention_designs, eager_chain, decoding_ladder
from .. import bench
from ..bench import Timing, host_time, median_round, steady_state_time, time_fn
from ..device import DEVICE, HAS_CUDA, pick
from ..kernels.fused_bias_gelu_layernorm import fused_bias_gelu_layernorm
from ..kernels.rms_norm import rms_norm
from ..kernels.rotary import rotary
from ..kernels.swiglu import swiglu

KERNELS = ("rms_norm", "layer_norm", "swiglu", "rotary", "attention", "nf4_gemv")
TIMINGS = ("python", "device", "host")
TIMING = pick(full={}, smoke={"warmup_ms": 0, "rep_ms": 1, "min_reps": 1})
HOST_TIMING = pick(full={"calls": 50, "rounds": 5}, smoke={"calls": 1, "rounds": 1})
# torch.compile past its recompile limit falls back to eager without a word: here that is an error, recorded
NO_SILENT_EAGER = ({"fail_on_recompile_limit_hit": True}
                   if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit") else {})
FAILURES = (RuntimeError, getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", RuntimeError))
EPS = 1e-6


def has_liger() -> bool:
    """Liger-Kernel is installed and can run here (it needs a CUDA GPU)."""
    return HAS_CUDA and importlib.util.find_spec("liger_kernel") is not None


def eager_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm``: statistics in fp32, the weight applied in its own dtype."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def eager_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """transformers' ``apply_rotary_pos_emb`` for Llama (cos, sin of shape (1, S, D))."""
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def eager_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@dataclass
class Case:
    """One kernel on one shape: its inputs (``leaves`` get gradients), and a function per implementation."""

    kernel: str
    shape: str
    dtype: str
    impls: dict[str, Callable]
    leaves: list[torch.Tensor]
    others: list[torch.Tensor] = field(default_factory=list)  # inputs without gradients (cos, sin)
    causal: bool | None = None
    backward: bool = True
    calls: int = 1  # kernel calls one run of an implementation makes (the times are per call)

    def call(self, impl: str) -> Callable[[], object]:
        fn = self.impls[impl]
        return lambda: fn(*self.leaves, *self.others)


def _compiled(fn: Callable) -> Callable:
    return torch.compile(fn, dynamic=False)  # its compilations are dropped before each case (measure)


def _randn(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, device=DEVICE, dtype=torch.float32)).to(dtype).requires_grad_()


def rms_norm_case(m: int, n: int, wdtype: str, out_bf16: bool = False) -> Case:
    """Llama's RMSNorm over ``m`` rows of ``n`` bf16 elements, the weight ``wdtype`` ("bf16", or "fp32" as in a QLoRA
    model's norms). With an fp32 weight transformers returns fp32, which Liger-Kernel does not offer (it writes x's
    dtype, a third fewer bytes): Liger takes part only where the output is bf16, and ``out_bf16`` asks every
    implementation for that (the course's ``out_dtype``, eager's and compile's result cast)."""
    def eager(x, w):
        y = eager_rms_norm(x, w)
        return y.to(torch.bfloat16) if out_bf16 else y

    out = torch.bfloat16 if out_bf16 else None
    impls = {"course": lambda x, w: rms_norm(x, w, EPS, out_dtype=out), "eager": eager, "compile": _compiled(eager)}
    if has_liger() and (wdtype == "bf16" or out_bf16):
        from liger_kernel.transformers.functional import liger_rms_norm
        impls["liger"] = lambda x, w: liger_rms_norm(x, w, EPS)
    weight = _randn(n, dtype=torch.bfloat16 if wdtype == "bf16" else torch.float32)
    shape = f"{m} x {n}, weight {wdtype}" + (", output bf16" if out_bf16 else "")
    return Case("rms_norm", shape, "bf16", impls, [_randn(m, n, dtype=torch.bfloat16), weight])


def rms_norm_cases() -> list[Case]:
    """Llama's RMSNorm at its widths (4,096, 5,120, 8,192), bf16, weight bf16 or fp32 (output fp32, as transformers,
    or bf16, as Liger)."""
    shapes = pick(full=[(4096, 4096, "bf16"), (32768, 4096, "bf16"), (16384, 5120, "bf16"), (8192, 8192, "bf16"),
                        (32768, 4096, "fp32")], smoke=[(6, 40, "bf16"), (6, 40, "fp32")])
    return [rms_norm_case(m, n, wdtype) for m, n, wdtype in shapes] + [
        rms_norm_case(m, n, wdtype, out_bf16=True) for m, n, wdtype in shapes if wdtype == "fp32"]


def layer_norm_cases() -> list[Case]:
    """The fused bias + GELU + LayerNorm over 64M elements; Liger's LayerNorm alone (it skips the bias and GELU,
    so it does less) as the nearest library kernel."""
    elems = pick(full=1 << 26, smoke=1 << 8)
    cases = []
    for n, dname in pick(full=[(n, d) for d in ("bf16", "fp32") for n in (1024, 4096, 8192)], smoke=[(32, "bf16")]):
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dname]
        impls = {"course": fused_bias_gelu_layernorm, "eager": eager_chain.eager_chain,
                 "compile": _compiled(eager_chain.eager_chain)}
        if has_liger():
            from liger_kernel.transformers.functional import liger_layer_norm
            impls["liger"] = lambda x, b, w, lb: liger_layer_norm(x, w, lb, 1e-5)
        cases.append(Case("layer_norm", f"{elems // n} x {n}", dname, impls,
                          [_randn(elems // n, n, dtype=dtype)] + [_randn(n, dtype=dtype) for _ in range(3)]))
    return cases


def swiglu_cases() -> list[Case]:
    """``silu(gate) * up`` at Llama-2-7B's MLP width (11,008) for 8,192 tokens."""
    m, n = pick(full=(8192, 11008), smoke=(6, 40))
    impls = {"course": swiglu, "eager": eager_swiglu, "compile": _compiled(eager_swiglu)}
    if has_liger():
        from liger_kernel.transformers.functional import liger_swiglu
        impls["liger"] = liger_swiglu
    return [Case("swiglu", f"{m} x {n}", "bf16", impls, [_randn(m, n, dtype=torch.bfloat16) for _ in range(2)])]


def rotary_cases() -> list[Case]:
    """Rotary embedding of q and k at B 4, H 32, S 4,096, D 128."""
    b, h, s, d = pick(full=(4, 32, 4096, 128), smoke=(1, 2, 6, 8))
    angles = torch.arange(s, device=DEVICE, dtype=torch.float32)[:, None] * torch.rand(d // 2, device=DEVICE)
    angles = torch.cat((angles, angles), dim=-1)[None]
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    impls = {"course": rotary, "eager": eager_rotary, "compile": _compiled(eager_rotary)}
    if has_liger():
        from liger_kernel.transformers.functional import liger_rope
        impls["liger"] = liger_rope
    return [Case("rotary", f"B{b} H{h} S{s} D{d}", "bf16", impls,
                 [_randn(b, h, s, d, dtype=torch.bfloat16) for _ in range(2)], [cos, sin])]


def attention_cases() -> list[Case]:
    """FlashAttention at B 4, H 32, S 4,096, D 128, causal and not; at S 1,024 with as many tokens (B 16) and with a
    quarter of them (B 4, forward only); at D 64 (forward only)."""
    full = [(4, 32, 4096, 128, False, True), (4, 32, 4096, 128, True, True), (16, 32, 1024, 128, False, True),
            (4, 32, 1024, 128, False, False), (4, 32, 4096, 64, False, False)]
    peers = pick(full={"course": "triton", "cudnn": "sdpa_cudnn", "flash": "sdpa_flash"},
                 smoke={"course": "triton", "eager": "naive"})
    cases = []
    for b, h, s, d, causal, backward in pick(full=full, smoke=[(1, 2, 40, 64, True, True)]):
        q, k, v, _ = attention_designs.make_inputs(b, h, s, d, torch.bfloat16 if HAS_CUDA else torch.float32)
        impls = {name: (lambda fn, c=causal: lambda q, k, v: fn(q, k, v, c))(attention_designs.implementation(impl))
                 for name, impl in peers.items()}
        cases.append(Case("attention", f"B{b} H{h} S{s} D{d}", "bf16" if HAS_CUDA else "fp32", impls, [q, k, v],
                          causal=causal, backward=backward))
    return cases


def nf4_gemv_cases() -> list[Case]:
    """One token's ``x @ W^T`` through a Llama-2-7B MLP weight (11,008 x 4,096), nf4 with nested scales."""
    import bitsandbytes as bnb

    from ..kernels.nf4_format import nf4_operands
    from ..kernels.nf4_gemv import nf4_matmul

    n, k = pick(full=(11008, 4096), smoke=(64, 128))
    weights = decoding_ladder.nf4_weights(n, k)  # copies beyond the L2, each read from HBM as in a model
    ops = [nf4_operands(w) for w in weights]
    x = torch.randn(1, k, device=DEVICE, dtype=torch.bfloat16)
    impls = {"course": lambda x: tuple(nf4_matmul(x, o) for o in ops),
             "bitsandbytes": lambda x: tuple(bnb.matmul_4bit(x, w[0].t(), quant_state=w[1]) for w in weights),
             "eager": lambda x: tuple(F.linear(x, bnb.functional.dequantize_4bit(*w)) for w in weights)}
    return [Case("nf4_gemv", f"1 x {k} @ ({n} x {k})^T", "bf16", impls, [x], backward=False, calls=len(weights))]


CASES = {"rms_norm": rms_norm_cases, "layer_norm": layer_norm_cases, "swiglu": swiglu_cases,
         "rotary": rotary_cases, "attention": attention_cases, "nf4_gemv": nf4_gemv_cases}


def runner(case: Case, impl: str, pass_: str) -> Callable[[], object]:
    """A call of no arguments running ``impl`` on ``case``'s inputs: its forward (``pass_`` "fwd", no autograd) or
    its forward and backward through ``torch.autograd.grad`` ("fwd+bwd", random output gradients)."""
    call = case.call(impl)
    if pass_ == "fwd":
        def run():
            with torch.no_grad():
                return call()
        return run
    outs = call()
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]
    # allow_unused: a peer that does less (Liger's LayerNorm has no bias + GELU) leaves an input without gradient
    return lambda: torch.autograd.grad(call(), case.leaves, grads, allow_unused=True)


def _max_abs_diff(case: Case, impl: str) -> float:
    with torch.no_grad():
        ref, out = case.call("eager" if "eager" in case.impls else "course")(), case.call(impl)()
    ref, out = (ref if isinstance(ref, tuple) else (ref,)), (out if isinstance(out, tuple) else (out,))
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(ref, out))


def _time(run: Callable[[], object], timing: str) -> Timing:
    if timing == "host":
        return host_time(run, **HOST_TIMING)
    if timing == "python":
        return time_fn(run, flush_l2=False, **TIMING)
    return steady_state_time(run)


def measure(case: Case) -> list[dict]:
    """Every implementation of ``case``, each pass it has, timed each way (``TIMINGS``; the device timing in
    ``bench.STEADY_ROUNDS`` rounds, the implementations in turn): one record per timing. An implementation that
    fails (no kernel for the shape, a graph it cannot be captured in) is a record too, with ``status`` naming the
    error and no time."""
    torch._dynamo.reset()  # each case compiles afresh: one function over many shapes would reach the recompile limit
    diffs = {}
    for impl in case.impls:
        try:
            diffs[impl] = _max_abs_diff(case, impl)
        except FAILURES:  # the timing below fails the same way and records why
            diffs[impl] = None
    records = []
    for pass_ in ("fwd", "fwd+bwd") if case.backward else ("fwd",):
        runs = {impl: runner(case, impl, pass_) for impl in case.impls}
        for timing in TIMINGS:
            times, failed = {impl: [] for impl in runs}, {}
            for _ in range(bench.STEADY_ROUNDS if timing == "device" else 1):
                for impl in (i for i in runs if i not in failed):
                    try:
                        with torch._dynamo.config.patch(**NO_SILENT_EAGER):
                            times[impl].append(_time(runs[impl], timing))
                    except FAILURES as error:
                        failed[impl] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            for impl in runs:
                record = {"kernel": case.kernel, "impl": impl, "shape": case.shape, "dtype": case.dtype,
                          "causal": case.causal, "pass": pass_, "timing": timing, "status": failed.get(impl, "ok"),
                          "ms": None, "ms_p20": None, "ms_p80": None, "max_abs_diff": diffs[impl]}
                if impl not in failed:
                    t = median_round(times[impl])
                    record.update(ms=t.ms / case.calls, ms_p20=t.ms_p20 / case.calls, ms_p80=t.ms_p80 / case.calls)
                records.append(record)
    return records


def run(kernels: tuple[str, ...] = KERNELS, progress: Callable[[str], None] | None = None) -> list[dict]:
    """The side-by-side records of ``kernels``, one case after the other (their inputs freed in between)."""
    unknown = [k for k in kernels if k not in CASES]
    if unknown:
        raise ValueError(f"unknown kernels {unknown}; known: {KERNELS}")
    records = []
    for kernel in kernels:
        for case in CASES[kernel]():
            if progress:
                progress(f"{kernel} {case.shape}")
            records += measure(case)
            del case
            if HAS_CUDA:
                torch.cuda.empty_cache()
    return records


def ratios(records: list[dict], peer: str, impl: str = "course") -> list[dict]:
    """``peer``'s time over ``impl``'s for every (kernel, shape, dtype, causal, pass, timing) both have:
    above 1, ``impl`` is faster. Where the records have percentiles, ``low``/``high`` bound the ratio over both
    timings' spread: ``peer``'s 20th percentile over ``impl``'s 80th, and the reverse."""
    key = ("kernel", "shape", "dtype", "causal", "pass", "timing")
    by = {(tuple(r[k] for k in key), r["impl"]): r for r in records if r["ms"]}
    out = []
    for (k, i), mine in by.items():
        theirs = by.get((k, peer))
        if i != impl or theirs is None:
            continue
        row = {**dict(zip(key, k)), "peer": peer, "ratio": theirs["ms"] / mine["ms"]}
        if mine.get("ms_p80") and theirs.get("ms_p20"):
            row.update(low=theirs["ms_p20"] / mine["ms_p80"], high=theirs["ms_p80"] / mine["ms_p20"])
        out.append(row)
    return out
