"""The fused RMSNorm (Llama's), forward and backward, against float64 and against transformers' LlamaRMSNorm.

On the CPU the kernels run in the Triton interpreter, whose fp32 -> bf16 conversion truncates: bf16
results there may sit one bf16 step further from the reference than on a GPU; the tolerances allow it.
"""
import math

import pytest
import torch

import helpers  # first: without a GPU it switches Triton to its interpreter before transformers imports Triton
from helpers.kernels import rms_norm as K
from numerics import rel_err
from transformers.models.llama.modeling_llama import LlamaRMSNorm

DEV = helpers.DEVICE
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# relative error (norm) of a result that passed through the dtype, against float64. The forward rounds twice
# (x * rstd to x's dtype, then the product with the weight): in bf16 (8 significant bits) two roundings to
# nearest stay under 2 * 2**-8 < 1e-2, two truncations (the interpreter) under 2 * 2**-7 < 2e-2. fp32: about 10x
# the largest error measured in the interpreter (2.1e-7).
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2 if helpers.INTERPRET else 1e-2}
EPS = 1e-6


def randn(*shape, dtype=torch.float32):
    """Random values on the test device (from the test's seed, tests/conftest.py)."""
    return torch.randn(*shape).to(DEV, dtype)


def reference64(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """RMSNorm in float64 on the CPU, differentiable (no intermediate rounding)."""
    x = x.to("cpu", torch.float64)
    return weight.to("cpu", torch.float64) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def grads64(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """float64 ``(dx, dweight, dx_scale, dweight_scale)``. The scales, to measure errors against, are the
    sizes of the terms each gradient adds up rather than the gradient itself:
    ``dx = rstd * (dy * weight - h * mean(dy * weight * h))`` nearly cancels on short rows (N = 1: dx is
    eps-sized), and ``dweight = sum over rows of dy * h`` can cancel over few rows; no rounded
    computation resolves such a difference finer than the rounding of its terms."""
    x64 = x.detach().to("cpu", torch.float64).requires_grad_()
    w64 = weight.detach().to("cpu", torch.float64).requires_grad_()
    dy64 = dy.to("cpu", torch.float64)
    reference64(x64, w64).backward(dy64)
    rstd = torch.rsqrt(x64.detach().pow(2).mean(-1, keepdim=True) + EPS)
    dw_scale = (dy64 * x64.detach() * rstd).abs().reshape(-1, x.shape[-1]).sum(0)
    return x64.grad, w64.grad, rstd * dy64 * w64.detach(), dw_scale


CASES = [  # (leading shape, N, config): N = 1, odd N, leading dims, batch-1 decoding, rows wider than one block
    ((5,), 1, None),
    ((3, 3), 7, None),
    ((2,), 64, None),                       # the block is the row: no column mask
    ((37,), 100, None),                     # several rows per program, a partial last row block
    ((2, 19), 300, K.Config(512, 2, 4)),    # each program loops over several row blocks
    ((2, 19), 300, K.Config(512, 2, 4, prefetch=False, stages=3)),  # the same loop pipelined (GPU: async copies)
    ((2, 3, 2), 1000, None),
    ((1,), 4096, None),                     # one row (decoding)
    ((3,), 4099, None),
    ((9,), 1000, K.Config(256, 2, 4)),      # chunked: two rows per program, M odd, last chunk partial
    ((5,), 512, K.Config(128, 4, 2)),       # chunked: whole chunks, a partial row block
    ((4,), 7, K.Config(4, 1, 1)),           # chunked: a tiny row in two chunks
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n,cfg", CASES)
def test_forward_matches_float64(lead, n, cfg, dtype, poisoned):
    x, w = randn(*lead, n, dtype=dtype), randn(n, dtype=dtype)
    y, rstd = K.forward(x, w, EPS, config=cfg)
    assert y.dtype == dtype and y.shape == x.shape and rstd.shape == lead and rstd.dtype == torch.float32
    assert rel_err(y, reference64(x, w)) < TOL[dtype]
    x64 = x.double().cpu()
    assert rel_err(rstd, torch.rsqrt(x64.pow(2).mean(-1) + EPS)) < 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n,cfg", CASES)
def test_backward_matches_float64(lead, n, cfg, dtype, poisoned):
    x = randn(*lead, n, dtype=dtype).requires_grad_()
    w = randn(n, dtype=dtype).requires_grad_()
    dy = randn(*lead, n, dtype=dtype)
    K.rms_norm(x, w, EPS, config=cfg).backward(dy)
    assert x.grad.dtype == dtype and w.grad.dtype == dtype
    dx64, dw64, dx_scale, dw_scale = grads64(x, w, dy)
    assert rel_err(x.grad, dx64, dx_scale) < TOL[dtype]
    assert rel_err(w.grad, dw64, dw_scale) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n,cfg", CASES)
def test_add_rms_norm_is_the_sum_then_the_norm(lead, n, cfg, dtype, poisoned):
    x, r, w = randn(*lead, n, dtype=dtype), randn(*lead, n, dtype=dtype), randn(n, dtype=dtype)
    total, y = K.add_rms_norm(x, r, w, EPS, config=cfg)
    assert total.dtype == dtype and total.shape == x.shape and y.dtype == dtype and y.shape == x.shape
    expect = x + r  # the tensor addition the kernel replaces (rounded to dtype)
    if helpers.INTERPRET and dtype == torch.bfloat16:  # the interpreter truncates: one bf16 step at most
        assert ((total.float() - expect.float()).abs() <= expect.float().abs() * 2**-7).all()
    else:
        assert torch.equal(total, expect)
    assert rel_err(y, reference64(total, w)) < TOL[dtype]


def test_add_rms_norm_refuses_a_mismatched_residual():
    x, w = randn(2, 8), randn(8)
    with pytest.raises(ValueError, match="residual"):
        K.add_rms_norm(x, randn(2, 4), w)
    with pytest.raises(ValueError, match="residual"):
        K.add_rms_norm(x, randn(2, 8, dtype=torch.float16), w)


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("w_dtype", DTYPES)
def test_every_dtype_pairing_promotes_like_llama(x_dtype, w_dtype, poisoned):
    x = randn(4, 100, dtype=x_dtype).requires_grad_()
    w = randn(100, dtype=w_dtype).requires_grad_()
    y = K.rms_norm(x, w, EPS)
    assert y.dtype == torch.promote_types(x_dtype, w_dtype)
    assert rel_err(y, reference64(x, w)) < TOL[x_dtype]  # y is x's dtype or fp32: x's rounding dominates
    dy = randn(4, 100, dtype=y.dtype)
    y.backward(dy)
    assert x.grad.dtype == x_dtype and w.grad.dtype == w_dtype
    dx64, dw64, dx_scale, dw_scale = grads64(x, w, dy)
    assert rel_err(x.grad, dx64, dx_scale) < TOL[x_dtype]
    assert rel_err(w.grad, dw64, dw_scale) < max(TOL[x_dtype], TOL[w_dtype])


@pytest.mark.parametrize("n,cfg", [(100, None), (1000, K.Config(256, 1, 4))])  # one block a row; two passes
def test_out_dtype_rounds_the_promoted_result_once(n, cfg, poisoned):
    """An fp32 weight with ``out_dtype=bf16`` (Liger's output): the fp32 result rounded once, and its gradients
    those of that function with a bf16 dy."""
    x = randn(6, n, dtype=torch.bfloat16).requires_grad_()
    w = randn(n).requires_grad_()
    y = K.rms_norm(x, w, EPS, cfg, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    with torch.no_grad():
        promoted = K.rms_norm(x, w, EPS, cfg)
    if helpers.INTERPRET:  # its fp32 -> bf16 truncates: within one bf16 step (2**-7 relative) below
        assert ((y.float() - promoted).abs() <= promoted.abs() * 2 ** -7).all()
    else:
        assert torch.equal(y, promoted.to(torch.bfloat16))
    dy = randn(6, n, dtype=torch.bfloat16)
    y.backward(dy)
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    dx64, dw64, dx_scale, dw_scale = grads64(x, w, dy)
    assert rel_err(x.grad, dx64, dx_scale) < TOL[torch.bfloat16]
    assert rel_err(w.grad, dw64, dw_scale) < TOL[torch.bfloat16]
    with pytest.raises(TypeError, match="out_dtype must be one of"):
        K.rms_norm(x, w, out_dtype=torch.int8)


# ------------------------------------------------------------------------ against transformers
@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                             (torch.bfloat16, torch.float32)])  # the last: a QLoRA norm
@pytest.mark.parametrize("n,cfg", [(1000, None), (1000, K.Config(256, 1, 4))])
def test_matches_llama_rms_norm(x_dtype, w_dtype, n, cfg, poisoned):
    llama = LlamaRMSNorm(n, eps=EPS).to(DEV, w_dtype)
    with torch.no_grad():
        llama.weight.normal_()
    ours = K.FusedRMSNorm.from_llama(llama)
    x = randn(2, 3, n, dtype=x_dtype).requires_grad_()
    y = K.rms_norm(x, ours.weight, ours.variance_epsilon, config=cfg)
    ref = llama(x)
    assert y.dtype == ref.dtype
    # the same two roundings in the same places: apart from the fp32 statistics' summation order, each may
    # land one step of x's dtype apart (the interpreter truncates bf16), so y is within 3 steps of ref
    rtol = 3 * torch.finfo(x_dtype).eps + 8 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(y, ref, rtol=rtol, atol=0.0)
    dy = randn(2, 3, n, dtype=y.dtype)
    dx, dw = torch.autograd.grad(y, (x, ours.weight), dy)
    dx_ref, dw_ref = torch.autograd.grad(ref, (x, llama.weight), dy)
    dx64, dw64, dx_scale, dw_scale = grads64(x, llama.weight, dy)
    assert rel_err(dx, dx64, dx_scale) < TOL[x_dtype] and rel_err(dx, dx_ref, dx_scale) < TOL[x_dtype]
    assert rel_err(dw, dw64, dw_scale) < TOL[x_dtype] and rel_err(dw, dw_ref, dw_scale) < TOL[x_dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,cfg", [(1000, None), (1000, K.Config(256, 1, 4))])
def test_bf16_matches_llama_rms_norm_bit_for_bit_on_a_gpu(w_dtype, n, cfg):
    """Rounding to nearest on both sides: nearly every element identical (the fp32 statistics' summation order
    can move rstd by a last bit, which may move a whole row's roundings)."""
    llama = LlamaRMSNorm(n, eps=EPS).to(DEV, w_dtype)
    with torch.no_grad():
        llama.weight.normal_()
    x = randn(2, 3, n, dtype=torch.bfloat16)
    y = K.rms_norm(x, llama.weight, llama.variance_epsilon, config=cfg)
    assert (y == llama(x)).float().mean().item() > 0.99


def truncate_to_bf16(v: torch.Tensor) -> torch.Tensor:
    """fp32 ``v`` cut to bf16 toward zero (the interpreter's conversion), as fp32."""
    return (v.float().view(torch.int32) & -65536).view(torch.float32)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,cfg", [(1000, None), (1000, K.Config(256, 2, 4))])
def test_the_normalised_row_is_rounded_to_x_dtype_before_the_weight(x_dtype, n, cfg, poisoned):
    """LlamaRMSNorm rounds x * rstd to x's dtype and then multiplies by the weight: with the fp32 weight of a
    QLoRA model's norms, y is the weight times a value of x's dtype. Weights that are powers of two make the
    product exact, so y / weight is a value of x's dtype, however the conversion rounds (the interpreter
    truncates to bf16, a GPU rounds to nearest), within one step of x's dtype of the fp32 x * rstd. A kernel
    that applied the weight to the unrounded fp32 value would pass a tolerance against Llama's result (it is
    as close as the rounded one) but not this."""
    x = randn(3, 5, n, dtype=x_dtype)
    w = torch.randint(-3, 4, (n,)).float().exp2() * (torch.randint(0, 2, (n,)) * 2 - 1)
    y = K.rms_norm(x, w.to(DEV), EPS, config=cfg)
    assert y.dtype == torch.float32
    h = y.cpu() / w  # exact: w is a power of two
    assert torch.equal(h.to(x_dtype).float(), h), "y / weight is not a value of x's dtype"
    x32 = x.float().cpu()
    h32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)
    step = torch.finfo(x_dtype).eps * h32.abs().clamp(min=torch.finfo(x_dtype).smallest_normal)  # subnormals too
    assert ((h - h32).abs() <= step * (1 + 2**-20)).all()
    # the rounding itself: to nearest, except the interpreter's fp32 -> bf16 (toward zero); a last-bit difference
    # of rstd (summation order) can move a few elements to the neighbouring value
    want = truncate_to_bf16(h32) if helpers.INTERPRET and x_dtype == torch.bfloat16 else h32.to(x_dtype).float()
    assert (h == want).float().mean().item() > 0.99

def test_from_llama_shares_the_weight_parameter():
    llama = LlamaRMSNorm(64, eps=1e-5).to(DEV)
    llama.eval()
    ours = K.FusedRMSNorm.from_llama(llama)
    assert ours.weight is llama.weight and ours.variance_epsilon == 1e-5 and not ours.training
    params = list(ours.parameters())
    assert len(params) == 1 and params[0] is llama.weight
    with torch.no_grad():
        llama.weight.mul_(3.0)  # an update through either module is seen by the other
    x = randn(3, 64)
    torch.testing.assert_close(ours(x), llama(x), rtol=1e-5, atol=0.0)
    assert repr(ours) == "FusedRMSNorm((64,), eps=1e-05)"
    with pytest.raises(TypeError, match="LlamaRMSNorm-like"):
        K.FusedRMSNorm.from_llama(torch.nn.LayerNorm(64))


def test_module_defaults_like_llama():
    ours = K.FusedRMSNorm(100, device=DEV)
    assert torch.equal(ours.weight, torch.ones(100, device=DEV)) and ours.variance_epsilon == 1e-6
    x = randn(2, 100)
    torch.testing.assert_close(ours(x), LlamaRMSNorm(100).to(DEV)(x), rtol=1e-5, atol=0.0)


# ------------------------------------------------------------------- frozen weight, views, order
def test_frozen_weight_gets_no_gradient(poisoned):
    x = randn(6, 300, dtype=torch.bfloat16).requires_grad_()
    w = randn(300)  # a frozen fp32 norm, as in a QLoRA model
    dy = randn(6, 300)
    K.rms_norm(x, w, EPS).backward(dy)
    assert w.grad is None
    dx64, _, dx_scale, _ = grads64(x, w, dy)
    assert rel_err(x.grad, dx64, dx_scale) < TOL[torch.bfloat16]
    _, rstd = K.forward(x.detach(), w)
    assert K.backward(dy, x.detach(), w, rstd, weight_grad=False)[1] is None


def test_rows_of_a_wider_tensor_are_read_in_place(poisoned):
    wide = randn(2, 3, 2 * 100)
    x = wide[..., :100].requires_grad_()  # not contiguous, rows evenly spaced
    w = randn(100).requires_grad_()
    y = K.rms_norm(x, w, EPS)
    assert rel_err(y, reference64(x, w)) < TOL[torch.float32]
    y.sum().backward()  # dy arrives expanded (stride 0)
    dx64, dw64, dx_scale, dw_scale = grads64(x, w, torch.ones_like(y))
    assert rel_err(x.grad, dx64, dx_scale) < TOL[torch.float32]
    assert rel_err(w.grad, dw64, dw_scale) < TOL[torch.float32]


def test_backward_is_deterministic():
    x, w, dy = randn(33, 200), randn(200), randn(33, 200)
    _, rstd = K.forward(x, w)
    first, second = K.backward(dy, x, w, rstd), K.backward(dy, x, w, rstd)
    assert all(torch.equal(p, q) for p, q in zip(first, second))


# ---------------------------------------------------------------------------------- empty and bad
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64), (3, 0)])
def test_empty_input_returns_empty(shape):
    x = torch.zeros(shape, device=DEV, requires_grad=True)
    w = randn(shape[-1]).requires_grad_()
    y = K.rms_norm(x, w)
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape and torch.equal(w.grad, torch.zeros_like(w))


def test_bad_input_is_a_clear_error():
    x, w = randn(4, 64), randn(64)
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\)"):
        K.rms_norm(x, w[:63])
    with pytest.raises(ValueError, match="weight must have shape"):
        K.rms_norm(x, w.view(8, 8))
    with pytest.raises(TypeError, match="x has dtype torch.float64; accepted: float32, float16, bfloat16"):
        K.rms_norm(x.double(), w)
    with pytest.raises(TypeError, match="weight has dtype torch.int32; accepted"):
        K.rms_norm(x, w.int())
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        K.rms_norm(x.tolist(), w)
    with pytest.raises(ValueError, match="one device"):
        K.rms_norm(x, w.to("meta"))
    with pytest.raises(ValueError, match="contiguous along its last dimension"):
        K.rms_norm(randn(64, 4).t(), w)
    with pytest.raises(ValueError, match="weight must be contiguous"):
        K.rms_norm(x, randn(64, 2)[:, 0])
    with pytest.raises(ValueError, match="beyond what this kernel supports"):
        K.rms_norm(torch.empty(1, K.MAX_N + 1, device="meta"), torch.empty(K.MAX_N + 1, device="meta"))
    for eps in (0.0, -1e-6, math.nan, math.inf, None):
        with pytest.raises(ValueError, match="eps must be"):
            K.rms_norm(x, w, eps)
    with pytest.raises(ValueError, match="0-d"):
        K.rms_norm(x[0, 0], w)
    _, rstd = K.forward(x, w)
    with pytest.raises(ValueError, match="dy must be"):
        K.backward(x[:2], x, w, rstd)
    with pytest.raises(ValueError, match="rstd must be"):
        K.backward(x, x, w, rstd[:3])
    with pytest.raises(ValueError, match="rstd must be"):
        K.backward(x, x, w, rstd.double())
    with pytest.raises(ValueError, match="power of two"):
        K.Config(100, 1, 4)
    with pytest.raises(ValueError, match="hidden_size"):
        K.FusedRMSNorm(0)
