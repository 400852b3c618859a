"""RMSNorm as Llama defines it, forward and backward, each one fused Triton kernel.

``y = weight * (x * rsqrt(mean(x**2) + eps)).to(x.dtype)`` over the last dimension, with the
statistics in fp32: the semantics of ``transformers``' ``LlamaRMSNorm``, rounding for rounding. The normalised row is
rounded to the input's dtype *before* the weight is applied, and the result's dtype is
``torch.promote_types(x.dtype, weight.dtype)``: bf16 activations with a bf16 weight give bf16; with
the fp32 weight of a QLoRA model (norms kept in fp32) they give fp32, unless ``out_dtype`` asks for x's dtype (what
Liger-Kernel's RMSNorm writes: a third fewer bytes, the same numbers as the fp32 result rounded).

Forward: one read of ``x`` and one write of ``y`` per element (4 bytes for bf16 in and out, 6 for bf16
in and fp32 out), plus the fp32 ``rstd`` of each row (4 bytes per row), kept for the backward. The
weight is read once per program and stays in registers. Rows wider than one block are walked twice:
a first pass sums the squares chunk by chunk, a second normalises and writes (the second read of a
row mostly hits L2).

Backward: one read of ``x`` and ``dy`` and one write of ``dx`` per element (6 bytes in bf16, 8 with the
fp32 ``dy`` of an fp32 weight), plus ``rstd``. The normalised row is recomputed from ``x`` and the saved
``rstd``, never stored::

    h = x * rstd,   g = dy * weight,   dx = rstd * (g - h * mean(g * h))

(the cast of ``h`` to the input dtype passes the gradient through, as autograd does; ``g`` stays in fp32
where autograd rounds it to the input dtype: one rounding fewer).
Rows wider than one block take two passes, ``mean(g * h)`` then ``dx``, reading ``x`` and ``dy`` twice.
``d(weight)`` is the column sum of ``dy * h.to(x.dtype)`` over all rows: each program accumulates its
rows' share in registers and writes one row of fp32 partial sums, and the row-wise kernels' second small
kernel (:func:`~helpers.kernels.rowwise.sum_partials`) adds the partial rows in a fixed order
(deterministic). A weight that needs no gradient (a frozen QLoRA norm) skips both.

Launch shapes (:class:`~helpers.kernels.rowwise.Config`, the row-wise kernels'): RMSNorm's own table for 16-bit
rows of Llama's widths (whole rows in blocks of 4096 or 8192; tuned by ``scripts/rms_norm_tune.py`` on an H100,
whose timings are in ``results/<gpu>/rms_norm_tune.json``); 16-bit blocks of 1024 and 2048 and fp32
blocks of 1024 to 8192 take the fused bias + GELU + LayerNorm kernel's entries (copied into RMSNorm's tables: that
kernel moves the same bytes per element and reduces rows the same way); other widths the row-wise rule. The
forward's whole-row loop can be software-pipelined (``Config.stages``; on Hopper the next row blocks' loads become
asynchronous copies into shared memory). ``config=`` overrides them for sweeps on the GPU.

In the Triton interpreter (no GPU) fp32 -> bf16 conversions truncate instead of rounding to nearest,
so bf16 results there can be one bf16 step off from a GPU's; fp16 and fp32 are rounded as on a GPU.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (imported first: sets TRITON_INTERPRET before the kernels are defined)
from . import check_triton_device
from .rowwise import MAX_BLOCK_BWD, MAX_BLOCK_FWD, Config, backward_rule, check_stats, forward_rule, sum_partials
from .rowwise import cdiv, next_power_of_2, sm_count, table_config, tile_mask

__all__ = ["Config", "FusedRMSNorm", "MAX_N", "RMSNormFunction", "add_rms_norm", "backward", "backward_config",
           "forward", "forward_config", "rms_norm"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_N = 1 << 16  # widest row accepted (the chunked path handles any width; this bounds the partial sums' memory)


# ---------------------------------------------------------------------------------------- kernels
@triton.jit
def _like_input(v, X):
    """fp32 ``v`` rounded to the element type of the pointer ``X`` and back to fp32
    (``LlamaRMSNorm``'s ``.to(input_dtype)`` before the weight)."""
    return v.to(X.dtype.element_ty).to(tl.float32)


@triton.jit
def _rms_norm_fwd_kernel(X, R, S, W, Y, RSTD, M, N, stride_x, stride_r, eps,
                         BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, EVEN_N: tl.constexpr,
                         HAS_RES: tl.constexpr, STAGES: tl.constexpr):
    """Program p normalises row blocks p, p + P, p + 2P, ... (P programs); rows of X are ``stride_x``
    apart, rows of Y are contiguous. HAS_RES: the rows normalised are X + R (rounded to X's dtype, as a
    tensor addition rounds), also written to S (rows ``stride_r`` apart in R, contiguous in S). STAGES > 1:
    Triton software-pipelines the whole-row loop (the next blocks' loads in flight as asynchronous copies)."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_blocks = tl.cdiv(M, ROWS)
    cols = tl.arange(0, BLOCK_N)
    if SINGLE:  # the whole row sits in registers: one read, one write
        w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
        for blk in tl.range(pid, n_blocks, n_prog, num_stages=STAGES):
            rows = blk * ROWS + tl.arange(0, ROWS)
            mask = tile_mask(rows, cols, M, N, EVEN_N)
            rows64 = rows.to(tl.int64)[:, None]
            x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_RES:
                x = _like_input(x + tl.load(R + rows64 * stride_r + cols[None, :], mask=mask, other=0.0), X)
                tl.store(S + rows64 * N + cols[None, :], x.to(S.dtype.element_ty), mask=mask)
            rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
            y = w[None, :] * _like_input(x * rstd[:, None], X)
            tl.store(RSTD + rows, rstd, mask=rows < M)
            tl.store(Y + rows64 * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:  # a row wider than one block: sum of squares chunk by chunk, then normalise chunk by chunk
        for blk in range(pid, n_blocks, n_prog):
            rows = blk * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            x_row = X + rows.to(tl.int64)[:, None] * stride_x
            r_row = R + rows.to(tl.int64)[:, None] * stride_r
            s_row = S + rows.to(tl.int64)[:, None] * N
            y_row = Y + rows.to(tl.int64)[:, None] * N
            acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c < N)[None, :]
                x = tl.load(x_row + c[None, :], mask=mask, other=0.0).to(tl.float32)
                if HAS_RES:
                    x = _like_input(x + tl.load(r_row + c[None, :], mask=mask, other=0.0), X)
                    tl.store(s_row + c[None, :], x.to(S.dtype.element_ty), mask=mask)
                acc += x * x
            rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
            tl.store(RSTD + rows, rstd, mask=row_ok)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                c_ok = c < N
                mask = row_ok[:, None] & c_ok[None, :]
                x = tl.load(x_row + c[None, :], mask=mask, other=0.0).to(tl.float32)
                if HAS_RES:  # the same sum again (this pass never reads S: no ordering to rely on)
                    x = _like_input(x + tl.load(r_row + c[None, :], mask=mask, other=0.0), X)
                w = tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)
                y = w[None, :] * _like_input(x * rstd[:, None], X)
                tl.store(y_row + c[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_chunk(x_row, dy_row, W, start, cols, row_ok, N):
    """One chunk of columns of a row block in the chunked backward: its columns, masks, x, dy and w (fp32)."""
    c = start + cols
    c_ok = c < N
    mask = row_ok[:, None] & c_ok[None, :]
    x = tl.load(x_row + c[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_row + c[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)
    return c, c_ok, mask, x, dy, w


@triton.jit
def _rms_norm_bwd_kernel(X, W, DY, RSTD, DX, PART, M, N, stride_x,
                         BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, EVEN_N: tl.constexpr,
                         HAS_DW: tl.constexpr):
    """Program p walks row blocks p, p + P, ...: writes their dx and, with HAS_DW, its partial column
    sums of d(weight) = dy * h.to(x.dtype) into PART[p, :]. DY and DX are contiguous."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_blocks = tl.cdiv(M, ROWS)
    cols = tl.arange(0, BLOCK_N)
    part = PART + pid.to(tl.int64) * N
    if SINGLE:
        w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for blk in range(pid, n_blocks, n_prog):
            rows = blk * ROWS + tl.arange(0, ROWS)
            mask = tile_mask(rows, cols, M, N, EVEN_N)
            rows64 = rows.to(tl.int64)[:, None]
            x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows64 * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + rows, mask=rows < M, other=0.0)
            h = x * rstd[:, None]
            if HAS_DW:
                acc += dy * _like_input(h, X)  # dy is 0 in masked lanes
            g = dy * w[None, :]
            c1 = tl.sum(g * h, axis=1) / N
            dx = (g - h * c1[:, None]) * rstd[:, None]
            tl.store(DX + rows64 * N + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_DW:
            tl.store(part + cols, tl.sum(acc, axis=0), mask=cols < N)
    else:  # chunked: mean(g * h) in a first pass, dx and d(weight) in a second
        for blk in range(pid, n_blocks, n_prog):
            rows = blk * ROWS + tl.arange(0, ROWS)
            row_ok = rows < M
            x_row = X + rows.to(tl.int64)[:, None] * stride_x
            dy_row = DY + rows.to(tl.int64)[:, None] * N
            dx_row = DX + rows.to(tl.int64)[:, None] * N
            rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            s = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c, c_ok, mask, x, dy, w = _bwd_chunk(x_row, dy_row, W, start, cols, row_ok, N)
                s += dy * w[None, :] * x
            c1 = tl.sum(s, axis=1) * rstd / N  # mean(g * h), h = x * rstd
            for start in range(0, N, BLOCK_N):
                c, c_ok, mask, x, dy, w = _bwd_chunk(x_row, dy_row, W, start, cols, row_ok, N)
                h = x * rstd[:, None]
                if HAS_DW:  # this program's own row of PART: no other program touches it
                    dw = tl.sum(dy * _like_input(h, X), axis=0)
                    tl.store(part + c, tl.load(part + c, mask=c_ok) + dw, mask=c_ok)
                dx = (dy * w[None, :] - h * c1[:, None]) * rstd[:, None]
                tl.store(dx_row + c[None, :], dx.to(DX.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------- launch shapes
# (bits of x, block) -> (rows, num_warps, programs_per_sm, prefetch (RMSNorm's kernels have none)[, forward pipeline
# stages]). The forward streams: one row a program, a program for every row (256 programs an SM caps the grid above
# any Llama batch): on an H100 this beat a few rows a program looping over row blocks at M = 4,096 (by 6%) and
# matched it at 32,768. The backward keeps one program an SM, each adding its rows' d(weight) in registers: fewer
# partial rows to sum. The 16-bit entries at 4096 and 8192 are RMSNorm's own (scripts/rms_norm_tune.py); the others
# are the fused bias + GELU + LayerNorm kernel's H200 entries (fused_bias_gelu_layernorm._FORWARD_TABLE,
# _BACKWARD_TABLE), without its pipelining: not measured for RMSNorm.
_FORWARD_TABLE = {(16, 4096): (1, 8, 256, False, 1), (16, 8192): (1, 4, 256, False, 3),
                  (16, 1024): (4, 2, 4, False), (16, 2048): (2, 2, 4, False), (32, 1024): (1, 2, 4, False),
                  (32, 2048): (2, 4, 2, False), (32, 4096): (1, 16, 4, False), (32, 8192): (1, 16, 1, False)}
_BACKWARD_TABLE = {(16, 4096): (4, 16, 1, False), (16, 8192): (2, 16, 1, False),
                   (16, 1024): (4, 4, 2, False), (16, 2048): (2, 4, 2, False), (32, 1024): (4, 4, 2, False),
                   (32, 2048): (1, 8, 2, False), (32, 4096): (1, 16, 1, False), (32, 8192): (1, 16, 1, False)}


@functools.lru_cache(maxsize=None)
def forward_config(n: int, dtype: torch.dtype) -> Config:
    """The forward's launch shape for rows of ``n`` elements of ``dtype`` (the input's): the table's where it has
    the row's block (a whole row in one block up to ``MAX_BLOCK_FWD`` elements), else the row-wise rule."""
    return table_config(_FORWARD_TABLE, min(next_power_of_2(n), MAX_BLOCK_FWD), dtype, forward_rule)


@functools.lru_cache(maxsize=None)
def backward_config(n: int, dtype: torch.dtype) -> Config:
    """The backward's launch shape (see :func:`forward_config`; one block holds up to ``MAX_BLOCK_BWD`` elements)."""
    return table_config(_BACKWARD_TABLE, min(next_power_of_2(n), MAX_BLOCK_BWD), dtype, backward_rule)


def _grid(m: int, cfg: Config, device: torch.device) -> tuple[int, int]:
    """(rows per program, programs): no more rows per block than there are rows (batch-1 decoding),
    a few programs per multiprocessor, each looping over row blocks."""
    rows = min(cfg.rows, next_power_of_2(m))
    return rows, max(1, min(cdiv(m, rows), cfg.programs_per_sm * sm_count(device)))


# ----------------------------------------------------------------------------------- input checks
def _check(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Validate the pair and return N, the row width."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., N); got a 0-d tensor")
    accepted = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; accepted: {accepted}, in any pairing of x and weight "
                            "(the result has torch.promote_types(x.dtype, weight.dtype), as in LlamaRMSNorm)")
    n = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(f"weight must have shape ({n},) to match x's last dimension, got {tuple(weight.shape)}")
    if n > MAX_N:
        raise ValueError(f"N = {n} is beyond what this kernel supports (N <= {MAX_N})")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device} but x is on {x.device}; they must be on one device")
    check_triton_device(x.device, "x")
    if n > 1 and weight.stride(0) != 1:
        raise ValueError(f"weight must be contiguous (got stride {weight.stride(0)}); call .contiguous() first")
    return n


def _check_eps(eps: float) -> None:
    """Refuse an epsilon that is not a finite positive number (0 divides by zero on an all-zero row)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` as an (M, N) view with unit column stride, whatever its leading dims; refuse otherwise."""
    try:
        x2 = x.view(-1, n)
    except RuntimeError:
        x2 = None
    if x2 is None or (n > 1 and x2.stride(1) != 1):
        raise ValueError(f"x must be contiguous along its last dimension, with rows evenly spaced (got strides "
                         f"{x.stride()} for shape {tuple(x.shape)}); call .contiguous() first")
    return x2


# --------------------------------------------------------------------------------- host functions
def _launch(x: torch.Tensor, n: int, cfg: Config) -> tuple[torch.Tensor, int, Config, int, int]:
    """x as (M, N) rows, M, the config, rows per program and the number of programs."""
    x2 = _rows(x, n)
    rows, programs = _grid(x2.shape[0], cfg, x.device)
    return x2, x2.shape[0], cfg, rows, programs


def _out_dtype(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    """The result's dtype: ``out_dtype``, or by default ``LlamaRMSNorm``'s, ``promote_types(x.dtype, weight.dtype)``."""
    if out_dtype is None:
        return torch.promote_types(x.dtype, weight.dtype)
    if out_dtype not in DTYPES:
        raise TypeError(f"out_dtype must be one of {[str(d) for d in DTYPES]} or None, got {out_dtype}")
    return out_dtype


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, config: Config | None = None,
            out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``LlamaRMSNorm`` over the last dimension, with the statistics: returns ``(y, rstd)``, ``y`` of
    ``x``'s shape in ``out_dtype`` (default ``torch.promote_types(x.dtype, weight.dtype)``, as transformers),
    ``rstd`` fp32 of shape ``x.shape[:-1]``. ``x`` may be a view whose rows are evenly spaced (a slice of wider
    rows); ``config`` overrides :func:`forward_config`."""
    n = _check(x, weight)
    _check_eps(eps)
    y = torch.empty(x.shape, dtype=_out_dtype(x, weight, out_dtype), device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return y, rstd
    _forward_launch(x, None, None, weight, y, rstd, n, eps, config)
    return y, rstd


def _forward_launch(x: torch.Tensor, residual: torch.Tensor | None, total: torch.Tensor | None, weight: torch.Tensor,
                    y: torch.Tensor, rstd: torch.Tensor, n: int, eps: float, config: Config | None) -> None:
    x2, m, cfg, rows, programs = _launch(x, n, config or forward_config(n, x.dtype))
    r2 = x2 if residual is None else _rows(residual, n)
    _rms_norm_fwd_kernel[(programs,)](x2, r2, x2 if total is None else total, weight, y, rstd, m, n, x2.stride(0),
                                      r2.stride(0), eps, BLOCK_N=cfg.block_n, ROWS=rows, SINGLE=cfg.block_n >= n,
                                      EVEN_N=cfg.block_n == n, HAS_RES=residual is not None, STAGES=cfg.stages,
                                      num_warps=cfg.num_warps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                 config: Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A transformer block's residual step and the next norm in one kernel, for inference (no gradient):
    ``total = x + residual`` (x's dtype, rounded as the tensor addition rounds) and
    ``rms_norm(total, weight, eps)``; returns ``(total, normed)``. ``residual`` has x's shape and dtype."""
    n = _check(x, weight)
    _check_eps(eps)
    if not isinstance(residual, torch.Tensor) or residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual must be a tensor of x's shape {tuple(x.shape)} and dtype {x.dtype}, got "
                         f"{tuple(getattr(residual, 'shape', ()))} "
                         f"{getattr(residual, 'dtype', type(residual).__name__)}")
    if residual.device != x.device:
        raise ValueError(f"residual is on {residual.device} but x is on {x.device}; they must be on one device")
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if x.numel():
        _forward_launch(x, residual, total, weight, y, rstd, n, eps, config)
    return total, y


def backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
             config: Config | None = None, weight_grad: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of :func:`forward` given ``dy``: ``(dx, dweight)``, ``dx`` contiguous in ``x``'s dtype,
    ``dweight`` in ``weight``'s dtype, or None with ``weight_grad=False`` (a frozen weight: no
    partial sums, no second kernel). ``config`` overrides :func:`backward_config`."""
    n = _check(x, weight)
    if not isinstance(dy, torch.Tensor) or dy.shape != x.shape or dy.dtype not in DTYPES or dy.device != x.device:
        got = f"{tuple(dy.shape)}, {dy.dtype}, {dy.device}" if isinstance(dy, torch.Tensor) else type(dy).__name__
        raise ValueError(f"dy must be a float32/float16/bfloat16 tensor of x's shape {tuple(x.shape)} on "
                         f"{x.device}; got {got}")
    check_stats(x, rstd=rstd)
    return _backward(dy, x, weight, rstd, n, config, weight_grad)


def _backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, n: int,
              config: Config | None, weight_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`backward` without its checks: for the autograd Function, whose tensors the forward checked."""
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return dx, torch.zeros(n, dtype=weight.dtype, device=x.device) if weight_grad else None
    dweight = torch.empty(n, dtype=weight.dtype, device=x.device) if weight_grad else None  # every element summed
    x2, m, cfg, rows, programs = _launch(x, n, config or backward_config(n, x.dtype))
    single = cfg.block_n >= n
    # a whole-row program stores its partial sums once; a chunked one adds into them chunk by chunk
    part = (torch.empty if single else torch.zeros)(programs, n, dtype=torch.float32, device=x.device) \
        if weight_grad else dx
    _rms_norm_bwd_kernel[(programs,)](x2, weight, dy.contiguous(), rstd, dx, part, m, n, x2.stride(0),
                                      BLOCK_N=cfg.block_n, ROWS=rows, SINGLE=single,
                                      EVEN_N=cfg.block_n == n, HAS_DW=weight_grad, num_warps=cfg.num_warps)
    if weight_grad:  # one set of partial rows, one output
        sum_partials(part, dweight, programs, n)
    return dx, dweight


class RMSNormFunction(torch.autograd.Function):
    """autograd wrapper: forward and backward through the fused kernels, saving ``x`` and ``rstd``."""

    @staticmethod
    def forward(ctx, x, weight, eps, config, out_dtype):
        y, rstd = forward(x, weight, eps, config, out_dtype)
        ctx.save_for_backward(x, weight, rstd)
        ctx.config = config
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors  # checked by the forward; autograd gives dy the output's shape
        dx, dweight = _backward(dy, x, weight, rstd, x.shape[-1], ctx.config, ctx.needs_input_grad[1])
        return dx if ctx.needs_input_grad[0] else None, dweight, None, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, config: Config | None = None, *,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``LlamaRMSNorm``'s forward, differentiable in ``x`` and ``weight``:
    ``weight * (x.float() * rsqrt(mean(x.float()**2, -1) + eps)).to(x.dtype)``.
    ``config`` sets one launch shape for both passes (tests and sweeps); None takes the tables.
    ``out_dtype``: the result rounded once to this dtype (default: transformers' promotion, fp32 for an fp32
    weight). ``out_dtype=x.dtype`` with an fp32 weight writes 2 bytes an element instead of 4, as Liger-Kernel's
    RMSNorm does: the same numbers as ``rms_norm(x, weight).to(x.dtype)``, a third fewer bytes moved."""
    return RMSNormFunction.apply(x, weight, eps, config, out_dtype)


class FusedRMSNorm(torch.nn.Module):
    """Drop-in for ``LlamaRMSNorm``: the same ``weight`` and ``variance_epsilon`` attributes, the same
    numbers up to rounding, one kernel per pass."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps

    @classmethod
    def from_llama(cls, module: torch.nn.Module) -> "FusedRMSNorm":
        """A fused module sharing ``module``'s weight Parameter (not a copy) and epsilon, for patching
        a model in place. ``module`` is a ``LlamaRMSNorm`` or any norm with its semantics and attributes
        (Mistral's, Qwen2's)."""
        weight = getattr(module, "weight", None)
        eps = getattr(module, "variance_epsilon", None)
        if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1 or not isinstance(eps, (int, float)):
            raise TypeError(f"from_llama needs a LlamaRMSNorm-like module (a 1-D weight Parameter and a float "
                            f"variance_epsilon), got {type(module).__name__}")
        fused = cls(weight.shape[0], eps, device="meta")
        fused.weight = weight
        return fused.train(module.training)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"
