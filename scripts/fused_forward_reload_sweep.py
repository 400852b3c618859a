"""A design sweep for the fused ``LayerNorm(GELU(x + bias))`` forward: does it get closer to the copy bandwidth
if the three length-N parameter vectors are *reloaded every row block* instead of being held in registers?

Background (SASS study on the H200, bf16 N = 8192): the library's table launch (2 rows x 16 warps per
program) costs ~26 instructions/element at 122 registers. 1 row x 8 warps would save ~3 instructions/element
(fewer cross-warp reduction steps) but needs 170 registers, because bias/weight/ln_bias stay in registers
across the persistent row loop (3 x 32 fp32 values per thread), leaving one program per SM. Here each row
block loads bias just before GELU and weight/ln_bias only after the statistics (short live ranges, the
vectors stay hot in L1/L2 with ``evict_last``), so that 8 warps a row should fit 2-3 programs per SM.

Variants (all in ``_fwd_reload_kernel``, the one-block-a-row path only, N <= 16384, any N through masks):
  * ``reload``   parameters read from their own tensors (input dtype) every row block; two-pass statistics
                 on the values in registers, as the library computes them.
  * ``ws``       the same, the parameters read from a (3, N) fp32 workspace converted once (outside the
                 timed call: a model would keep it with the parameters), so no per-row conversion for bf16.
                 Loaded as 1-D vectors, fp32 gets 4 values a thread where bf16 x has 8, and Triton moves
                 them into x's layout through shared memory (STS/LDS + barriers, 8 KiB; SASS study).
  * ``f32p``     the parameters as three separate fp32 vectors (converted once outside the timed call, like
                 ``ws``), each loaded as a [ROWS, BLOCK_N] tile of x's shape, so that it gets x's layout
                 directly: no per-row conversion and no relayout. (Loaded 1-D, separate vectors compile to
                 exactly ``ws``'s kernel: the kernel cannot tell a workspace row from a vector.) For fp32
                 inputs its compiled kernels are plain ``reload``'s (SASS study), so the sweep runs it for bf16.
  * ``1pass``    mean and variance from one fused reduction of (sum v, sum v^2) -- one cross-warp round
                 instead of two, ~1 fewer op per element -- at the cost of E[v^2] - mean^2 (fine for
                 activations whose |mean| is not >> std; a real kernel would want a shift).
Each with ``rows`` rows per program, ``num_warps``, and a launch that is either one program per row block
(grid = cdiv(M, rows)) or persistent (grid = k x SMs, each program looping over row blocks, optionally
prefetching its next block or software-pipelining the loop in ``stages``). k = "occ" takes k = the number
of programs the compiled kernel's registers/shared memory let one SM hold.

    python scripts/fused_forward_reload_sweep.py --check   # CPU, Triton interpreter, small shapes, vs library and float64
    python scripts/fused_forward_reload_sweep.py           # GPU sweep (< 200 s), table on stdout, JSON to $OUT if set
    python scripts/fused_forward_reload_sweep.py --smoke --ns 1024   # the sweep's code path on tiny shapes (any machine)

Columns of the sweep: regs/spill per thread and occ (programs one SM can hold) of the compiled kernel; grid;
ms (median of >= 20 runs, L2 flushed); GB/s over x + y + 8 B/row of statistics + the 3 parameter rows;
that as % of a 1 GiB device copy and of a copy the size of x; comp_s = first launch (compile) seconds.
"""
from __future__ import annotations

import time

_T0 = time.perf_counter()  # the GPU sweep's time budget counts from here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import helpers  # noqa: E402,F401  first: without a GPU it switches Triton to its interpreter
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from helpers import bench, chain, results  # noqa: E402
from helpers.kernels import fused_bias_gelu_layernorm as K  # noqa: E402
from helpers.kernels.fused_bias_gelu_layernorm import _gelu, _mask  # noqa: E402  (jit helpers the kernel calls)

EPS = 1e-5


# ----------------------------------------------------------------------------------------------- kernel
@triton.jit
def _add_pair(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _load_param(P, rows, cols, N, EVEN_N: tl.constexpr, TILE: tl.constexpr):
    """A length-N parameter vector as fp32, kept in L1/L2 for the next row blocks (evict_last). TILE: loaded
    as a [ROWS, BLOCK_N] tile (the vector repeated, x's shape) instead of a [BLOCK_N] vector. That matters for
    an fp32 vector next to a bf16 x: Triton gives a 1-D fp32 load 4 values a thread (one 128-bit load) where x
    has 8, then moves it into x's layout through shared memory (``ws``); a load of x's shape gets x's 8 values
    a thread (two 128-bit loads) and needs no relayout. The repeated rows cost no loads: each address is loaded
    once (sm_90 SASS: ROWS = 2 issues as many parameter loads as ROWS = 1)."""
    offs = cols[None, :] + 0 * rows[:, None] if TILE else cols
    if EVEN_N:
        p = tl.load(P + offs, eviction_policy="evict_last")
    else:
        p = tl.load(P + offs, mask=offs < N, other=0.0, eviction_policy="evict_last")
    return p.to(tl.float32)


@triton.jit
def _load_x(X, rows, cols, M, N, EVEN_N: tl.constexpr):
    """A [ROWS, BLOCK_N] tile of x in its storage dtype, streamed (evict_first); 0 outside the matrix."""
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    return tl.load(X + offs, mask=_mask(rows, cols, M, N, EVEN_N), other=0.0, eviction_policy="evict_first")


@triton.jit
def _normalize_store(x, rows, cols, B, W, LB, Y, MEAN, RSTD, M, N, eps,
                     GELU: tl.constexpr, EVEN_N: tl.constexpr, FAST: tl.constexpr, ONEPASS: tl.constexpr,
                     PTILE: tl.constexpr):
    """One row block: GELU(x + b), statistics, normalise, affine, store y / mean / rstd. The parameters are
    loaded here, each right before its use, so that none is live across the row loop."""
    b = _load_param(B, rows, cols, N, EVEN_N, PTILE)
    v = _gelu(x.to(tl.float32) + (b if PTILE else b[None, :]), GELU, FAST)  # masked lanes: x = b = 0 -> 0
    if ONEPASS:  # one reduction of two operands: a single cross-warp round
        s, ss = tl.reduce((v, v * v), 1, _add_pair)
        mean = s / N
        var = tl.maximum(ss / N - mean * mean, 0.0)
        d = v - mean[:, None]  # garbage in masked lanes, never stored
    else:  # two-pass, as the library
        mean = tl.sum(v, axis=1) / N
        d = v - mean[:, None]
        if not EVEN_N:
            d = tl.where((cols < N)[None, :], d, 0.0)
        var = tl.sum(d * d, axis=1) / N
    rstd = tl.rsqrt(var + eps)
    w = _load_param(W, rows, cols, N, EVEN_N, PTILE)  # only now: not held across the reductions
    lb = _load_param(LB, rows, cols, N, EVEN_N, PTILE)
    if PTILE:  # (two spellings: the 1-D one as it was, so that its compiled kernels stay the same)
        y = d * (rstd[:, None] * w) + lb
    else:
        y = d * (rstd[:, None] * w[None, :]) + lb[None, :]
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=_mask(rows, cols, M, N, EVEN_N))
    row_ok = rows < M
    tl.store(MEAN + rows, mean, mask=row_ok)
    tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _fwd_reload_kernel(X, B, W, LB, Y, MEAN, RSTD, M, N, eps,
                       BLOCK_N: tl.constexpr, ROWS: tl.constexpr, GELU: tl.constexpr, EVEN_N: tl.constexpr,
                       FAST: tl.constexpr, ONEPASS: tl.constexpr, PERSISTENT: tl.constexpr,
                       PREFETCH: tl.constexpr, STAGES: tl.constexpr, PTILE: tl.constexpr):
    """PERSISTENT: program p handles row blocks p, p + P, ... (P programs), loading the parameters again for
    each (PREFETCH: the next block's x is loaded while this one is computed; STAGES > 1: Triton pipelines
    the loop instead). Otherwise program p handles row block p alone."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    r = tl.arange(0, ROWS)
    if PERSISTENT:
        n_prog = tl.num_programs(0)
        if PREFETCH:
            x_next = _load_x(X, pid * ROWS + r, cols, M, N, EVEN_N)
        for blk in tl.range(pid, tl.cdiv(M, ROWS), n_prog, num_stages=STAGES):
            rows = blk * ROWS + r
            if PREFETCH:
                x = x_next
                x_next = _load_x(X, rows + n_prog * ROWS, cols, M, N, EVEN_N)
            else:
                x = _load_x(X, rows, cols, M, N, EVEN_N)
            _normalize_store(x, rows, cols, B, W, LB, Y, MEAN, RSTD, M, N, eps, GELU, EVEN_N, FAST, ONEPASS,
                             PTILE)
    else:
        rows = pid * ROWS + r
        _normalize_store(_load_x(X, rows, cols, M, N, EVEN_N), rows, cols, B, W, LB, Y, MEAN, RSTD, M, N, eps,
                         GELU, EVEN_N, FAST, ONEPASS, PTILE)


# ----------------------------------------------------------------------------------------------- launch
@dataclass(frozen=True)
class Variant:
    """One launch of ``_fwd_reload_kernel``. ``persist``: 0 = one program per row block; k > 0 = k programs
    per SM, each looping; -1 = k from the compiled kernel's occupancy (GPU; 1 until it is known)."""

    rows: int
    num_warps: int
    persist: int = 0
    prefetch: bool = False  # persistent only
    stages: int = 1  # persistent only
    onepass: bool = False
    ws: bool = False  # parameters from the fp32 workspace
    f32p: bool = False  # parameters from three fp32 vectors, loaded as tiles of x's shape

    def label(self) -> str:
        kind = "1pass" if self.onepass else "reload"
        kind += "+ws" if self.ws else ""
        kind += "+f32p" if self.f32p else ""
        if self.persist == 0:
            launch = "grid=blocks"
        else:
            launch = "persist k=" + ("occ" if self.persist < 0 else str(self.persist))
            launch += " pf" if self.prefetch else ""
            launch += f" st{self.stages}" if self.stages > 1 else ""
        return f"{kind} r{self.rows} w{self.num_warps} {launch}"


def make_workspace(b, w, lb) -> torch.Tensor:
    """The parameters as one contiguous (3, N) fp32 tensor."""
    return torch.stack([b, w, lb]).float().contiguous()


def make_f32_params(b, w, lb) -> tuple[torch.Tensor, ...]:
    """The parameters as three separate contiguous fp32 vectors (for ``f32p``)."""
    return tuple(p.float().contiguous() for p in (b, w, lb))


def launch(v: Variant, x, b, w, lb, ws=None, f32=None, programs_per_sm: int = 1, sm_count: int = 1):
    """Run variant ``v`` (``ws``: the workspace, ``f32``: the fp32 vectors, for the variants that read them):
    returns ``(y, mean, rstd)``, the compiled kernel (None in the interpreter) and the grid size. For
    persistent variants the grid is ``min(row blocks, programs_per_sm * sm_count)``."""
    m, n = x.shape
    block = triton.next_power_of_2(n)
    if block > K.MAX_BLOCK_FWD:
        raise ValueError(f"N = {n}: only the one-block-a-row path (N <= {K.MAX_BLOCK_FWD}) is explored")
    blocks = triton.cdiv(m, v.rows)
    grid = min(blocks, programs_per_sm * sm_count) if v.persist else blocks
    pb, pw, plb = (ws[0], ws[1], ws[2]) if v.ws else f32 if v.f32p else (b, w, lb)
    y = torch.empty_like(x)
    mean, rstd = torch.empty((2, m), dtype=torch.float32, device=x.device)
    handle = _fwd_reload_kernel[(grid,)](
        x, pb, pw, plb, y, mean, rstd, m, n, EPS, BLOCK_N=block, ROWS=v.rows, GELU=K._gelu_mode("auto", x.dtype),
        EVEN_N=block == n, FAST=K.FAST_ASM, ONEPASS=v.onepass, PERSISTENT=v.persist != 0,
        PREFETCH=v.prefetch and v.persist != 0, STAGES=v.stages if v.persist else 1, PTILE=v.f32p,
        num_warps=v.num_warps)
    return (y, mean, rstd), handle, grid


def lib_launch(x, b, w, lb, cfg: K.Config):
    """The library's kernel launched exactly as ``K.forward`` launches it, to get at the compiled kernel
    (registers, occupancy); its output is checked to equal ``K.forward``'s."""
    m, n = x.shape
    y = torch.empty_like(x)
    mean, rstd = torch.empty((2, m), dtype=torch.float32, device=x.device)
    programs = cfg.programs(m, x.device)
    handle = K._forward_kernel[(programs,)](
        x, b, w, lb, y, mean, rstd, m, n, EPS, BLOCK_N=cfg.block_n, ROWS=cfg.rows, SINGLE=cfg.block_n >= n,
        GELU=K._gelu_mode("auto", x.dtype), LAYERNORM=True, HAS_W=True, HAS_LB=True, EVEN_N=cfg.block_n == n,
        FAST=K.FAST_ASM, PREFETCH=cfg.prefetches(m, x.device), STAGES=cfg.stages, num_warps=cfg.num_warps)
    return (y, mean, rstd), handle, programs


def reference64(x, b, w, lb):
    """float64 ``LayerNorm(GELU(x + b))`` with exact GELU, and the row mean / rstd of GELU(x + b)."""
    v = F.gelu(x.double() + b.double())
    mean = v.mean(-1)
    rstd = torch.rsqrt(v.var(-1, unbiased=False) + EPS)
    return F.layer_norm(v, (x.shape[-1],), w.double(), lb.double(), EPS), mean, rstd


# ------------------------------------------------------------------------------------------- comparison
# (atol, rtol) for y; bf16 outputs of nearly equal fp32 values differ by <= 1 ulp = 2**-7 of the value.
Y_TOL = {"lib": {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-3, 2.0**-7)},
         "f64": {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-2, 2.0**-7)}}
STAT_TOL = (1e-4, 1e-4)  # mean and rstd (fp32 in every case; bf16's fast GELU moves them by ~1e-5)


def compare(got, ref, y_tol) -> dict:
    """Max |error| of y, mean, rstd against ``ref`` and the worst error / tolerance ratio (<= 1 passes)."""
    out, worst = {}, 0.0
    for name, g, r, (atol, rtol) in zip(("y", "mean", "rstd"), got, ref, (y_tol, STAT_TOL, STAT_TOL)):
        g, r = g.double(), r.double()
        err = (g - r).abs()
        out[f"err_{name}"] = err.max().item()
        ratio = (err / (atol + rtol * r.abs())).nan_to_num(nan=float("inf"))  # a NaN anywhere fails
        worst = max(worst, ratio.max().item())
    out["tol_ratio"] = worst
    out["ok"] = bool(worst <= 1.0)
    return out


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_inputs(m, n, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, n, generator=g, device=device, dtype=torch.float32).to(dtype)
    b, w, lb = (torch.randn(n, generator=g, device=device, dtype=torch.float32).to(dtype) for _ in range(3))
    return x, b, w, lb


# ------------------------------------------------------------------------------------------------ check
CHECK_VARIANTS = [Variant(1, 4), Variant(2, 4, persist=2, prefetch=True), Variant(4, 4, persist=2),
                  Variant(1, 2, persist=2, stages=2), Variant(1, 4, onepass=True),
                  Variant(2, 4, persist=2, prefetch=True, onepass=True), Variant(1, 4, persist=2, ws=True),
                  Variant(2, 4, onepass=True, ws=True), Variant(1, 4, f32p=True), Variant(2, 4, f32p=True),
                  Variant(2, 4, persist=2, prefetch=True, f32p=True)]


def run_check() -> int:
    """Every check variant against the library forward and the float64 reference, M = 5 rows (with
    sm_count = 1, a persistent launch of k = 2 programs loops over several row blocks, partial last block)."""
    device = helpers.DEVICE
    print(helpers.describe())
    failures = 0
    t0 = time.perf_counter()
    for dname, dtype in DTYPES.items():
        for n in (64, 100, 1024):
            x, b, w, lb = make_inputs(5, n, dtype, device, seed=n)
            lib = K.forward(x, b, w, lb, EPS)
            f64 = reference64(x, b, w, lb)
            c = compare(lib, f64, Y_TOL["f64"][dtype])
            print(f"{dname} N={n:5d} {'library forward':40s} vs f64: y {c['err_y']:.2e} mean {c['err_mean']:.2e} "
                  f"rstd {c['err_rstd']:.2e} (tol ratio {c['tol_ratio']:.2f})")
            ws, f32 = make_workspace(b, w, lb), make_f32_params(b, w, lb)
            for v in CHECK_VARIANTS:
                got, _, _ = launch(v, x, b, w, lb, ws, f32, programs_per_sm=max(v.persist, 1), sm_count=1)
                cl, cf = compare(got, lib, Y_TOL["lib"][dtype]), compare(got, f64, Y_TOL["f64"][dtype])
                ok = cl["ok"] and cf["ok"]
                failures += not ok
                print(f"{dname} N={n:5d} {v.label():40s} vs lib: y {cl['err_y']:.2e} mean {cl['err_mean']:.2e} "
                      f"rstd {cl['err_rstd']:.2e} ({cl['tol_ratio']:.2f}) | vs f64: y {cf['err_y']:.2e} "
                      f"({cf['tol_ratio']:.2f})  {'ok' if ok else 'FAIL'}")
    print(f"{'all ok' if not failures else f'{failures} FAILED'} in {time.perf_counter() - t0:.0f} s")
    return 1 if failures else 0


# ------------------------------------------------------------------------------------------- GPU sweep
ELEMS = 1 << 26  # M x N, as the tuning script and notebook 04
TIMING = {"warmup_ms": 5, "rep_ms": 20, "min_reps": 20}  # median of >= 20 runs, L2 flushed before each
V = Variant
# (dtype, N, library configs to time besides the table's, variants); in priority order: the time budget
# cuts the tail. N = 8192 (the furthest from target) and fp32 first, then bf16 N = 4096 (the other f32p shape).
# bf16 N = 8192: f32p next to plain reload at the same three geometries (r1 w16, the SASS study's worst at
# +7.5 instructions/element, gave its two places to reload r2 w8 / r1 w4), then ws (what f32p replaces).
LIB_1x8 = (K.Config(8192, 1, 8, programs_per_sm=1, prefetch=True),)  # the "170 registers" geometry, held params
PLAN = [
    ("fp32", 8192, LIB_1x8,
     [V(r, w, p, pf) for r, w in ((1, 8), (1, 16), (2, 16)) for p, pf in ((0, False), (-1, False), (-1, True))]
     + [V(r, w, p, onepass=True) for r, w in ((1, 8), (1, 16)) for p in (0, -1)]),
    ("bf16", 8192, LIB_1x8,
     [V(r, w, p) for r, w in ((1, 8), (2, 16)) for p in (0, -1)] + [V(2, 8), V(1, 4)]
     + [V(r, w, f32p=True) for r, w in ((1, 8), (2, 8), (1, 4))]
     + [V(r, w, -1, pf, ws=True) for r, w in ((1, 8), (2, 16)) for pf in (False, True)]
     + [V(1, 8, p, onepass=True, ws=True) for p in (0, -1)]),
    ("bf16", 4096, (), [V(2, 4), V(2, 4, -1, stages=3)] + [V(r, w, f32p=True) for r, w in ((1, 8), (2, 8), (1, 4))]
     + [V(2, 4, -1, stages=3, onepass=True)]),
    ("fp32", 4096, (), [V(1, 4), V(1, 4, -1, stages=4), V(1, 8), V(1, 8, -1, stages=3),
                        V(1, 4, -1, stages=4, onepass=True)]),
    ("fp32", 2048, (), [V(2, 4), V(2, 4, -1, stages=3), V(1, 4), V(1, 4, -1, stages=3),
                        V(2, 4, -1, stages=3, onepass=True)]),
    ("fp32", 1024, (), [V(1, 2), V(1, 2, -1, stages=3), V(2, 4), V(2, 4, -1, stages=3),
                        V(1, 2, -1, stages=3, onepass=True)]),
    ("bf16", 2048, (), [V(2, 2), V(2, 2, -1, stages=3), V(2, 2, -1, stages=3, onepass=True)]),
    ("bf16", 1024, (), [V(4, 2), V(4, 2, -1, stages=4), V(4, 2, -1, stages=4, onepass=True)]),
]


def _sync() -> None:
    if helpers.HAS_CUDA:
        torch.cuda.synchronize()


def resident_programs(handle, num_warps: int, props) -> tuple[int | None, int | None, int | None]:
    """(registers per thread, spills, programs one SM can hold) of a compiled kernel, from the register file
    (allocated per warp in 256s), the 64-warp limit and shared memory (1 KiB reserved per block)."""
    regs = getattr(handle, "n_regs", None)
    if not regs or props is None:
        return None, None, None
    spills = getattr(handle, "n_spills", None)
    shared = getattr(getattr(handle, "metadata", None), "shared", 0) or 0
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    warps_sm = getattr(props, "max_threads_per_multi_processor", 2048) // 32
    by_regs = (regs_sm // (-(-regs * 32 // 256) * 256)) // num_warps
    by_smem = smem_sm // (shared + 1024)
    return regs, spills, max(0, min(by_regs, warps_sm // num_warps, by_smem, 32))


def run_bench(budget_s: float, out_dir: str | None, only_n: list[int] | None, smoke: bool) -> int:
    """The sweep. ``smoke``: the same code path on tiny shapes (any device, the interpreter on a CPU), to test
    the script itself; its timings mean nothing."""
    if not smoke:
        helpers.require_cuda("the GPU sweep (use --check or --smoke on a CPU)")
    elems, copy_big = (1 << 14, 1 << 20) if smoke else (ELEMS, 1 << 30)
    props = torch.cuda.get_device_properties(0) if helpers.HAS_CUDA else None
    sms = props.multi_processor_count if props else K._sm_count(helpers.DEVICE)
    name = props.name if props else "cpu"
    print(f"{helpers.describe()}; {name}, {sms} SMs; torch {torch.__version__}, triton {triton.__version__}")
    copy_1g = bench.copy_bandwidth(copy_big)["gbps"]
    copy_same = {d: bench.copy_bandwidth(elems * t.itemsize)["gbps"] for d, t in DTYPES.items()}
    print(f"copy {copy_big >> 20} MiB: {copy_1g:,.0f} GB/s; copy of x: " +
          ", ".join(f"{d} {elems * DTYPES[d].itemsize >> 20} MiB {g:,.0f} GB/s" for d, g in copy_same.items()))
    records, skipped = [], []
    header = (f"{'dtype':5s} {'N':>5s}  {'config':40s} {'regs':>4s} {'spill':>5s} {'occ':>3s} {'grid':>5s} "
              f"{'ms':>7s} {'GB/s':>6s} {'%1GiB':>6s} {'%same':>6s} {'comp_s':>6s}  status")
    print(header)

    def save():
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "fused_explore.json"), "w") as f:
                json.dump({"provenance": results.provenance(), "device": name, "sms": sms, "smoke": smoke,
                           "elems": elems, "copy_1gib_gbps": copy_1g, "copy_same_gbps": copy_same,
                           "elapsed_s": time.perf_counter() - _T0, "records": records, "skipped": skipped}, f, indent=1)

    def emit(rec: dict) -> None:
        records.append(rec)
        fmt = lambda k, spec: format(rec[k], spec) if rec.get(k) is not None else "-"  # noqa: E731
        print(f"{rec['dtype']:5s} {rec['N']:5d}  {rec['config']:40s} {fmt('regs', '4d'):>4s} "
              f"{fmt('spills', '5d'):>5s} {fmt('occ', '3d'):>3s} {fmt('grid', '5d'):>5s} {fmt('ms', '7.4f'):>7s} "
              f"{fmt('gbps', '6.0f'):>6s} {fmt('pct_copy_1gib', '6.1f'):>6s} {fmt('pct_copy_same', '6.1f'):>6s} "
              f"{fmt('compile_s', '6.1f'):>6s}  {rec['status']}", flush=True)

    for dname, n, lib_alts, variants in PLAN:
        if only_n and n not in only_n:
            continue
        if time.perf_counter() - _T0 > budget_s:
            skipped += [f"{dname} N={n} (all)"]
            continue
        dtype, m = DTYPES[dname], elems // n
        x, b, w, lb = make_inputs(m, n, dtype, helpers.DEVICE)
        ws, f32 = make_workspace(b, w, lb), make_f32_params(b, w, lb)
        moved = chain.fused_forward_bytes(m, n, x.element_size())  # x + y + 8 B/row of stats + 3 parameter rows

        def record(config, ms, status, regs=None, spills=None, occ=None, grid=None, compile_s=None, **extra):
            rec = {"dtype": dname, "N": n, "M": m, "config": config, "regs": regs, "spills": spills, "occ": occ,
                   "grid": grid, "ms": ms, "gbps": moved / ms / 1e6 if ms else None,
                   "pct_copy_1gib": 100 * moved / ms / 1e6 / copy_1g if ms else None,
                   "pct_copy_same": 100 * moved / ms / 1e6 / copy_same[dname] if ms else None,
                   "compile_s": compile_s, "status": status, **extra}
            emit(rec)

        # the library: its table's launch (the baseline), then any other Config asked for
        table = K.forward_config(n, dtype)
        ref = K.forward(x, b, w, lb, EPS)
        for cfg in (table, *lib_alts):
            t = time.perf_counter()
            try:
                got, handle, grid = lib_launch(x, b, w, lb, cfg)
                _sync()
            except Exception as e:  # noqa: BLE001  (out of resources, ...)
                record(f"lib {cfg.rows}x{cfg.num_warps} pps{cfg.programs_per_sm}", None, f"error: {e!s:.80}")
                continue
            compile_s = time.perf_counter() - t
            regs, spills, occ = resident_programs(handle, cfg.num_warps, props)
            if cfg == table:  # the mirror launch must reproduce K.forward bit for bit
                same = {"ok": all(torch.equal(g, r) for g, r in zip(got, ref)), "tol_ratio": float("nan")}
            else:
                same = compare(got, ref, Y_TOL["lib"][dtype])
            label = (f"lib{' TABLE' if cfg == table else ''} r{cfg.rows} w{cfg.num_warps} pps{cfg.programs_per_sm}"
                     f"{' pf' if cfg.prefetches(m, x.device) else ''}{f' st{cfg.stages}' if cfg.stages > 1 else ''}")
            ms = bench.time_fn(lambda: K.forward(x, b, w, lb, EPS, config=cfg), **TIMING).ms
            record(label, ms, "ok" if same["ok"] else f"MISMATCH vs forward {same['tol_ratio']:.1f}",
                   regs, spills, occ, grid, compile_s)
        # the new variants: compile (first launch, with k = 1 when persistent), find k, verify, time
        for v in variants:
            if time.perf_counter() - _T0 > budget_s:
                skipped.append(f"{dname} N={n} {v.label()}")
                continue
            t = time.perf_counter()
            try:
                _, handle, _ = launch(v, x, b, w, lb, ws, f32, programs_per_sm=1, sm_count=sms)
                _sync()
                compile_s = time.perf_counter() - t
                regs, spills, occ = resident_programs(handle, v.num_warps, props)
                k = (occ or 1) if v.persist < 0 else max(v.persist, 1)
                got, _, grid = launch(v, x, b, w, lb, ws, f32, programs_per_sm=k, sm_count=sms)
                check = compare(got, ref, Y_TOL["lib"][dtype])
            except Exception as e:  # noqa: BLE001
                record(v.label(), None, f"error: {e!s:.80}")
                continue
            label = v.label().replace("k=occ", f"k=occ({k})")
            if not check["ok"]:
                record(label, None, f"MISMATCH vs lib: y {check['err_y']:.1e} (ratio {check['tol_ratio']:.1f}), "
                                    "not timed", regs, spills, occ, grid, compile_s)
                continue
            ms = bench.time_fn(lambda: launch(v, x, b, w, lb, ws, f32, programs_per_sm=k, sm_count=sms), **TIMING).ms
            record(label, ms, "ok", regs, spills, occ, grid, compile_s, err_y=check["err_y"])
        if any(v.ws for v in variants):  # what the workspace costs when it is rebuilt every call
            ms = bench.time_fn(lambda: make_workspace(b, w, lb), **TIMING).ms
            emit({"dtype": dname, "N": n, "M": m, "config": "(fp32 workspace build alone)", "ms": ms, "status": "info"})
        if any(v.f32p for v in variants):  # and the three fp32 vectors
            ms = bench.time_fn(lambda: make_f32_params(b, w, lb), **TIMING).ms
            emit({"dtype": dname, "N": n, "M": m, "config": "(fp32 vectors build alone)", "ms": ms, "status": "info"})
        del x, b, w, lb, ws, f32, ref
        if helpers.HAS_CUDA:
            torch.cuda.empty_cache()
        save()

    # per shape: the library's table launch against the fastest new variant
    print("summary (% of the 1 GiB copy): library table -> best new variant")
    for dname, n, *_ in PLAN:
        shape = [r for r in records if r["dtype"] == dname and r["N"] == n and r.get("ms") and r["status"] == "ok"]
        table_rec = next((r for r in shape if r["config"].startswith("lib TABLE")), None)
        new = [r for r in shape if not r["config"].startswith("lib")]
        if table_rec and new:
            best = min(new, key=lambda r: r["ms"])
            print(f"  {dname} N={n:5d}: {table_rec['pct_copy_1gib']:5.1f}% -> {best['pct_copy_1gib']:5.1f}% "
                  f"({table_rec['ms'] / best['ms'] - 1:+.1%}) {best['config']}")
    elapsed = time.perf_counter() - _T0
    if skipped:
        print(f"skipped for the {budget_s:.0f} s budget: " + "; ".join(skipped))
    print(f"done in {elapsed:.0f} s (from start of script)")
    save()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="correctness on small shapes (CPU interpreter works)")
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="stop starting new configurations after this many seconds (default 150)")
    parser.add_argument("--ns", type=int, nargs="+", help="only these N (default: the whole plan)")
    parser.add_argument("--smoke", action="store_true", help="the sweep's code path on tiny shapes (tests the script)")
    args = parser.parse_args()
    if args.check:
        return run_check()
    return run_bench(args.budget_s, os.environ.get("OUT"), args.ns, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
