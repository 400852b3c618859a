"""The plain nf4 matrix-vector kernel (rung 1 of notebook 07's ladder) against float64."""
import pytest
import torch

import helpers  # first: sets TRITON_INTERPRET before bitsandbytes imports Triton
import bitsandbytes.functional as BF
from helpers.kernels.teaching import nf4_gemv_simple as S
from helpers.kernels.nf4_format import nf4_operands
from numerics import rel_err

DEV = helpers.DEVICE
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}  # the result's rounding (norm-relative)


def quantize(n, k, nested=True, blocksize=64):
    w = torch.randn(n, k).to(DEV)
    return BF.quantize_4bit(w, blocksize=blocksize, quant_type="nf4", compress_statistics=nested)


def reference(x, packed, state):
    w = BF.dequantize_4bit(packed, state).to("cpu", torch.float64)
    return x.to("cpu", torch.float64) @ w.T


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,n,k,nested", [(1, 37, 192, True), (3, 130, 320, False), (1, 1, 64, True),
                                             (2, 19, 640, True)])
def test_matches_float64(rows, n, k, nested, dtype, poisoned):
    packed, state = quantize(n, k, nested)
    x = torch.randn(rows, k).to(DEV, dtype)
    y = S.nf4_matvec(x, (packed, state))
    assert y.shape == (rows, n) and y.dtype == dtype
    assert rel_err(y, reference(x, packed, state)) < TOL[dtype]


def test_block_scales_are_bitsandbytes_absmax():
    packed, state = quantize(37, 192, nested=True)
    expected = BF.dequantize_blockwise(state.absmax, state.state2) + state.offset
    torch.testing.assert_close(S.block_scales(nf4_operands((packed, state))), expected.float())


def test_one_dimensional_x_and_given_scales(poisoned):
    packed, state = quantize(23, 128)
    ops = nf4_operands((packed, state))
    x = torch.randn(128).to(DEV)
    y = S.nf4_matvec(x, ops, S.block_scales(ops), block_n=8, block_k=64)
    assert y.shape == (23,)
    assert rel_err(y, reference(x[None], packed, state)[0]) < TOL[torch.float32]


def test_bad_input_is_named():
    packed, state = quantize(16, 128)
    with pytest.raises(ValueError, match="K = 128"):
        S.nf4_matvec(torch.randn(1, 64).to(DEV), (packed, state))
    with pytest.raises(TypeError, match="float64"):
        S.nf4_matvec(torch.randn(1, 128, dtype=torch.float64).to(DEV), (packed, state))
    with pytest.raises(ValueError, match="scales"):
        S.nf4_matvec(torch.randn(1, 128).to(DEV), (packed, state), torch.zeros(3).to(DEV))
    with pytest.raises(ValueError, match="block_k"):
        S.nf4_matvec(torch.randn(1, 128).to(DEV), (packed, state), block_k=96)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n,k,block_n,block_k", [(1, 37, 192, 16, 256), (2, 130, 320, 32, 128),
                                                      (1, 19, 640, 16, 1024)])
def test_scales_decoded_in_the_kernel_match_float64(rows, n, k, block_n, block_k, dtype, poisoned):
    """Rung 2 (and rung 3's wider tiles): the 1-byte scale codes read and decoded in the kernel."""
    packed, state = quantize(n, k, nested=True)
    x = torch.randn(rows, k).to(DEV, dtype)
    y = S.nf4_matvec(x, (packed, state), nested_scales=True, block_n=block_n, block_k=block_k)
    assert y.shape == (rows, n) and y.dtype == dtype
    assert rel_err(y, reference(x, packed, state)) < TOL[dtype]


def test_scales_decoded_in_the_kernel_need_nested_statistics():
    packed, state = quantize(16, 128, nested=False)
    with pytest.raises(ValueError, match="nested statistics"):
        S.nf4_matvec(torch.randn(1, 128).to(DEV), (packed, state), nested_scales=True)
    packed, state = quantize(16, 128, nested=True)
    ops = nf4_operands((packed, state))
    with pytest.raises(ValueError, match="give no scales"):
        S.nf4_matvec(torch.randn(1, 128).to(DEV), ops, S.block_scales(ops), nested_scales=True)
