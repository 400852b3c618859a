import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)

import pytest
import torch

from helpers.llama.decoding import Decoder, torch_rope_cache
from helpers.llama.models import build_model
from helpers.kernels.rope_cache import rope_cache

DEV = helpers.DEVICE
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]  # bf16: on a GPU
TOL = {torch.float32: 7e-7,  # fp32: about 10x the largest measured error (7.2e-8)
       torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _inputs(dtype, b=2, h=4, hkv=2, d=64, max_len=11, pos=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, 1, n * d, generator=g).to(DEV, dtype) for n in (h, hkv, hkv))
    angles = torch.arange(max_len)[:, None] * torch.rand(d // 2, generator=g)[None, :]
    cos = torch.cat([angles.cos()] * 2, dim=1).to(DEV, dtype)
    sin = torch.cat([angles.sin()] * 2, dim=1).to(DEV, dtype)
    pos = torch.tensor([pos], device=DEV)
    caches = [torch.full((b, hkv, max_len, d), 7.0, device=DEV, dtype=dtype) for _ in range(2)]
    return q, k, v, cos, sin, pos, *caches


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [dict(), dict(b=1, h=2, hkv=2, d=128, max_len=5, pos=0), dict(pos=10)])
def test_matches_float64_and_writes_only_the_steps_cache_row(dtype, shape):
    args = _inputs(dtype, **shape)
    ref_args = [t.double() if t.is_floating_point() else t for t in args]
    ref_q = torch_rope_cache(*ref_args)
    q = rope_cache(*args)
    scale = ref_q.abs().max()
    assert (q.double() - ref_q).abs().max() <= TOL[dtype] * scale
    pos = int(args[5])
    for ours, ref in zip(args[6:], ref_args[6:]):
        assert (ours.double()[:, :, pos] - ref[:, :, pos]).abs().max() <= TOL[dtype] * ref[:, :, pos].abs().max()
        others = torch.ones(ours.shape[2], dtype=torch.bool)
        others[pos] = False
        assert torch.all(ours[:, :, others] == 7.0)  # every other position untouched


def test_decoder_with_the_fused_kernel_matches_the_pytorch_ops():
    model, _ = build_model("tiny", DEV, vocab_size=128, seed=0)
    tokens = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(1)).to(DEV)
    plain = Decoder(model.eval(), 16, 2).teacher_forced(tokens)
    fused = Decoder(model, 16, 2, rope=rope_cache).teacher_forced(tokens)
    assert ((fused - plain).abs() / plain.abs().amax(-1, keepdim=True)).max() < 2e-2


@pytest.mark.parametrize("change,error,match", [
    (lambda a: a.__setitem__(6, a[6][:, :, :5]), ValueError, "k_cache and v_cache"),
    (lambda a: a.__setitem__(0, a[0][:, :, :100]), ValueError, "q must be"),
    (lambda a: a.__setitem__(1, a[1][:1]), ValueError, "k must be"),
    (lambda a: a.__setitem__(3, a[3][:4]), ValueError, "cos and sin"),
    (lambda a: a.__setitem__(5, a[5].int()), ValueError, "int64"),
    (lambda a: a.__setitem__(2, a[2].half()), TypeError, "one dtype"),
    (lambda a: a.__setitem__(6, a[6].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "contiguous"),
])
def test_bad_input_is_refused(change, error, match):
    args = list(_inputs(torch.float32))
    change(args)
    with pytest.raises(error, match=match):
        rope_cache(*args)


def test_head_size_must_be_a_power_of_two():
    args = list(_inputs(torch.float32, d=48))
    with pytest.raises(ValueError, match="power of two"):
        rope_cache(*args)
