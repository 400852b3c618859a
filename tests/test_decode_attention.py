"""Attention of one decode step over the live part of the KV cache, against float64 softmax attention."""
import math

import pytest
import torch

import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)
import triton
import triton.language as tl
from helpers.kernels.decode_attention import decode_attention
from numerics import rel_err

DEV = helpers.DEVICE
TOL = {torch.float32: 2e-6,  # fp32: about 10x the largest error measured in the interpreter (2.1e-7)
       torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


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



SPLIT_CASES = [  # (B, H, H_kv, max_len, D, pos, splits): several slices a head
    (1, 4, 4, 100, 64, 37, None),   # two slices, the second past pos
    (2, 8, 2, 300, 32, 299, 3),
    (1, 2, 1, 200, 16, 0, 4),       # three empty slices
    (3, 2, 2, 90, 16, 70, 6),       # more slices than blocks of live positions
]



@triton.jit
def _record_order(COUNTER, ORDER):
    """ORDER[k] = the (flattened) id of the k-th program to run."""
    pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    tl.store(ORDER + tl.atomic_add(COUNTER, 1), pid)


@pytest.mark.skipif(not helpers.INTERPRET, reason="the order is the interpreter's to set; a GPU picks its own")
def test_program_order_runs_the_programs_in_the_order_asked(program_order):
    def run():
        counter, order = torch.zeros(1, dtype=torch.int32), torch.full((12,), -1, dtype=torch.int32)
        _record_order[(3, 4)](counter, order)
        return order.tolist()

    assert run() == list(range(12))
    program_order("reversed")
    assert run() == list(range(11, -1, -1))
    program_order("shuffled")
    shuffled = run()
    assert sorted(shuffled) == list(range(12)) and shuffled != list(range(12))
    program_order("grid")
    assert run() == list(range(12))

@pytest.mark.parametrize("b,h,hkv,max_len,d,pos,splits", SPLIT_CASES)
def test_the_last_slice_to_finish_merges_whatever_the_order(b, h, hkv, max_len, d, pos, splits, program_order,
                                                             poisoned):
    """The interpreter runs a launch's programs in grid order, so the last slice of a head is always the last
    to finish there; on a GPU any slice may be. Run in reverse (the last slice first) and shuffled, the slice
    that takes the last ticket merges every partial: a merge by slice index would read unwritten (NaN)
    partials. Merged in slice order, the result is the same bit for bit in every order."""
    q = torch.randn(b, h, 1, d).to(DEV)
    k_cache, v_cache = (torch.randn(b, hkv, max_len, d).to(DEV) for _ in range(2))
    position = torch.tensor([pos], device=DEV)
    ref = reference(q, k_cache, v_cache, pos)
    program_order("grid")
    in_order = decode_attention(q, k_cache, v_cache, position, splits)
    for order in ("reversed", "shuffled"):
        program_order(order)
        out = decode_attention(q, k_cache, v_cache, position, splits)
        assert rel_err(out, ref) < TOL[torch.float32], order
        assert torch.equal(out, in_order), order

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
    q, kc = torch.randn(1, 4, 1, 16, device=DEV), torch.randn(1, 4, 8, 16, device=DEV)
    pos = torch.tensor([0], device=DEV)
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
