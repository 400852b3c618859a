import time

import pytest
import torch

from helpers import bench


def test_time_fn_measures_a_known_sleep():
    t = bench.time_fn(lambda: time.sleep(0.005), warmup_ms=0, rep_ms=60, device="cpu")
    assert t.timer == "perf_counter"
    assert 4.5 < t.ms < 50
    assert t.ms_p20 <= t.ms <= t.ms_p80
    assert t.reps >= 5


def test_time_fn_counts_calls_within_limits():
    calls = []
    t = bench.time_fn(lambda: calls.append(1), warmup_ms=1, rep_ms=1, min_reps=7, max_reps=9, device="cpu")
    assert 7 <= t.reps <= 9
    assert len(calls) >= t.reps + 1


def test_units():
    t = bench.Timing(ms=2.0, ms_p20=1.9, ms_p80=2.1, reps=10, timer="perf_counter")
    assert t.gbps(4e9) == pytest.approx(2000.0)
    assert t.tflops(2e12) == pytest.approx(1000.0)


@pytest.mark.parametrize("kwargs,err", [
    ({"fn": 3}, TypeError),
    ({"fn": lambda: None, "min_reps": 0}, ValueError),
    ({"fn": lambda: None, "rep_ms": 0}, ValueError),
])
def test_time_fn_rejects_bad_input(kwargs, err):
    with pytest.raises(err):
        bench.time_fn(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_timer_without_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        bench.time_fn(lambda: None, device="cuda")


def test_copy_ceiling_record():
    rec = bench.copy_bandwidth(2**20)
    assert rec["what"] == "copy" and rec["bytes"] == 2**20
    assert rec["gbps"] > 0 and rec["ms"] > 0
    with pytest.raises(ValueError):
        bench.copy_bandwidth(3)


@pytest.mark.parametrize("dtype", ["bf16", "fp32", "tf32"])
def test_matmul_ceiling_record(dtype):
    rec = bench.matmul_tflops(dtype, n=64)
    assert rec == {**rec, "what": "matmul", "dtype": dtype, "n": 64}
    assert rec["tflops"] > 0
    assert torch.get_float32_matmul_precision() == "highest"  # restored


def test_matmul_ceiling_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="dtype"):
        bench.matmul_tflops("int4")


def test_flush_mode_is_checked():
    with pytest.raises(ValueError, match="flush_l2"):
        bench.time_fn(lambda: None, flush_l2="erase")
