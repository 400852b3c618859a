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

GELU variants (``gelu=``): ``"erf"`` the exact definition through the library ``erf``;
``"erf_fast"`` the same function with ``erf`` replaced by Abramowitz & Stegun 7.1.26 (one
reciprocal, one exp2, five FMAs; absolute error of GELU below 1e-6, far under bf16/fp16 rounding:
see the tests and notebook 04); ``"erf_exp2"`` the same promise for fewer instructions: Phi(-|v|) as one
exp2 of a degree-5 polynomial (no reciprocal; see :func:`_phi_neg_abs`); ``"erf_fp32"`` exact GELU to fp32
accuracy (within ``FP32_GELU_ABS * max(1, |GELU|)``, as the library ``erf`` is) for 13-14 fewer instructions an
element (scripts/fused_kernel_instructions.py): Phi(-|v|) from Numerical Recipes' erfc (one reciprocal, one exp2,
a degree-9 polynomial; see :func:`_phi_neg_abs_fp32`); ``"tanh"`` PyTorch's ``approximate="tanh"``; ``"none"``
skips GELU (for ablations).
``"auto"`` = ``erf_exp2`` for 16-bit storage and ``erf_fp32`` for fp32 (the fastest exact forms for each on the
H200, where these kernels are bound by instructions).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import device as _device  # imported first: sets TRITON_INTERPRET before the kernels are defined
from . import check_powers_of_two, check_triton_device
from .rowwise import cdiv, next_power_of_2, sm_count, sum_partials_kernel, tile_mask

# The GELU variants as the kernels' GELU argument names them (tl.constexpr: the only globals a @triton.jit
# function may read); GELU_MODES maps ``gelu=`` to them.
GELU_NONE = tl.constexpr(0)
GELU_ERF = tl.constexpr(1)
GELU_ERF_FAST = tl.constexpr(2)
GELU_TANH = tl.constexpr(3)
GELU_ERF_EXP2 = tl.constexpr(4)
GELU_ERF_FP32 = tl.constexpr(5)
GELU_MODES = {"none": GELU_NONE.value, "erf": GELU_ERF.value, "erf_fast": GELU_ERF_FAST.value,
              "tanh": GELU_TANH.value, "erf_exp2": GELU_ERF_EXP2.value, "erf_fp32": GELU_ERF_FP32.value}
AUTO_GELU = {torch.float32: "erf_fp32", torch.float16: "erf_exp2", torch.bfloat16: "erf_exp2"}
DTYPES = tuple(AUTO_GELU)
MAX_N = 1 << 20  # widest row accepted (the chunked path handles any width; this bounds the partial sums' memory)
MAX_BLOCK_FWD = 16384  # widest row held in registers by one program in the forward
MAX_BLOCK_BWD = 8192  # ... and in the backward (three fp32 accumulators per element besides the data)
# The fast erf's promise, checked on a dense sweep by the tests and notebook 04:
# |GELU_fast(v) - GELU(v)| <= max(FAST_GELU_ABS, FAST_GELU_REL * |GELU(v)|). bf16 rounds a stored value by up to
# 2**-9 of it and fp16 by up to 2**-11, so the approximation sits 8x (bf16) and 2x (fp16) under the rounding.
FAST_GELU_ABS = 2.0**-20
FAST_GELU_REL = 2.0**-12
# erf_fp32's promise: |GELU_fp32(v) - GELU(v)| <= FP32_GELU_ABS * max(1, |GELU(v)|), a few fp32 roundings of a value
# of order one, as close as the library erf's GELU comes (which loses more, relatively, where 1 + erf cancels).
FP32_GELU_ABS = 2.0**-22


# ----------------------------------------------------------------------------------------- GELU
FAST_ASM = not _device.INTERPRET  # single-instruction PTX approximations on a GPU; the interpreter has no PTX


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    """2**x: one MUFU.EX2 (flushing denormal results to 0) on a GPU."""
    if FAST:
        y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:  # the interpreter (numpy) warns on overflow; 2**127 is as good as inf wherever it is used here
        y = tl.exp2(tl.minimum(x, 127.0, propagate_nan=tl.PropagateNan.ALL))
    return y


@triton.jit
def _rcp(x, FAST: tl.constexpr):
    """1/x: one MUFU.RCP on a GPU (``/`` compiles to a full-range division, several instructions)."""
    if FAST:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:
        y = 1.0 / x
    return y


@triton.jit
def _phi_fast(v, FAST: tl.constexpr):
    """Phi(v) (the normal CDF) and exp(-v^2/2), with erfc from Abramowitz & Stegun 7.1.26."""
    e = _exp2(v * v * -0.7213475204444817, FAST)                 # exp(-v^2/2)
    t = _rcp(1.0 + 0.2316418882663604 * tl.abs(v), FAST)          # 1 / (1 + p |v| / sqrt 2)
    h = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
    h = h * e                                                     # = Phi(-|v|) = erfc(|v|/sqrt 2) / 2
    return tl.where(v >= 0, 1.0 - h, h), e


@triton.jit
def _phi_neg_abs(v):
    """log2 Phi(-|v|) ~ P(a) - v^2 / (2 ln 2) with a = min(|v|, 5.5), and a. P is a degree-5 fit (fp32 coefficients)
    of log2 Phi(-a) + a^2 / (2 ln 2), smooth on [0, 5.5], minimax in the error against the promise's bound
    (Lawson's reweighted least squares): the GELU it gives stays within a tenth of FAST_GELU_ABS / FAST_GELU_REL.
    Past 5.5 the exponent still falls with v^2: exp2 of it goes to 0."""
    a = tl.minimum(tl.abs(v), 5.5)
    p = -1.0000391006469727 + a * (-1.1504335403442383 + a * (0.2601824104785919 + a * (
        -0.05061868205666542 + a * (0.006598849780857563 + a * -0.0004069868300575763))))
    return p - 0.7213475204444817 * v * v, a


@triton.jit
def _phi_neg_abs_fp32(v, FAST: tl.constexpr):
    """Phi(-|v|) = erfc(z) / 2 with z = |v| / sqrt 2, to fp32 accuracy, and |v|. Numerical Recipes' erfcc:
    erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), P a degree-9 Chebyshev fit (fractional error < 1.2e-7);
    here in base 2, with log2(e) and the halving folded into P's coefficients."""
    a = tl.abs(v)
    t = _rcp(1.0 + 0.35355339059327373 * a, FAST)
    p = -2.825748218405333 + t * (1.4427292039075317 + t * (0.5397006155284324 + t * (0.1396300565225048 + t * (
        -0.2687568603388257 + t * (0.40232158165127635 + t * (-1.637753152343414 + t * (2.147474463933521 + t * (
            -1.1861149450768025 + t * 0.24651729790196045))))))))
    return t * _exp2(a * a * -0.7213475204444817 + p, FAST), a


@triton.jit
def _gelu(v, GELU: tl.constexpr, FAST: tl.constexpr):
    """GELU(v) in fp32; GELU selects the variant (see GELU_MODES)."""
    if GELU == GELU_ERF:
        g = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    elif GELU == GELU_ERF_FAST:
        phi, _ = _phi_fast(v, FAST)
        g = v * phi
    elif GELU == GELU_TANH:
        g = v * _rcp(1.0 + _exp2(-v * (2.302208198144325 + 0.1029432395800235 * v * v), FAST), FAST)
    elif GELU == GELU_ERF_EXP2:
        # v Phi(v) = max(v, 0) - |v| Phi(-|v|): no select on the sign; a (finite) makes v = +-inf exact
        log2_h, a = _phi_neg_abs(v)
        g = tl.maximum(v, 0.0) - a * _exp2(log2_h, FAST)
    elif GELU == GELU_ERF_FP32:
        # the same form; |v| capped where h is already 0, so that v = -inf gives 0, not inf * 0
        h, a = _phi_neg_abs_fp32(v, FAST)
        g = tl.maximum(v, 0.0) - tl.minimum(a, 3.0e38) * h
    else:  # GELU_NONE
        g = v
    return g


@triton.jit
def _gelu_and_grad(v, GELU: tl.constexpr, FAST: tl.constexpr):
    """GELU(v) and its derivative dGELU/dv, in fp32."""
    if GELU == GELU_ERF:
        phi = 0.5 * (1.0 + tl.erf(v * 0.7071067811865476))
        g = v * phi
        dg = phi + v * 0.3989422804014327 * tl.exp2(v * v * -0.7213475204444817)
    elif GELU == GELU_ERF_FAST:
        phi, e = _phi_fast(v, FAST)
        g = v * phi
        dg = phi + v * 0.3989422804014327 * e
    elif GELU == GELU_TANH:
        s = _rcp(1.0 + _exp2(-v * (2.302208198144325 + 0.1029432395800235 * v * v), FAST), FAST)
        g = v * s
        dg = s + v * s * (1.0 - s) * (0.6931471805599453 * (2.302208198144325 + 0.3088297187400705 * v * v))
    elif GELU == GELU_ERF_EXP2:
        log2_h, a = _phi_neg_abs(v)
        h = _exp2(log2_h, FAST)
        g = tl.maximum(v, 0.0) - a * h
        dg = tl.where(v >= 0, 1.0 - h, h) + v * 0.3989422804014327 * _exp2(v * v * -0.7213475204444817, FAST)
    elif GELU == GELU_ERF_FP32:
        h, a = _phi_neg_abs_fp32(v, FAST)
        g = tl.maximum(v, 0.0) - tl.minimum(a, 3.0e38) * h
        dg = tl.where(v >= 0, 1.0 - h, h) + v * 0.3989422804014327 * _exp2(v * v * -0.7213475204444817, FAST)
    else:  # GELU_NONE
        g = v
        dg = tl.full(v.shape, 1.0, tl.float32)
    return g, dg


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
            y = _gelu(x + b[None, :], GELU, FAST)  # 0 in masked lanes: GELU(0) = 0
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
                    g = _gelu(x + b[None, :], GELU, FAST)
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
                y = _gelu(x + b[None, :], GELU, FAST)
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
            g, dg = _gelu_and_grad(x + b[None, :], GELU, FAST)
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
                g = _gelu(x + b[None, :], GELU, FAST)
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
                g, dg = _gelu_and_grad(x + b[None, :], GELU, FAST)
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
@dataclass(frozen=True)
class Config:
    """How a launch is cut: ``block_n`` columns per step (the row fits in one block when
    ``block_n >= N``), ``rows`` rows per block, ``num_warps`` warps per program, at most
    ``programs_per_sm`` programs per multiprocessor, each looping over row blocks. ``prefetch`` loads a
    program's next row block while it computes the current one (with one block a row; ignored when each
    program has one row block); ``stages`` > 1 has Triton software-pipeline the forward's row-block loop
    instead (``tl.range(num_stages=stages)``: the loads of the next ``stages - 1`` blocks go to shared
    memory as asynchronous copies; the forward only)."""

    block_n: int
    rows: int
    num_warps: int
    programs_per_sm: int = 1
    prefetch: bool = True
    stages: int = 1

    def __post_init__(self):
        check_powers_of_two(self, "block_n", "rows", "num_warps")
        if self.programs_per_sm < 1:
            raise ValueError(f"Config.programs_per_sm must be >= 1, got {self.programs_per_sm}")
        if self.stages < 1:
            raise ValueError(f"Config.stages must be >= 1, got {self.stages}")

    def programs(self, m: int, device: torch.device) -> int:
        """Programs in the grid for ``m`` rows on ``device``."""
        blocks = max(1, cdiv(m, self.rows))
        return min(blocks, self.programs_per_sm * sm_count(device))

    def prefetches(self, m: int, device: torch.device) -> bool:
        """Whether the launch prefetches (only worth it when a program has more than one row block)."""
        return self.prefetch and self.programs(m, device) < cdiv(m, self.rows)


# Measured on the H200 by scripts/fused_bias_gelu_layernorm_tune.py (M x N = 64M elements; the forward's 16-bit
# entries for N >= 2048 with erf_exp2, its 32-bit entries with erf_fp32 and bf16 N = 8192 with the degree-5 erf_exp2,
# those two after a read-only L2 flush): (bits per element, block) ->
# (rows per block, warps, programs per SM, prefetch[, pipeline stages])
_FORWARD_TABLE = {(16, 1024): (4, 2, 4, False, 4), (16, 2048): (2, 2, 4, False, 3), (16, 4096): (2, 4, 2, False, 3),
                  (16, 8192): (2, 16, 1, True),
                  (32, 1024): (1, 2, 4, False, 4), (32, 2048): (2, 4, 2, False, 3), (32, 4096): (1, 16, 4, True),
                  (32, 8192): (1, 16, 1, False, 4)}
_BACKWARD_TABLE = {(16, 1024): (4, 4, 2), (16, 2048): (2, 4, 2), (16, 4096): (2, 16, 1), (16, 8192): (1, 16, 1, False),
                   (32, 1024): (4, 4, 2), (32, 2048): (1, 8, 2), (32, 4096): (1, 16, 1), (32, 8192): (1, 16, 1, False)}


@functools.lru_cache(maxsize=None)
def forward_config(n: int, dtype: torch.dtype) -> Config:
    """The forward's launch shape: the measured table where it has the row width, else the rule it
    suggests (a whole row in one block up to ``MAX_BLOCK_FWD``; ~16 elements per thread; a few
    programs per SM, each looping over row blocks)."""
    block = min(triton.next_power_of_2(n), MAX_BLOCK_FWD)
    bits = 8 * dtype.itemsize
    if (bits, block) in _FORWARD_TABLE:
        return Config(block, *_FORWARD_TABLE[bits, block])
    rows = max(1, min(8, 1024 // block))
    return Config(block, rows, max(1, min(16, block * rows // 512)), programs_per_sm=max(2, min(8, 8192 // block)))


@functools.lru_cache(maxsize=None)
def backward_config(n: int, dtype: torch.dtype) -> Config:
    """The backward's launch shape (see :func:`forward_config`)."""
    block = min(triton.next_power_of_2(n), MAX_BLOCK_BWD)
    bits = 8 * dtype.itemsize
    if (bits, block) in _BACKWARD_TABLE:
        return Config(block, *_BACKWARD_TABLE[bits, block])
    rows = max(1, min(8, 2048 // block))
    return Config(block, rows, max(4, min(16, block * rows // 256)), programs_per_sm=2)


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


def _gelu_mode(gelu: str, dtype: torch.dtype) -> int:
    if gelu == "auto":
        gelu = AUTO_GELU[dtype]
    if gelu not in GELU_MODES:
        raise ValueError(f"gelu must be 'auto' or one of {sorted(GELU_MODES)}, got {gelu!r}")
    return GELU_MODES[gelu]


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
    for name, t in (("mean", mean), ("rstd", rstd)):
        if not isinstance(t, torch.Tensor) or t.shape != x.shape[:-1] or t.dtype != torch.float32 \
                or t.device != x.device or not t.is_contiguous():
            got = f"{tuple(t.shape)}, {t.dtype}, {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be the forward's contiguous fp32 statistics of shape "
                             f"{tuple(x.shape[:-1])} on {x.device}; got {got}")
    return _backward(dy, x, bias, weight, mean, rstd, n, mode, config)


def _backward(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None,
              mean: torch.Tensor, rstd: torch.Tensor, n: int, mode: int, config: Config | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`backward` without its checks: for the autograd Function, whose tensors the forward checked."""
    dy = dy.contiguous()
    dx = torch.empty_like(x)
    if x.numel() == 0:
        return dx, *(torch.zeros(n, dtype=x.dtype, device=x.device) for _ in range(3))
    grads = torch.empty(3, n, dtype=x.dtype, device=x.device).unbind(0)  # every column is written
    m = x.numel() // n
    cfg = config or backward_config(n, x.dtype)
    programs = cfg.programs(m, x.device)
    single = cfg.block_n >= n  # one block a row: each program writes its whole partial rows; else it adds into them
    part = (torch.empty if single else torch.zeros)(3, programs, n, dtype=torch.float32, device=x.device)
    _backward_kernel[(programs,)](
        x, bias, weight if weight is not None else x, dy, mean, rstd, dx, part, m, n,
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, SINGLE=single, GELU=mode, HAS_W=weight is not None,
        EVEN_N=cfg.block_n == n, FAST=FAST_ASM, PREFETCH=cfg.prefetches(m, x.device), num_warps=cfg.num_warps)
    block_c = min(256, next_power_of_2(n))
    sum_partials_kernel[(cdiv(n, block_c), 3)](part, *grads, programs, n, BLOCK_P=32, BLOCK_C=block_c,
                                               num_warps=4)
    return dx, *grads


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
