"""Attention of one decode step over the live part of the KV cache, against float64 softmax attention."""
import math

import pytest
import torch

import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)
from helpers.kernels.decode_attention import decode_attention
from numerics import rel_err

DEV = helpers.DEVICE
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference(q, k_cache, v_cache, pos):
    """Softmax attention over positions 0 ... pos in float64 (grouped heads repeated)."""
    group = q.shape[1] // k_cache.shape[1]
    k, v = (c.double().cpu()[:, :, :pos + 1].repeat_interleave(group, 1) for c in (k_cache, v_cache))
    q = q.double().cpu()
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v


CASES = [  # (B, H, H_kv, max_len, D, pos, splits)
    (1, 4, 4, 100, 64, 37, None),   # one head per key/value head, one slice past pos
    (2, 8, 2, 300, 32, 299, 3),     # grouped queries, the last position, uneven slices
    (1, 2, 1, 200, 16, 0, 4),       # only the first position: three empty slices
    (1, 32, 32, 640, 128, 271, None),  # Llama-2 7B's shape mid-generation
    (3, 4, 4, 70, 64, 64, 1),       # one slice, a partial last block
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b,h,hkv,max_len,d,pos,splits", CASES)
def test_matches_float64(b, h, hkv, max_len, d, pos, splits, dtype):
    q = torch.randn(b, h, 1, d).to(DEV, dtype)
    k_cache, v_cache = (torch.randn(b, hkv, max_len, d).to(DEV, dtype) for _ in range(2))
    k_cache[:, :, pos + 1:] = float("nan")  # positions past pos must not be read into the result
    v_cache[:, :, pos + 1:] = float("nan")
    out = decode_attention(q, k_cache, v_cache, torch.tensor([pos], device=DEV), splits)
    assert out.shape == q.shape and out.dtype == dtype
    ref = reference(q, k_cache, v_cache, pos)
    assert rel_err(out, ref) < TOL[dtype]


def test_repeated_calls_reuse_the_slice_counters():
    """Each call leaves its tickets at zero: a run of calls, as a decoder makes, merges every step."""
    k_cache, v_cache = (torch.randn(1, 4, 300, 32).to(DEV) for _ in range(2))
    for pos in (5, 150, 299, 0):
        q = torch.randn(1, 4, 1, 32).to(DEV)
        out = decode_attention(q, k_cache, v_cache, torch.tensor([pos], device=DEV), 4)
        ref = reference(q, k_cache, v_cache, pos)
        assert rel_err(out, ref) < TOL[torch.float32]


def test_a_wider_call_keeps_the_old_counters():
    """More (sequence, key/value head) pairs than the counters hold: a new buffer, the old one kept (a
    captured graph may still use its address), and the wide call right."""
    from helpers.kernels import decode_attention as module

    q = torch.randn(1, 1, 1, 16).to(DEV)
    small = module._tickets(q.device, 1)
    wide = small.numel() + 1
    k_cache, v_cache = (torch.randn(wide, 1, 40, 16).to(DEV) for _ in range(2))
    q = torch.randn(wide, 1, 1, 16).to(DEV)
    out = decode_attention(q, k_cache, v_cache, torch.tensor([39], device=DEV), 2)
    ref = reference(q, k_cache, v_cache, 39)
    assert rel_err(out, ref) < TOL[torch.float32]
    buffers = module._TICKETS[q.device]
    assert any(b is small for b in buffers) and buffers[-1].numel() >= wide and buffers[-1] is not small


def test_bad_input_is_a_clear_error():
    q, kc, pos = torch.randn(1, 4, 1, 16, device=DEV), torch.randn(1, 4, 8, 16, device=DEV), torch.tensor([0], device=DEV)
    with pytest.raises(ValueError, match="k_cache and v_cache"):
        decode_attention(q, kc, kc[:, :2], pos)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        decode_attention(torch.randn(1, 3, 1, 16, device=DEV), kc[:, :2], kc[:, :2], pos)
    with pytest.raises(ValueError, match="power of two"):
        decode_attention(torch.randn(1, 4, 1, 12, device=DEV), kc[..., :12], kc[..., :12], pos)
    with pytest.raises(ValueError, match="int64"):
        decode_attention(q, kc, kc, torch.tensor([0], device=DEV, dtype=torch.int32))
    with pytest.raises(TypeError, match="dtype"):
        decode_attention(q.half(), kc, kc, pos)
    with pytest.raises(ValueError, match="contiguous"):
        decode_attention(q, kc.transpose(2, 3).contiguous().transpose(2, 3), kc, pos)
