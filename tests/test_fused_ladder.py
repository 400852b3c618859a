"""The ladder's simple fused forwards (helpers.kernels.teaching.fused_ladder) against float64, in every dtype they
claim, on odd widths; bad input refused with an error that names the problem."""
import pytest
import torch

import helpers
from helpers.studies.eager_chain import reference64
from helpers.kernels.teaching import fused_ladder as L
from numerics import rel_err

DEV = helpers.DEVICE
# relative (norm) error of a result stored in the dtype: a few roundings of that dtype (as the tuned kernel's tests)
TOL = {torch.float32: 1.5e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}
RUNGS = {  # name -> call
    "simple, library erf": lambda *a: L.simple_forward(*a),
    "simple, tuned GELU": lambda *a: L.simple_forward(*a, gelu="auto"),
    "rows=4, 2 warps": lambda *a: L.rows_forward(*a, rows=4, num_warps=2),
    "rows=1": lambda *a: L.rows_forward(*a, rows=1),
}


def inputs(m, n, dtype):
    return (torch.randn(m, n).to(DEV, dtype), *(torch.randn(n).to(DEV, dtype) for _ in range(3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m, n", [(7, 1000), (5, 257), (3, 64), (1, 1)])  # odd widths, a partial row block
@pytest.mark.parametrize("rung", list(RUNGS))
def test_matches_float64(rung, m, n, dtype, poisoned):
    x, b, w, lb = inputs(m, n, dtype)
    y = RUNGS[rung](x, b, w, lb)
    assert y.shape == x.shape and y.dtype == dtype
    assert rel_err(y, reference64(x, b, w, lb)) < TOL[dtype]


def test_rows_of_any_rank_and_empty_input(poisoned):
    x, b, w, lb = inputs(6, 100, torch.float32)
    want = reference64(x, b, w, lb)
    assert rel_err(L.rows_forward(x.view(2, 3, 100), b, w, lb, rows=2).view(6, 100), want) < TOL[torch.float32]
    assert L.simple_forward(x[:0], b, w, lb).shape == (0, 100)


def test_large_values_and_a_constant_row():
    """Wide GELU inputs (the tails where the fast forms and the library erf differ most) and a row whose
    GELU is constant (variance 0: the output is ln_bias, not NaN)."""
    n = 300
    x = torch.linspace(-12, 12, 2 * n).view(2, n).to(DEV)
    b, w, lb = torch.zeros(n, device=DEV), torch.rand(n, device=DEV) + 0.5, torch.randn(n, device=DEV)
    for rung, call in RUNGS.items():
        assert rel_err(call(x, b, w, lb), reference64(x, b, w, lb)) < TOL[torch.float32], rung
    const = torch.full((1, n), -30.0, device=DEV)  # GELU(-30) = 0 everywhere
    for rung, call in RUNGS.items():
        assert torch.allclose(call(const, b, w, lb)[0], lb, atol=1e-6), rung


def test_bad_input_is_refused_with_a_clear_error():
    x, b, w, lb = inputs(4, 64, torch.float32)
    with pytest.raises(ValueError, match=r"bias must have shape \(64,\)"):
        L.simple_forward(x, b[:63], w, lb)
    with pytest.raises(TypeError, match="weight must be a tensor"):
        L.simple_forward(x, b, None, lb)
    with pytest.raises(TypeError, match="dtype"):
        L.rows_forward(x, b, w.half(), lb)
    with pytest.raises(TypeError, match="x must be one of"):
        L.simple_forward(x.double(), b.double(), w.double(), lb.double())
    with pytest.raises(ValueError, match="contiguous"):
        L.simple_forward(torch.randn(64, 4, device=DEV).t(), b, w, lb)
    with pytest.raises(ValueError, match="one device"):
        L.simple_forward(x, b.to("meta"), w, lb)
    wide = torch.zeros(1, L.MAX_N + 1, device=DEV)
    with pytest.raises(ValueError, match="wider than one block"):
        L.simple_forward(wide, *(torch.zeros(L.MAX_N + 1, device=DEV) for _ in range(3)))
    with pytest.raises(ValueError, match="gelu must be"):
        L.simple_forward(x, b, w, lb, gelu="tanh")
    with pytest.raises(ValueError, match="rows must be a power of two"):
        L.rows_forward(x, b, w, lb, rows=3)
    with pytest.raises(ValueError, match="num_warps"):
        L.simple_forward(x, b, w, lb, num_warps=6)
    with pytest.raises(ValueError, match="eps"):
        L.simple_forward(x, b, w, lb, eps=0.0)


def test_rung_one_reads_in_one_screen():
    """The kernel notebook 04 shows first stays at most 40 lines."""
    from helpers.kernels import source

    assert len(source(L.simple_kernel).splitlines()) <= 40
