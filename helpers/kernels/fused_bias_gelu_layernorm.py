"""``LayerNorm(GELU(x + bias))`` fused into one Triton kernel, forward and backward.

Forward: one read of ``x`` and one write of ``y`` (plus 8 bytes per row of statistics, kept for the
backward). Every program loads ``ROWS`` rows into registers, adds the bias, applies GELU, computes
the row mean and variance in fp32 (two-pass, on the values in registers), normalises, applies the
optional affine weight and bias, and stores in the input's dtype. Rows wider than one block are
walked in chunks: a first pass merges per-chunk statistics (Chan's formula), a second pass recomputes
GELU and writes.

Backward: one read of ``x`` and ``dy``, one write of ``dx``. GELU and the normalised values are
recomputed from ``x`` and the saved mean/rstd. The gradients of the three length-N parameters are
column sums over all rows: each program accumulates its rows' share in registers and writes one row
of partial sums; a second small kernel adds the partial rows in a fixed order (deterministic).

GELU (``gelu=``) is one of the forms of :mod:`helpers.kernels.gelu`: ``"auto"`` (the default) the exact form
with the fewest instructions for the storage dtype, ``"erf"`` the library ``erf``, ``"erf_fast"``, ``"erf_exp2"``,
``"erf_fp32"``, ``"tanh"`` (PyTorch's ``approximate="tanh"``) or ``"none"`` (ablations). Launch shapes: the measured
tables below where they have the row's width and dtype, else the rule of :mod:`helpers.kernels.rowwise`.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernels below)
from . import check_triton_device
from .gelu import AUTO_GELU, FAST_ASM, gelu, gelu_and_grad
from .gelu import gelu_mode as _gelu_mode
from .gelu import FAST_GELU_ABS, FAST_GELU_REL, FP32_GELU_ABS, GELU_MODES  # noqa: F401  (read here elsewhere)
from .rowwise import MAX_BLOCK_BWD, MAX_BLOCK_FWD, Config, backward_rule, check_stats, forward_rule, sum_partials
from .rowwise import table_config, tile_mask

DTYPES = tuple(AUTO_GELU)
MAX_N = 1 << 20  # widest row accepted (the chunked path handles any width; this bounds the partial sums' memory)


# -------------------------------------------------------------------------------------- forward
@triton.jit
def _forward_kernel(X, B, W, LB, Y, MEAN, RSTD, M, N, eps,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, GELU: tl.constexpr,
                    LAYERNORM: tl.constexpr, HAS_W: tl.constexpr, HAS_LB: tl.constexpr, EVEN_N: tl.constexpr,
                    FAST: tl.constexpr, PREFETCH: tl.constexpr, STAGES: tl.constexpr):
    """Program p handles row blocks p, p + P, p + 2P, ... (P programs in the grid); with PREFETCH each
    program loads its next row block while it computes the current one."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_blocks = tl.cdiv(M, ROWS)
    cols = tl.arange(0, BLOCK_N)
    if SINGLE:  # the whole row sits in registers: one read, one write
        col_ok = cols < N
        # the parameters are loaded once per program, converted once, and kept in registers
        b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_W:
            w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_LB:
            lb = tl.load(LB + cols, mask=col_ok, other=0.0).to(tl.float32)
        if PREFETCH:  # the next row block is loaded while this one is computed (more bytes in flight)
            rows = pid * ROWS + tl.arange(0, ROWS)
            x_next = tl.load(X + rows.to(tl.int64)[:, None] * N + cols[None, :],
                             mask=tile_mask(rows, cols, M, N, EVEN_N), other=0.0)
        for blk in tl.range(pid, n_blocks, n_prog, num_stages=STAGES):
            rows = blk * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = tile_mask(rows, cols, M, N, EVEN_N)
            if PREFETCH:
                x = x_next.to(tl.float32)
                nxt = rows + n_prog * ROWS
                x_next = tl.load(X + nxt.to(tl.int64)[:, None] * N + cols[None, :],
                                 mask=tile_mask(nxt, cols, M, N, EVEN_N), other=0.0)
            else:
                x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            y = gelu(x + b[None, :], GELU, FAST)  # 0 in masked lanes: GELU(0) = 0
            if LAYERNORM:
                mean = tl.sum(y, axis=1) / N
                d = y - mean[:, None]
                if not EVEN_N:
                    d = tl.where(col_ok[None, :], d, 0.0)
                rstd = tl.rsqrt(tl.sum(d * d, axis=1) / N + eps)
                if HAS_W:
                    y = d * (rstd[:, None] * w[None, :])
                else:
                    y = d * rstd[:, None]
                if HAS_LB:
                    y = y + lb[None, :]
                tl.store(MEAN + rows, mean, mask=row_ok)
                tl.store(RSTD + rows, rstd, mask=row_ok)
            tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
    else:  # a row wider than one block: statistics chunk by chunk, then normalise chunk by chunk
        for blk in range(pid, n_blocks, n_prog):
            rows = blk * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            row_off = rows.to(tl.int64)[:, None] * N
            mean = tl.zeros([ROWS], dtype=tl.float32)
            rstd = tl.full([ROWS], 1.0, tl.float32)
            if LAYERNORM:
                m2 = tl.zeros([ROWS], dtype=tl.float32)
                count = 0.0
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    mask = row_ok[:, None] & (c < N)[None, :]
                    x = tl.load(X + row_off + c[None, :], mask=mask, other=0.0).to(tl.float32)
                    b = tl.load(B + c, mask=c < N, other=0.0).to(tl.float32)
                    g = gelu(x + b[None, :], GELU, FAST)
                    n_c = tl.minimum(N - start, BLOCK_N).to(tl.float32)
                    c_mean = tl.sum(g, axis=1) / n_c
                    d = tl.where(mask, g - c_mean[:, None], 0.0)
                    total = count + n_c
                    delta = c_mean - mean
                    mean = mean + delta * (n_c / total)
                    m2 = m2 + tl.sum(d * d, axis=1) + delta * delta * (count * n_c / total)
                    count = total
                rstd = tl.rsqrt(m2 / N + eps)
                tl.store(MEAN + rows, mean, mask=row_ok)
                tl.store(RSTD + rows, rstd, mask=row_ok)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = tl.load(X + row_off + c[None, :], mask=mask, other=0.0).to(tl.float32)
                b = tl.load(B + c, mask=c_ok, other=0.0).to(tl.float32)
                y = gelu(x + b[None, :], GELU, FAST)
                if LAYERNORM:
                    y = (y - mean[:, None]) * rstd[:, None]
                    if HAS_W:
                        y = y * tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
                    if HAS_LB:
                        y = y + tl.load(LB + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(Y + row_off + c[None, :], y.to(Y.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------- backward
@triton.jit
def _backward_kernel(X, B, W, DY, MEAN, RSTD, DX, PART, M, N,
                     BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, GELU: tl.constexpr,
                     HAS_W: tl.constexpr, EVEN_N: tl.constexpr, FAST: tl.constexpr, PREFETCH: tl.constexpr):
    """Program p walks row blocks p, p + P, ... (prefetching as the forward does); PART[k, p, :] gets its
    partial column sums of k = 0: d(bias) = dv, 1: d(weight) = dy * xhat, 2: d(ln_bias) = dy."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_blocks = tl.cdiv(M, ROWS)
    cols = tl.arange(0, BLOCK_N)
    part_b = PART + pid * N
    part_w = PART + (n_prog + pid) * N
    part_lb = PART + (2 * n_prog + pid) * N
    if SINGLE:
        col_ok = cols < N
        b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_W:
            w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        # column sums, reduced over each row block as it goes (registers: three fp32 values per column)
        acc_b = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_w = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_lb = tl.zeros([BLOCK_N], dtype=tl.float32)
        if PREFETCH:
            rows = pid * ROWS + tl.arange(0, ROWS)
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = tile_mask(rows, cols, M, N, EVEN_N)
            x_next = tl.load(X + offs, mask=mask, other=0.0)
            dy_next = tl.load(DY + offs, mask=mask, other=0.0)
        for blk in range(pid, n_blocks, n_prog):
            rows = blk * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            mask = tile_mask(rows, cols, M, N, EVEN_N)
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            if PREFETCH:
                x = x_next.to(tl.float32)
                dy = dy_next.to(tl.float32)
                nxt = rows + n_prog * ROWS
                n_offs = nxt.to(tl.int64)[:, None] * N + cols[None, :]
                n_mask = tile_mask(nxt, cols, M, N, EVEN_N)
                x_next = tl.load(X + n_offs, mask=n_mask, other=0.0)
                dy_next = tl.load(DY + n_offs, mask=n_mask, other=0.0)
            else:
                x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
            mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
            rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)  # 0 for rows past M: they add nothing
            g, dg = gelu_and_grad(x + b[None, :], GELU, FAST)
            xhat = (g - mean[:, None]) * rstd[:, None]
            acc_lb += tl.sum(dy, axis=0)
            acc_w += tl.sum(dy * xhat, axis=0)  # dy is 0 in masked lanes
            if HAS_W:
                dy = dy * w[None, :]
            c1 = tl.sum(dy * xhat, axis=1) / N
            c2 = tl.sum(dy, axis=1) / N
            dv = (dy - c2[:, None] - xhat * c1[:, None]) * (rstd[:, None] * dg)
            if not EVEN_N:
                dv = tl.where(col_ok[None, :], dv, 0.0)
            tl.store(DX + offs, dv.to(DX.dtype.element_ty), mask=mask)
            acc_b += tl.sum(dv, axis=0)
        tl.store(part_b + cols, acc_b, mask=col_ok)
        tl.store(part_w + cols, acc_w, mask=col_ok)
        tl.store(part_lb + cols, acc_lb, mask=col_ok)
    else:  # wide rows: pass 1 gets the two row sums, pass 2 writes dx and adds into this program's partial row
        for blk in range(pid, n_blocks, n_prog):
            rows = blk * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            row_off = rows.to(tl.int64)[:, None] * N
            mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
            rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            s1 = tl.zeros([ROWS], dtype=tl.float32)
            s2 = tl.zeros([ROWS], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = tl.load(X + row_off + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + row_off + c[None, :], mask=mask, other=0.0).to(tl.float32)
                b = tl.load(B + c, mask=c_ok, other=0.0).to(tl.float32)
                g = gelu(x + b[None, :], GELU, FAST)
                xhat = tl.where(mask, (g - mean[:, None]) * rstd[:, None], 0.0)
                if HAS_W:
                    dy = dy * tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
                s1 += tl.sum(dy * xhat, axis=1)
                s2 += tl.sum(dy, axis=1)
            c1 = s1 / N
            c2 = s2 / N
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = tl.load(X + row_off + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + row_off + c[None, :], mask=mask, other=0.0).to(tl.float32)
                b = tl.load(B + c, mask=c_ok, other=0.0).to(tl.float32)
                g, dg = gelu_and_grad(x + b[None, :], GELU, FAST)
                xhat = tl.where(mask, (g - mean[:, None]) * rstd[:, None], 0.0)
                tl.store(part_lb + c, tl.load(part_lb + c, mask=c_ok) + tl.sum(dy, axis=0), mask=c_ok)
                tl.store(part_w + c, tl.load(part_w + c, mask=c_ok) + tl.sum(dy * xhat, axis=0), mask=c_ok)
                if HAS_W:
                    dy = dy * tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
                dv = (dy - c2[:, None] - xhat * c1[:, None]) * rstd[:, None] * dg
                dv = tl.where(mask, dv, 0.0)
                tl.store(DX + row_off + c[None, :], dv.to(DX.dtype.element_ty), mask=mask)
                tl.store(part_b + c, tl.load(part_b + c, mask=c_ok) + tl.sum(dv, axis=0), mask=c_ok)


# ------------------------------------------------------------------------------ launch settings
# Tuned on an H200 by scripts/fused_bias_gelu_layernorm_tune.py (M x N = 64M elements; the forward's 16-bit
# entries for N >= 2048 with erf_exp2, its 32-bit entries with erf_fp32 and bf16 N = 8192 with the degree-5 erf_exp2,
# those two after a read-only L2 flush; rerun it for another GPU), except the forward's 16-bit entries at 1024, 2048
# and 4096: re-tuned on the reference H100 with --graph (calls back to back in a CUDA graph, as in a model), where the
# H200's entries reached 82-84% of copy and these 92-93%: (bits per element, block) ->
# (rows per block, warps, programs per SM, prefetch[, pipeline stages])
_FORWARD_TABLE = {(16, 1024): (1, 2, 256, False, 3), (16, 2048): (2, 4, 2, False, 4), (16, 4096): (2, 8, 8, True),
                  (16, 8192): (2, 16, 1, True),
                  (32, 1024): (1, 2, 4, False, 4), (32, 2048): (2, 4, 2, False, 3), (32, 4096): (1, 16, 4, True),
                  (32, 8192): (1, 16, 1, False, 4)}
_BACKWARD_TABLE = {(16, 1024): (4, 4, 2), (16, 2048): (2, 4, 2), (16, 4096): (2, 16, 1), (16, 8192): (1, 16, 1, False),
                   (32, 1024): (4, 4, 2), (32, 2048): (1, 8, 2), (32, 4096): (1, 16, 1), (32, 8192): (1, 16, 1, False)}


@functools.lru_cache(maxsize=None)
def forward_config(n: int, dtype: torch.dtype) -> Config:
    """The forward's launch shape: the measured table's where it has the row's block (the row width rounded up to a
    power of two, at most ``MAX_BLOCK_FWD``), else the row-wise rule (:func:`~helpers.kernels.rowwise.forward_rule`:
    ~16 elements per thread; a few programs per SM, each looping over row blocks)."""
    return table_config(_FORWARD_TABLE, min(triton.next_power_of_2(n), MAX_BLOCK_FWD), dtype, forward_rule)


@functools.lru_cache(maxsize=None)
def backward_config(n: int, dtype: torch.dtype) -> Config:
    """The backward's launch shape (see :func:`forward_config`; blocks of at most ``MAX_BLOCK_BWD``)."""
    return table_config(_BACKWARD_TABLE, min(triton.next_power_of_2(n), MAX_BLOCK_BWD), dtype, backward_rule)


# -------------------------------------------------------------------------------- input checks
def _check(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None, ln_bias: torch.Tensor | None) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., N); got a 0-d tensor")
    if x.dtype not in DTYPES:
        raise TypeError(f"x must be one of {[str(d) for d in DTYPES]}, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous (got strides {x.stride()} for shape {tuple(x.shape)}); "
                         "call .contiguous() first")
    n = x.shape[-1]
    if n > MAX_N:
        raise ValueError(f"N = {n} is beyond what this kernel supports (N <= {MAX_N})")
    check_triton_device(x.device, "x")
    for name, t in (("bias", bias), ("weight", weight), ("ln_bias", ln_bias)):
        if t is None:
            if name == "bias":
                raise TypeError("bias must be a tensor of shape (N,), got None")
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.dim() != 1 or t.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},) to match x's last dimension, got {tuple(t.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; they must match")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; they must be on one device")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    return n


# ------------------------------------------------------------------------------ host functions
def forward(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None = None,
            ln_bias: torch.Tensor | None = None, eps: float = 1e-5, gelu: str = "auto",
            layernorm: bool = True, config: Config | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``y = LayerNorm(GELU(x + bias)) * weight + ln_bias`` over the last dimension, with the row
    statistics: returns ``(y, mean, rstd)``, ``mean``/``rstd`` fp32 of shape ``x.shape[:-1]``.

    ``layernorm=False`` stops after GELU (ablations) and returns ``(y, None, None)``.
    ``config`` overrides :func:`forward_config`.
    """
    n = _check(x, bias, weight, ln_bias)
    mode = _gelu_mode(gelu, x.dtype)
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    y = torch.empty_like(x)
    mean, rstd = torch.empty((2, *x.shape[:-1]), dtype=torch.float32, device=x.device)  # one allocation
    stats = (mean, rstd) if layernorm else (None, None)
    if x.numel() == 0:
        return y, *stats
    m = x.numel() // n
    cfg = config or forward_config(n, x.dtype)
    programs = cfg.programs(m, x.device)
    _forward_kernel[(programs,)](
        x, bias, weight if weight is not None else x, ln_bias if ln_bias is not None else x, y, mean, rstd,
        m, n, eps, BLOCK_N=cfg.block_n, ROWS=cfg.rows, SINGLE=cfg.block_n >= n, GELU=mode, LAYERNORM=layernorm,
        HAS_W=weight is not None, HAS_LB=ln_bias is not None, EVEN_N=cfg.block_n == n, FAST=FAST_ASM,
        PREFETCH=cfg.prefetches(m, x.device), STAGES=cfg.stages, num_warps=cfg.num_warps)
    return y, *stats


def backward(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None,
             mean: torch.Tensor, rstd: torch.Tensor, gelu: str = "auto", config: Config | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`forward` given ``dy``: ``(dx, dbias, dweight, dln_bias)``; the last two
    are computed whether or not the forward had ``weight``/``ln_bias`` (dtype of ``x``)."""
    n = _check(x, bias, weight, None)
    mode = _gelu_mode(gelu, x.dtype)
    if dy.shape != x.shape or dy.dtype != x.dtype or dy.device != x.device:
        raise ValueError(f"dy must match x (shape {tuple(x.shape)}, {x.dtype}, {x.device}); got "
                         f"{tuple(dy.shape)}, {dy.dtype}, {dy.device}")
    check_stats(x, mean=mean, rstd=rstd)
    return _backward(dy, x, bias, weight, mean, rstd, n, mode, config)


def _backward(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None,
              mean: torch.Tensor, rstd: torch.Tensor, n: int, mode: int, config: Config | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`backward` without its checks: for the autograd Function, whose tensors the forward checked."""
    dy = dy.contiguous()
    dx = torch.empty_like(x)
    if x.numel() == 0:
        return dx, *(torch.zeros(n, dtype=x.dtype, device=x.device) for _ in range(3))
    grads = torch.empty(3, n, dtype=x.dtype, device=x.device)  # every column is written
    m = x.numel() // n
    cfg = config or backward_config(n, x.dtype)
    programs = cfg.programs(m, x.device)
    single = cfg.block_n >= n  # one block a row: each program writes its whole partial rows; else it adds into them
    part = (torch.empty if single else torch.zeros)(3, programs, n, dtype=torch.float32, device=x.device)
    _backward_kernel[(programs,)](
        x, bias, weight if weight is not None else x, dy, mean, rstd, dx, part, m, n,
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, SINGLE=single, GELU=mode, HAS_W=weight is not None,
        EVEN_N=cfg.block_n == n, FAST=FAST_ASM, PREFETCH=cfg.prefetches(m, x.device), num_warps=cfg.num_warps)
    sum_partials(part, grads, programs, n)
    return dx, *grads.unbind(0)


class FusedBiasGeluLayerNormFunction(torch.autograd.Function):
    """autograd wrapper: forward and backward through the fused kernels."""

    @staticmethod
    def forward(ctx, x, bias, weight, ln_bias, eps, gelu):
        y, mean, rstd = forward(x, bias, weight, ln_bias, eps, gelu)
        ctx.save_for_backward(x, bias, weight, mean, rstd)
        ctx.mode = _gelu_mode(gelu, x.dtype)
        ctx.has = (weight is not None, ln_bias is not None)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, bias, weight, mean, rstd = ctx.saved_tensors  # checked by the forward; dy has the output's shape
        dx, dbias, dweight, dln_bias = _backward(dy, x, bias, weight, mean, rstd, x.shape[-1], ctx.mode, None)
        return dx, dbias, dweight if ctx.has[0] else None, dln_bias if ctx.has[1] else None, None, None


_APPROXIMATE = {"none": "auto", "tanh": "tanh"}


def fused_bias_gelu_layernorm(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None = None,
                              ln_bias: torch.Tensor | None = None, eps: float = 1e-5,
                              approximate: str = "none") -> torch.Tensor:
    """``F.layer_norm(F.gelu(x + bias, approximate=approximate), (N,), weight, ln_bias, eps)``,
    differentiable, in one pass. ``approximate="none"`` is exact GELU (for 16-bit inputs through
    the fast erf, whose error is below the storage rounding)."""
    if approximate not in _APPROXIMATE:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return FusedBiasGeluLayerNormFunction.apply(x, bias, weight, ln_bias, eps, _APPROXIMATE[approximate])


class FusedBiasGeluLayerNorm(torch.nn.Module):
    """Drop-in for ``LayerNorm(GELU(x + bias))`` with a learnable pre-GELU ``bias`` and the
    LayerNorm's ``weight`` and ``ln_bias`` (``elementwise_affine=False`` drops the last two)."""

    def __init__(self, n: int, eps: float = 1e-5, elementwise_affine: bool = True, approximate: str = "none",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if approximate not in _APPROXIMATE:
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        kw = {"device": device, "dtype": dtype}
        self.n, self.eps, self.approximate = n, eps, approximate
        self.bias = torch.nn.Parameter(torch.zeros(n, **kw))
        self.weight = torch.nn.Parameter(torch.ones(n, **kw)) if elementwise_affine else None
        self.ln_bias = torch.nn.Parameter(torch.zeros(n, **kw)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_bias_gelu_layernorm(x, self.bias, self.weight, self.ln_bias, self.eps, self.approximate)

    def extra_repr(self) -> str:
        return f"{self.n}, eps={self.eps}, affine={self.weight is not None}, approximate={self.approximate!r}"
