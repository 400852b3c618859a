"""The one-launch nf4 dequantisation against bitsandbytes' own, and the nf4 linear layer's forward and
backward against float64.

A weight may differ from bitsandbytes' by one step of the dtype (its block scale may be formed with a
fused multiply-add here, in two operations there).
"""
import pytest
import torch

import helpers  # first: sets TRITON_INTERPRET before bitsandbytes imports Triton
import bitsandbytes.functional as BF
from helpers.kernels.nf4_dequant import dequant_linear, nf4_dequantize
from helpers.kernels.nf4_format import nf4_operands

DEV = helpers.DEVICE
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
STEP = {torch.float32: 2.0**-22, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}  # a step of the dtype, relative
# relative error (norm) against float64 (fp32: about 10x the largest measured, 2.6e-7)
TOL = {torch.float32: 3e-6, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def quantize(n, k, nested=True, storage=torch.uint8, blocksize=64, seed=0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).to(DEV)
    return BF.quantize_4bit(w, blocksize=blocksize, quant_type="nf4", compress_statistics=nested,
                            quant_storage=storage)


def randn(*shape, dtype=torch.float32, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEV, dtype)


# (N, K, blocksize): packed bytes below and beyond one program's 1,024 (16,384 in the interpreter), N and K off
# any power of two
SHAPES = [(1, 64, 64), (37, 192, 64), (130, 320, 64), (33, 4096, 128), (19, 448, 32)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nested,storage", [(True, torch.uint8), (False, torch.uint8), (True, torch.bfloat16)])
@pytest.mark.parametrize("n,k,blocksize", SHAPES)
def test_dequantize_matches_bitsandbytes(n, k, blocksize, nested, storage, dtype):
    packed, state = quantize(n, k, nested, storage, blocksize)
    ref = BF.dequantize_4bit(packed, state).float()  # fp32, each weight rounded once
    got = nf4_dequantize(nf4_operands((packed, state)), dtype)
    assert got.shape == (n, k) and got.dtype == dtype
    assert torch.allclose(got.float(), ref, rtol=STEP[dtype], atol=0), (got.float() - ref).abs().max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("lead", [(5,), (2, 3), (0,)])
def test_linear_forward_and_backward_against_float64(lead, with_bias, dtype):
    n, k = 37, 192
    packed, state = quantize(n, k)
    w64 = BF.dequantize_4bit(packed, state).to("cpu", torch.float64)
    x = randn(*lead, k, dtype=dtype).requires_grad_()
    bias = randn(n, dtype=dtype, seed=2).requires_grad_() if with_bias else None
    y = dequant_linear(x, nf4_operands((packed, state)), bias)
    assert y.shape == (*lead, n) and y.dtype == dtype
    dy = randn(*lead, n, dtype=dtype, seed=3)
    y.backward(dy)
    x64, dy64 = x.detach().to("cpu", torch.float64), dy.to("cpu", torch.float64)
    y64 = x64 @ w64.T + (bias.detach().to("cpu", torch.float64) if with_bias else 0)
    checks = [(y, y64), (x.grad, dy64 @ w64)] + ([(bias.grad, dy64.reshape(-1, n).sum(0))] if with_bias else [])
    for got, ref in checks:
        got = got.detach().to("cpu", torch.float64)
        assert torch.isfinite(got).all()
        if ref.numel():
            assert (got - ref).norm() <= TOL[dtype] * ref.norm()
        else:
            assert got.shape == ref.shape


def test_bad_input_is_refused_with_a_clear_error():
    ops = nf4_operands(quantize(37, 192))
    with pytest.raises(ValueError, match="K = 192"):
        dequant_linear(randn(4, 128), ops)
    with pytest.raises(TypeError, match="x must be a tensor"):
        dequant_linear(torch.ones(4, 192, dtype=torch.int32, device=DEV), ops)
    with pytest.raises(ValueError, match=r"bias must have shape \(37,\)"):
        dequant_linear(randn(4, 192), ops, randn(36))
    with pytest.raises(ValueError, match="bias must have shape"):
        dequant_linear(randn(4, 192), ops, randn(37, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="nf4_operands"):
        nf4_dequantize(quantize(37, 192))
    with pytest.raises(TypeError, match="dtype must be one of"):
        nf4_dequantize(ops, torch.int8)


@pytest.mark.parametrize("block_bytes", [16, 1024])
def test_every_program_width_decodes_the_same(block_bytes):
    """Narrow programs (many of them, the last one partial) give the default launch's weights exactly."""
    ops = nf4_operands(quantize(37, 320))
    assert torch.equal(nf4_dequantize(ops, torch.float32, block_bytes), nf4_dequantize(ops, torch.float32))
    with pytest.raises(ValueError, match="power of two"):
        nf4_dequantize(ops, torch.float32, 1000)
