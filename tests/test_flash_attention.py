import pytest
import torch

from helpers import HAS_CUDA  # first: without a GPU it switches Triton to its interpreter before triton is imported
import triton
from helpers.kernels import flash_attention as FA
from helpers.kernels.flash_attention import attention_reference, flash_attention, is_dense
from numerics import rel_err

DEVICE = "cuda" if HAS_CUDA else "cpu"
# relative error ||out - ref|| / ||ref|| against float64; fp32 runs only in the CPU interpreter (about 10x its
# largest measured error, 4.5e-7)
TOLERANCE = {torch.float32: 5e-6, torch.float16: 5e-3, torch.bfloat16: 1e-2}
DTYPE = torch.float16 if HAS_CUDA else torch.float32  # of the tests that take one dtype
DTYPES = [pytest.param(torch.float32, marks=pytest.mark.skipif(HAS_CUDA, reason="fp32 is for the interpreter")),
          torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


CASES = [  # B, H, H_kv, S_q, S_k, D, causal
    (1, 2, 2, 37, 37, 64, False),
    (2, 2, 2, 50, 50, 64, True),
    (1, 4, 1, 33, 70, 64, False),   # GQA (4 query heads share 1 K/V head), S_q != S_k
    (1, 4, 2, 21, 45, 64, True),    # GQA, causal aligned bottom-right
    (1, 2, 2, 70, 19, 64, False),   # more queries than keys
    (1, 1, 1, 40, 40, 128, True),
]


def check_against_float64(B, H, HKV, SQ, SK, D, causal, dtype):
    """flash_attention's output and gradients against attention_reference in float64."""
    q = torch.randn(B, H, SQ, D, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(B, HKV, SK, D, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn(B, HKV, SK, D, device=DEVICE, dtype=dtype, requires_grad=True)
    do = torch.randn(B, H, SQ, D, device=DEVICE, dtype=dtype)

    out = flash_attention(q, k, v, causal=causal)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention_reference(q64, k64, v64, causal=causal)
    ref.backward(do.double())

    tol = TOLERANCE[dtype]
    assert rel_err(out, ref) < tol
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert torch.isfinite(got).all(), name
        assert rel_err(got, want) < tol, name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,H,HKV,SQ,SK,D,causal", CASES)
def test_forward_and_backward_match_float64(poisoned, dtype, B, H, HKV, SQ, SK, D, causal):
    check_against_float64(B, H, HKV, SQ, SK, D, causal, dtype)


# The interpreter's one launch shape has square tiles (16 x 16), the GPU's tables do not (128 x 64, 32 x 128): a
# bound computed with BLOCK_N where BLOCK_M belongs (or the reverse) is right only for square tiles. These
# launch shapes, set as the autotuner's only config (one config: no timing, it is taken as it is), have each
# side the longer one; the lengths are off every tile size.
TILES = [(32, 16), (16, 32)]
UNEQUAL_TILE_CASES = [  # B, H, H_kv, S_q, S_k, D, causal
    (1, 2, 2, 45, 45, 64, True),
    (1, 2, 1, 40, 77, 64, True),    # GQA, causal aligned bottom-right, S_k - S_q off every tile size
    (1, 2, 2, 50, 37, 64, False),   # more queries than keys
    (1, 2, 2, 23, 71, 64, False),
]


@pytest.fixture
def tiles(request, monkeypatch):
    """Every FlashAttention kernel launched with the (BLOCK_M, BLOCK_N) of the test's parameter."""
    block_m, block_n = request.param
    configs = [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n})]
    for kernel in (FA._fwd_kernel, FA._bwd_dkdv_kernel, FA._bwd_dq_kernel):
        monkeypatch.setattr(kernel, "configs", configs)
    return block_m, block_n


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"BLOCK_M{t[0]}-BLOCK_N{t[1]}", indirect=True)
@pytest.mark.parametrize("B,H,HKV,SQ,SK,D,causal", UNEQUAL_TILE_CASES)
def test_unequal_tiles_forward_and_backward(poisoned, tiles, B, H, HKV, SQ, SK, D, causal):
    check_against_float64(B, H, HKV, SQ, SK, D, causal, DTYPE)


def test_reference_agrees_with_sdpa_where_conventions_meet():
    q, k, v = (torch.randn(1, 2, 24, 64, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert torch.allclose(attention_reference(q, k, v, causal=causal), want)


def test_empty_query_returns_empty():
    q = torch.randn(1, 2, 0, 64, device=DEVICE, dtype=DTYPE)
    k = torch.randn(1, 2, 5, 64, device=DEVICE, dtype=DTYPE)
    assert flash_attention(q, k, k).shape == (1, 2, 0, 64)


@pytest.mark.parametrize("shapes,kwargs,message", [
    (((2, 8, 64), (2, 8, 64), (2, 8, 64)), {}, "4-D"),
    (((1, 3, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), {}, "multiple"),
    (((1, 2, 8, 96), (1, 2, 8, 96), (1, 2, 8, 96)), {}, "head_dim 96"),
    (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 9, 64)), {}, "same shape"),
    (((2, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), {}, "batch"),
    (((1, 2, 9, 64), (1, 2, 8, 64), (1, 2, 8, 64)), {"causal": True}, "S_q <= S_k"),
    (((1, 2, 4, 64), (1, 2, 0, 64), (1, 2, 0, 64)), {}, "no keys"),
])
def test_bad_shapes_are_named(shapes, kwargs, message):
    q, k, v = (torch.randn(*s, device=DEVICE, dtype=DTYPE) for s in shapes)
    with pytest.raises(ValueError, match=message):
        flash_attention(q, k, v, **kwargs)


def test_bad_dtypes_and_layouts_are_named():
    q = torch.randn(1, 2, 8, 64, device=DEVICE, dtype=DTYPE)
    with pytest.raises(TypeError, match="share a dtype"):
        flash_attention(q, q.to(torch.bfloat16), q)
    with pytest.raises(TypeError, match="int"):
        flash_attention(q.int(), q.int(), q.int())
    with pytest.raises(ValueError, match="contiguous"):
        t = torch.randn(1, 2, 64, 8, device=DEVICE, dtype=DTYPE).transpose(-1, -2)
        flash_attention(t, t, t)


@pytest.mark.parametrize("layout", ["packed_qkv", "bshd"])
def test_strided_inputs_forward_and_backward(layout):
    """A slice of a packed QKV tensor (not dense) and a (B, S, H, D) view (dense, permuted) both work,
    gradients included."""
    dtype = DTYPE
    B, H, S, D = 1, 2, 33, 64
    if layout == "packed_qkv":
        qkv = torch.randn(B, H, S, 3 * D, device=DEVICE, dtype=dtype, requires_grad=True)
        q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]
        leaves = [qkv]
    else:
        bshd = [torch.randn(B, S, H, D, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(3)]
        q, k, v = (t.transpose(1, 2) for t in bshd)
        leaves = bshd
    do = torch.randn(B, H, S, D, device=DEVICE, dtype=dtype)
    out = flash_attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out, leaves, do)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    if layout == "packed_qkv":
        q64, k64, v64 = (leaves64[0][..., i * D:(i + 1) * D] for i in range(3))
    else:
        q64, k64, v64 = (t.transpose(1, 2) for t in leaves64)
    ref = attention_reference(q64, k64, v64, causal=True)
    grads64 = torch.autograd.grad(ref, leaves64, do.double())
    assert rel_err(out, ref) < TOLERANCE[dtype]
    for got, want in zip(grads, grads64):
        assert rel_err(got, want) < TOLERANCE[dtype]


def test_dense_check():
    t = torch.randn(2, 3, 5, 8)
    assert is_dense(t) and is_dense(t.transpose(1, 2)) and is_dense(t[:1])
    assert not is_dense(t[..., :4]) and not is_dense(t[:, :, ::2]) and not is_dense(t[:, :1])


@pytest.mark.parametrize("bwd", range(len(FA.BWD_FALLBACKS)))
def test_fallback_configs_match_float64(poisoned, monkeypatch, bwd):
    """The small configs a card falls back to where none of the tuned ones fits its shared memory (a T4 at D = 128)."""
    monkeypatch.setattr(FA._fwd_kernel, "configs", FA.FWD_FALLBACKS)
    for kernel in (FA._bwd_dkdv_kernel, FA._bwd_dq_kernel):
        monkeypatch.setattr(kernel, "configs", [FA.BWD_FALLBACKS[bwd]])
    check_against_float64(1, 2, 1, 40, 77, 128, True, DTYPE)
