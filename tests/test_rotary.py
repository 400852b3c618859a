"""The training rotary embedding against transformers' apply_rotary_pos_emb in float64, forward and backward."""
import pytest
import torch

import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from helpers.kernels.rotary import rotary

DEV = helpers.DEVICE
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]  # bf16: on a GPU
TOL = {torch.float32: 7e-7,  # fp32: about 10x the largest measured error (6.6e-8)
       torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _tables(b, s, d, dtype, seed=0, general=False):
    """Llama's tables (each half the same angles), or four unrelated halves (``general``)."""
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(b, s, d // 2, generator=g) * 10
    if general:
        return torch.randn(b, s, d, generator=g).to(DEV, dtype), torch.randn(b, s, d, generator=g).to(DEV, dtype)
    return (torch.cat([angles.cos()] * 2, -1).to(DEV, dtype), torch.cat([angles.sin()] * 2, -1).to(DEV, dtype))


def _qk(b, h, hkv, s, d, dtype, seed=1):
    """q, k in transformers' layout: (B, S, H, D) storage seen as (B, H, S, D)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=g).to(DEV, dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, hkv, d, generator=g).to(DEV, dtype).transpose(1, 2).requires_grad_()
    return q, k


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,hkv,s,d,table_batch,general", [
    (2, 4, 2, 7, 64, 1, False),     # grouped k, one table for the batch (a batch stride of 0)
    (1, 3, 3, 5, 128, 1, False),    # an odd head count, Llama-2's head size
    (3, 40, 8, 2, 16, 3, True),     # a table per sequence, unrelated halves
    (1, 40, 40, 3, 128, 1, False),  # Llama-2-13B's heads: more than one block of heads (32 at D = 128)
])
def test_matches_transformers_in_float64(b, h, hkv, s, d, table_batch, general, dtype, poisoned):
    cos, sin = _tables(table_batch, s, d, dtype, general=general)
    q, k = _qk(b, h, hkv, s, d, dtype)
    qo, ko = rotary(q, k, cos, sin)
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    rq, rk = apply_rotary_pos_emb(q64, k64, cos.double(), sin.double())
    assert qo.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    for ours, ref in ((qo, rq), (ko, rk)):
        assert (ours.double() - ref).abs().max() <= TOL[dtype] * ref.abs().max()
    dq, dk = (torch.randn(t.shape, generator=torch.Generator().manual_seed(2)).to(DEV, dtype) for t in (qo, ko))
    (qo * dq).sum().add((ko * dk).sum()).backward()
    (rq * dq.double()).sum().add((rk * dk.double()).sum()).backward()
    for ours, ref in ((q.grad, q64.grad), (k.grad, k64.grad)):
        assert ours.dtype == dtype
        assert (ours.double() - ref).abs().max() <= TOL[dtype] * ref.abs().max()


def test_promotes_like_pytorch_and_handles_empty():
    cos, sin = _tables(1, 3, 16, torch.float32)
    q, k = _qk(1, 2, 2, 3, 16, torch.float16)
    qo, ko = rotary(q, k, cos, sin)
    assert qo.dtype == ko.dtype == torch.float32  # fp16 q times fp32 cos, as in PyTorch
    cos0, sin0 = _tables(1, 0, 16, torch.float32)
    q0, k0 = _qk(1, 2, 2, 0, 16, torch.float32)
    assert rotary(q0, k0, cos0, sin0)[0].shape == (1, 2, 0, 16)


def test_bad_input_is_a_clear_error():
    cos, sin = _tables(1, 3, 16, torch.float32)
    q, k = _qk(1, 2, 2, 3, 16, torch.float32)
    with pytest.raises(ValueError, match=r"\(B, H, S, D\)"):
        rotary(q[0], k, cos, sin)
    with pytest.raises(ValueError, match="k .* must share"):
        rotary(q, k[:, :, :2], cos, sin)
    with pytest.raises(ValueError, match="power of two"):
        rotary(q[..., :12], k[..., :12], cos[..., :12], sin[..., :12])
    with pytest.raises(ValueError, match="cos and sin must both be"):
        rotary(q, k, cos[:, :2], sin[:, :2])
    with pytest.raises(ValueError, match="contiguous"):
        rotary(q.detach().transpose(2, 3).contiguous().transpose(2, 3), k, cos, sin)
    with pytest.raises(TypeError, match="must be one of"):
        rotary(q.detach().long(), k, cos, sin)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        rotary(q, k, cos.tolist(), sin)
