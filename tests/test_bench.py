import time

import pytest
import torch

from stand_ins import fixed_timer
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


def precision_noting_timer(ms: float, seen: list):
    """``fixed_timer`` that notes the fp32 matmul precision in force when each timed function has run."""
    return fixed_timer(ms, lambda _: seen.append(torch.get_float32_matmul_precision()))


def test_copy_ceiling_record(monkeypatch):
    rec = bench.copy_bandwidth(2**20)  # timed for real: the record's shape
    assert rec["what"] == "copy" and rec["bytes"] == 2**20 and rec["gbps"] > 0 and rec["ms"] > 0
    monkeypatch.setattr(bench, "time_fn", precision_noting_timer(0.5, []))
    rec = bench.copy_bandwidth(2**20)  # a copy reads and writes each byte: 2 MiB in 0.5 ms
    assert rec["ms"] == 0.5 and rec["gbps"] == pytest.approx(2 * 2**20 / 0.5e-3 / 1e9)
    with pytest.raises(ValueError):
        bench.copy_bandwidth(3)


@pytest.mark.parametrize("dtype", ["bf16", "fp32", "tf32"])
def test_matmul_ceiling_record(dtype, monkeypatch):
    rec = bench.matmul_tflops(dtype, n=64)  # timed for real: the record's shape
    assert rec == {**rec, "what": "matmul", "dtype": dtype, "n": 64}
    assert rec["tflops"] > 0
    seen = []
    monkeypatch.setattr(bench, "time_fn", precision_noting_timer(2.0, seen))
    rec = bench.matmul_tflops(dtype, n=64)  # 2 n^3 FLOP in 2 ms
    assert rec["ms"] == 2.0 and rec["tflops"] == pytest.approx(2 * 64**3 / 2e-3 / 1e12)
    assert seen == ["high" if dtype == "tf32" else "highest"]  # TF32 allowed only while "tf32" is timed
    assert torch.get_float32_matmul_precision() == "highest"  # restored


def test_matmul_ceiling_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="dtype"):
        bench.matmul_tflops("int4")


def test_flush_mode_is_checked():
    with pytest.raises(ValueError, match="flush_l2"):
        bench.time_fn(lambda: None, flush_l2="erase")


@pytest.mark.skipif(bench.HAS_CUDA, reason="the CPU path; the GPU path is the test below")
def test_time_in_graph_runs_every_call_and_times_per_call():
    counts = [0, 0, 0]

    def call(i):
        def run():
            counts[i] += 1
            time.sleep(0.002)
        return run

    t = bench.time_in_graph([call(i) for i in range(3)], reps=4)
    assert counts[0] == counts[1] == counts[2] >= 4
    assert 1.5 < t.ms < 20  # per call, not per stream of three
    with pytest.raises(ValueError, match="non-empty"):
        bench.time_in_graph([])
    with pytest.raises(ValueError, match="reps"):
        bench.time_in_graph([call(0)], reps=0)


@pytest.mark.gpu
def test_time_in_graph_times_device_work_per_call():
    src = [torch.randn(2**26, device="cuda") for _ in range(3)]  # 256 MB each: past any L2
    dst = [torch.empty_like(s) for s in src]
    t = bench.time_in_graph([lambda d=d, s=s: d.copy_(s) for d, s in zip(dst, src)], reps=5)
    gbps = t.gbps(2 * src[0].numel() * 4)
    assert t.timer == "cuda-graph" and 200 < gbps < 10_000  # a copy's bandwidth, per call


def test_median_round_keeps_the_middle_round_and_every_rounds_spread():
    rounds = [bench.Timing(ms, ms - 0.5, ms + 0.5, 2, "cuda-graph") for ms in (3.0, 1.0, 2.0, 4.0)]
    t = bench.median_round(rounds)
    assert (t.ms, t.ms_p20, t.ms_p80, t.reps) == (2.0, 0.5, 4.5, 8)  # the lower of the two middle rounds
    with pytest.raises(ValueError, match="at least one round"):
        bench.median_round([])


def test_steady_state_rounds_take_the_callables_in_turn(monkeypatch):
    order, ms = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}

    def fake(fn):
        name = fn()
        order.append(name)
        t = next(ms[name])
        return bench.Timing(t, t, t, 1, "cuda-graph")

    monkeypatch.setattr(bench, "STEADY_ROUNDS", 3)
    monkeypatch.setattr(bench, "steady_state_time", fake)
    got = bench.steady_state_rounds({"a": lambda: "a", "b": lambda: "b"})
    assert order == ["a", "b"] * 3
    assert (got["a"].ms, got["b"].ms) == (2.0, 5.0)


def test_launch_overhead_counts_microseconds_per_kernel():
    got = bench.launch_overhead(kernels=50, rounds=2)
    assert got["kernels"] == 50 and got["python_us_min"] <= got["python_us"] <= got["python_us_max"]
    assert 0 < got["python_us"] < 1e4
    assert (got["graph_us"] is None) == (not torch.cuda.is_available())
    with pytest.raises(ValueError, match="kernels and rounds"):
        bench.launch_overhead(kernels=0)


def test_host_time_is_the_issuing_time_per_call():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(1e-3)  # 1 ms of host work a call: never less under load

    t = bench.host_time(fn, calls=4, rounds=3)
    assert len(calls) == 1 + 4 * 3 and t.reps == 3 and t.timer == "host"
    assert 1.0 <= t.ms_p20 <= t.ms <= t.ms_p80
    with pytest.raises(ValueError, match="calls and rounds"):
        bench.host_time(fn, calls=0)
    if not bench.HAS_CUDA:
        with pytest.raises(ValueError, match="busy_gpu=True needs a CUDA GPU"):
            bench.host_time(fn, busy_gpu=True)


def test_kernel_table_names_and_roles_are_short_and_readable():
    gelu = ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
            "at::native::GeluType)::{lambda()#2}::operator()() const>(int, float)")
    norm = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>"
            "(int, float, c10::BFloat16 const*)")
    rows = [{"name": gelu, "calls": 2, "us_per_call": 30.0}, {"name": norm, "calls": 1, "us_per_call": 20.0},
            {"name": "_nf4_matmul_kernel", "calls": 4, "us_per_call": 1.0},
            {"name": "nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT", "calls": 1, "us_per_call": 6.0}]
    table = bench.kernel_table(rows, top=3)
    assert list(table["kernel"][:3]) == ["vectorized_elementwise_kernel<...>", "vectorized_layer_norm_kernel<...>",
                                         "_nf4_matmul_kernel"]
    assert list(table["what"][:3]) == ["GELU", "LayerNorm forward", "the course's Triton kernel"]
    assert table["kernel"].iloc[3] == "(1 other kernels)" and table["calls"].iloc[3] == 1
    assert abs(table["% of time"].sum() - 100) < 1e-9 and abs(table["% of time"].iloc[0] - 100 * 60 / 90) < 1e-9
    assert max(len(k) for k in table["kernel"]) <= 48
    assert bench.short_kernel_name("aten::layer_norm") == "aten::layer_norm"
    with pytest.raises(ValueError, match="top"):
        bench.kernel_table(rows, top=0)
