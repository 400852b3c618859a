"""silu(gate) * up for training against PyTorch in float64, forward and backward."""
import pytest
import torch
import torch.nn.functional as F

import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)
from helpers.kernels.swiglu import swiglu

DEV = helpers.DEVICE
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]  # bf16: on a GPU
TOL = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 1000), (2, 5, 2049), (1,)])  # one block's tail, several blocks, one element
def test_matches_float64(shape, dtype, poisoned):
    g = torch.Generator().manual_seed(0)
    gate, up, dy = (4 * torch.randn(shape, generator=g) for _ in range(3))
    gate, up = (t.to(DEV, dtype).requires_grad_() for t in (gate, up))
    y = swiglu(gate, up)
    g64, u64 = (t.detach().double().requires_grad_() for t in (gate, up))
    ref = F.silu(g64) * u64
    assert y.dtype == dtype
    assert (y.double() - ref).abs().max() <= TOL[dtype] * ref.abs().max()
    y.backward(dy.to(DEV, dtype))
    ref.backward(dy.to(DEV, dtype).double())
    for ours, want in ((gate.grad, g64.grad), (up.grad, u64.grad)):
        assert ours.dtype == dtype
        assert (ours.double() - want).abs().max() <= TOL[dtype] * want.abs().max()


def test_rounds_like_pytorch():
    """silu rounded to fp16, then the product rounded: nearly every element the bits PyTorch gives (the GPU's
    exp may differ in its last bit, which can flip a rounding), none more than one fp16 step apart."""
    gate, up = (torch.randn(4, 300, generator=torch.Generator().manual_seed(s)).to(DEV, torch.float16) for s in (1, 2))
    ours, ref = swiglu(gate, up), F.silu(gate) * up
    assert (ours == ref).float().mean().item() > 0.99
    torch.testing.assert_close(ours, ref, rtol=2 ** -10, atol=0.0)


def test_non_contiguous_and_empty():
    gate, up = torch.randn(6, 8, device=DEV).t(), torch.randn(6, 8, device=DEV).t()
    torch.testing.assert_close(swiglu(gate, up), F.silu(gate) * up)
    assert swiglu(torch.empty(0, 3, device=DEV), torch.empty(0, 3, device=DEV)).shape == (0, 3)


def test_bad_input_is_a_clear_error():
    x = torch.randn(3, 4, device=DEV)
    with pytest.raises(ValueError, match="one shape"):
        swiglu(x, x[:2])
    with pytest.raises(TypeError, match="one dtype"):
        swiglu(x, x.half())
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        swiglu(x.tolist(), x)
