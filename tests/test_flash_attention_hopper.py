"""The Hopper forward (tensor-descriptor tiles) against float64 attention; on a CPU in Triton's interpreter."""
import math

import pytest
import torch

from helpers import HAS_CUDA  # first: without a GPU it switches Triton to its interpreter before triton is imported
from helpers.kernels.flash_attention import attention_reference
from helpers.kernels.candidates.flash_attention_hopper import (HopperConfig, _tma_ready, flash_attention_forward_hopper,
                                                               launch_constants)
from numerics import rel_err

DEVICE = "cuda" if HAS_CUDA else "cpu"
TOLERANCE = {torch.float32: 5e-6, torch.float16: 5e-3, torch.bfloat16: 1e-2}  # as test_flash_attention's
DTYPES = [pytest.param(torch.float32, marks=pytest.mark.skipif(HAS_CUDA, reason="fp32 is for the interpreter")),
          torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]
# The interpreter runs small tiles, each side the longer one in turn (a bound using BLOCK_N for BLOCK_M shows);
# the GPU runs two of the probe's configs. Not a warp-specialised one: on an H100 (Triton 3.6) its launch did not
# return, so the probe runs those in a child process with a time limit.
CONFIGS = ([HopperConfig(128, 64, 4, 3), HopperConfig(128, 128, 8, 2)] if HAS_CUDA
           else [HopperConfig(32, 16, 1, 1), HopperConfig(16, 32, 1, 1)])
CASES = [  # B, H, H_kv, S_q, S_k, D, causal: lengths off every tile size
    (1, 2, 2, 37, 37, 64, False),
    (2, 2, 2, 50, 50, 64, True),
    (1, 4, 1, 33, 70, 64, False),  # GQA, S_q != S_k
    (1, 4, 2, 21, 45, 64, True),  # GQA, causal aligned bottom-right
    (1, 2, 2, 70, 19, 64, False),  # more queries than keys
    (1, 1, 1, 40, 40, 128, True),
    (1, 2, 2, 40, 64, 64, False),  # keys in whole tiles: no masked tail (the loop Triton may warp-specialise)
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}{'ws' * c.warp_specialize}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,H,HKV,SQ,SK,D,causal", CASES)
def test_output_and_log_sum_exp_match_float64(poisoned, config, dtype, B, H, HKV, SQ, SK, D, causal):
    q = torch.randn(B, H, SQ, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(B, HKV, SK, D, device=DEVICE, dtype=dtype) for _ in range(2))
    out, lse = flash_attention_forward_hopper(q, k, v, causal, config=config)
    q64, k64, v64 = (t.double() for t in (q, k, v))
    assert rel_err(out, attention_reference(q64, k64, v64, causal=causal)) < TOLERANCE[dtype]
    scores = q64 @ k64.repeat_interleave(H // HKV, 1).transpose(-1, -2) / math.sqrt(D)
    if causal:
        scores.masked_fill_(torch.ones(SQ, SK, dtype=torch.bool, device=DEVICE).triu_(SK - SQ + 1), -math.inf)
    assert rel_err(lse, torch.logsumexp(scores, -1) / math.log(2)) < TOLERANCE[dtype]


def test_strided_inputs_are_copied_to_tiles_the_copy_engine_can_read():
    q = torch.randn(1, 3, 2, 24, 64, device=DEVICE)[:, :, 0].transpose(1, 2).transpose(1, 2)  # not contiguous
    k, v = (torch.randn(1, 3, 24, 64, device=DEVICE) for _ in range(2))
    dtype = torch.float16 if HAS_CUDA else torch.float32
    out, _ = flash_attention_forward_hopper(*(t.to(dtype) for t in (q, k, v)), config=CONFIGS[0])
    ref = attention_reference(q.double(), k.double(), v.double())
    assert rel_err(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("shapes,error,match", [
    (((1, 2, 8, 96), (1, 2, 8, 96)), ValueError, "head_dim 96 is not supported"),
    (((1, 3, 8, 64), (1, 2, 8, 64)), ValueError, "multiple of key/value heads"),
    (((1, 2, 9, 64), (1, 2, 8, 64)), ValueError, "causal attention needs S_q <= S_k"),
])
def test_bad_inputs_get_the_course_kernels_errors(shapes, error, match):
    (q_shape, kv_shape) = shapes
    q, k, v = torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape)
    with pytest.raises(error, match=match):
        flash_attention_forward_hopper(q, k, v, causal=True)


def test_warp_specialisation_is_asked_for_only_without_a_masked_tail():
    ws = HopperConfig(128, 64, 4, 3, warp_specialize=True)
    assert launch_constants(ws, False, 4096, 128)["WARP_SPECIALIZE"]
    for causal, sk in ((True, 4096), (False, 4000)):
        constants = launch_constants(ws, causal, sk, 128)
        assert constants["MASKED_TAIL"] and not constants["WARP_SPECIALIZE"]


def test_a_misaligned_view_is_copied_to_an_aligned_one():
    t = torch.randn(1 + 2 * 8 * 64, device=DEVICE)[1:].view(1, 2, 8, 64)  # contiguous, 4 bytes off the allocation
    assert t.is_contiguous() and t.data_ptr() % 16
    ready = _tma_ready(t)
    assert ready.data_ptr() % 16 == 0 and torch.equal(ready, t)


def _probe():
    import importlib.util

    from helpers.results import REPO_ROOT
    spec = importlib.util.spec_from_file_location("probe", REPO_ROOT / "scripts" / "flash_attention_hopper_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def test_the_probe_records_every_config_and_its_peers(monkeypatch):
    """scripts/flash_attention_hopper_probe.py's measurement loop at a small shape, cuDNN stood in for by the course
    kernel (the interpreter has no cuDNN): a record per peer and per config, failures recorded, not raised; the
    warp-specialised config (whose code the interpreter cannot tell apart) timed in a child process where the keys
    fill whole tiles, and not asked for where the kernel has a masked loop (causal)."""
    probe = _probe()
    monkeypatch.setattr(probe, "SHAPE", (1, 2, 48, 64))
    monkeypatch.setattr(probe, "CONFIGS", [HopperConfig(32, 16, 1, 1), HopperConfig(32, 16, 1, 1, warp_specialize=True),
                                           HopperConfig(24, 16, 1, 1)])  # a 24-row tile: Triton refuses
    course = probe.implementation("triton")
    monkeypatch.setattr(probe, "implementation", lambda name: course)
    dtype = torch.float16 if HAS_CUDA else torch.float32
    q, k, v = (torch.randn(1, 2, 48, 64, device=DEVICE, dtype=dtype) for _ in range(3))
    records = probe.measure(False, q, k, v)
    assert [r["impl"] for r in records] == ["course", "cudnn", "hopper", "hopper", "hopper"]
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) == 4 and all(r["ms"] > 0 and r["tflops"] > 0 for r in ok)
    assert all(r["max_abs_diff"] < 1e-3 for r in ok if r["impl"] == "hopper")
    assert "warp_specialize_changed_code" in records[3] and records[4]["status"] != "ok"
    causal = probe.measure(True, q, k, v)
    assert causal[3]["status"].startswith("not asked") and "ms" not in causal[3]


def test_the_probe_records_a_child_that_does_not_finish(monkeypatch):
    """A warp-specialised launch that hangs is killed at the time limit and recorded as not finished."""
    import subprocess

    probe = _probe()

    def hang(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(probe.subprocess, "run", hang)
    q = torch.empty(1, 2, 40, 64)
    record = probe.in_child(HopperConfig(128, 64, 4, 2, warp_specialize=True), False, q, timeout_s=7)
    assert record["status"].startswith("not finished in 7 s") and record["warp_specialize"] and "ms" not in record
