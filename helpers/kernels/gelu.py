"""GELU in fp32 inside a Triton kernel, in six forms, for the row-wise kernels that apply it to values already in
registers (the fused bias + GELU + LayerNorm, the teaching ladder of notebook 04).

:func:`gelu` and :func:`gelu_and_grad` (GELU and its derivative, for a backward) take the form as a
``tl.constexpr`` (``GELU_MODES`` maps the names a caller passes to them):

- ``"erf"``: the exact definition through the library ``erf``;
- ``"erf_fast"``: the same function with ``erf`` replaced by Abramowitz & Stegun 7.1.26 (one reciprocal, one exp2,
  five FMAs; absolute error of GELU below 1e-6, far under bf16/fp16 rounding: see the tests and notebook 04);
- ``"erf_exp2"``: the same promise for fewer instructions: Phi(-|v|) as one exp2 of a degree-5 polynomial (no
  reciprocal; see :func:`_phi_neg_abs`);
- ``"erf_fp32"``: exact GELU to fp32 accuracy (within ``FP32_GELU_ABS * max(1, |GELU|)``, as the library ``erf``
  is) for fewer instructions an element than the library ``erf`` (scripts/fused_kernel_instructions.py counts
  them): Phi(-|v|) from Numerical Recipes' erfc (one reciprocal, one exp2, a degree-9 polynomial; see
  :func:`_phi_neg_abs_fp32`);
- ``"tanh"``: PyTorch's ``approximate="tanh"``;
- ``"none"``: no GELU (for ablations).

``AUTO_GELU`` is ``gelu="auto"``: ``erf_exp2`` for 16-bit storage and ``erf_fp32`` for fp32, the exact forms (to the
storage's precision) with the fewest instructions, for kernels bound by instructions rather than by memory (appendix
04a counts the instructions and times the forms).

On a GPU, exp2 and the reciprocal are single PTX instructions (``FAST_ASM``); the interpreter has no PTX and
computes them in numpy.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device  # imported first: sets TRITON_INTERPRET before the kernels are defined

# The forms as the kernels' GELU argument names them (tl.constexpr: the only globals a @triton.jit function may
# read); GELU_MODES maps ``gelu=`` to them.
GELU_NONE = tl.constexpr(0)
GELU_ERF = tl.constexpr(1)
GELU_ERF_FAST = tl.constexpr(2)
GELU_TANH = tl.constexpr(3)
GELU_ERF_EXP2 = tl.constexpr(4)
GELU_ERF_FP32 = tl.constexpr(5)
GELU_MODES = {"none": GELU_NONE.value, "erf": GELU_ERF.value, "erf_fast": GELU_ERF_FAST.value,
              "tanh": GELU_TANH.value, "erf_exp2": GELU_ERF_EXP2.value, "erf_fp32": GELU_ERF_FP32.value}
AUTO_GELU = {torch.float32: "erf_fp32", torch.float16: "erf_exp2", torch.bfloat16: "erf_exp2"}
# The fast erf's promise, checked on a dense sweep by the tests and notebook 04:
# |GELU_fast(v) - GELU(v)| <= max(FAST_GELU_ABS, FAST_GELU_REL * |GELU(v)|). bf16 rounds a stored value by up to
# 2**-9 of it and fp16 by up to 2**-11, so the approximation sits 8x (bf16) and 2x (fp16) under the rounding.
FAST_GELU_ABS = 2.0**-20
FAST_GELU_REL = 2.0**-12
# erf_fp32's promise: |GELU_fp32(v) - GELU(v)| <= FP32_GELU_ABS * max(1, |GELU(v)|), a few fp32 roundings of a value
# of order one, as close as the library erf's GELU comes (which loses more, relatively, where 1 + erf cancels).
FP32_GELU_ABS = 2.0**-22
FAST_ASM = not _device.INTERPRET  # single-instruction PTX approximations on a GPU; the interpreter has no PTX


def gelu_mode(name: str, dtype: torch.dtype) -> int:
    """The kernels' GELU argument for ``gelu=name``: a name of ``GELU_MODES``, or ``"auto"``, ``AUTO_GELU``'s form
    for storage of ``dtype``."""
    if name == "auto":
        name = AUTO_GELU[dtype]
    if name not in GELU_MODES:
        raise ValueError(f"gelu must be 'auto' or one of {sorted(GELU_MODES)}, got {name!r}")
    return GELU_MODES[name]


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
def gelu(v, GELU: tl.constexpr, FAST: tl.constexpr):
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
def gelu_and_grad(v, GELU: tl.constexpr, FAST: tl.constexpr):
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
