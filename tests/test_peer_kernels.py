"""helpers.studies.peer_kernels: every kernel and peer runs, computes what eager PyTorch computes, and is timed
both ways."""
import pytest
import torch

from helpers import bench
from helpers.studies import peer_kernels


@pytest.fixture(scope="module")
def records():
    return peer_kernels.run()


def test_every_kernel_is_timed_forward_and_backward_both_ways(records):
    assert {r["kernel"] for r in records} == set(peer_kernels.KERNELS)
    failed = [r for r in records if r["status"] != "ok"]
    assert not failed, failed
    for kernel in peer_kernels.KERNELS:
        rows = [r for r in records if r["kernel"] == kernel]
        assert {r["timing"] for r in rows} == set(peer_kernels.TIMINGS)
        assert {r["pass"] for r in rows} == ({"fwd"} if kernel == "nf4_gemv" else {"fwd", "fwd+bwd"})
        assert "course" in {r["impl"] for r in rows} and len({r["impl"] for r in rows}) >= 2
        assert all(r["ms"] > 0 for r in rows)


def test_every_implementation_computes_what_eager_pytorch_computes(records):
    tolerance = {"bf16": 0.1, "fp32": 1e-3}  # max abs difference of outputs of unit scale
    wrong = [r for r in records if not r["max_abs_diff"] <= tolerance[r["dtype"]]]
    assert not wrong, wrong


def test_a_wrong_implementation_shows_in_its_difference():
    [case] = peer_kernels.swiglu_cases()
    case.impls["wrong"] = lambda g, u: 1.01 * peer_kernels.eager_swiglu(g, u) + 0.5
    assert peer_kernels._max_abs_diff(case, "wrong") > 0.4 > peer_kernels._max_abs_diff(case, "course")


def test_ratios_pair_the_same_timing_of_the_same_case():
    base = {"kernel": "swiglu", "shape": "s", "dtype": "bf16", "causal": None, "pass": "fwd", "status": "ok"}
    records = [{**base, "impl": "course", "timing": "python", "ms": 2.0},
               {**base, "impl": "liger", "timing": "python", "ms": 3.0},
               {**base, "impl": "liger", "timing": "device", "ms": 1.0},
               {**base, "impl": "course", "timing": "device", "ms": None}]
    key = {k: base[k] for k in ("kernel", "shape", "dtype", "causal", "pass")}
    assert peer_kernels.ratios(records, "liger") == [{**key, "timing": "python", "peer": "liger", "ratio": 1.5}]


def test_ratios_bound_the_ratio_by_both_spreads():
    base = {"kernel": "swiglu", "shape": "s", "dtype": "bf16", "causal": None, "pass": "fwd", "timing": "device"}
    records = [{**base, "impl": "course", "ms": 2.0, "ms_p20": 1.6, "ms_p80": 2.5},
               {**base, "impl": "liger", "ms": 3.0, "ms_p20": 2.5, "ms_p80": 4.0}]
    [row] = peer_kernels.ratios(records, "liger")
    assert row["ratio"] == 1.5 and row["low"] == 1.0 and row["high"] == 2.5


def test_unknown_kernels_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown kernels \\['gemm'\\]"):
        peer_kernels.run(("gemm",))


def test_eager_references_are_the_transformers_formulas():
    x, w = torch.randn(3, 8), torch.rand(8)
    expected = w * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + peer_kernels.EPS)
    assert torch.allclose(peer_kernels.eager_rms_norm(x, w), expected, atol=1e-6)
    q = torch.randn(1, 2, 3, 4)
    zero = torch.zeros(1, 3, 4)
    rq, _ = peer_kernels.eager_rotary(q, q, torch.ones(1, 3, 4), zero)
    assert torch.equal(rq, q)


def test_a_compile_that_falls_back_to_eager_is_recorded_not_timed(monkeypatch):
    compiled = torch.compile(lambda x: 2 * x, dynamic=False)
    sizes = iter(range(1, 1000))  # a new shape every call: a recompilation every call
    x = torch.randn(1000)
    impls = {"course": lambda x: 2 * x, "compile": lambda x: compiled(x[:next(sizes)])}
    case = peer_kernels.Case("swiglu", "s", "fp32", impls, [x], backward=False)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    rows = [r for r in peer_kernels.measure(case) if r["impl"] == "compile"]
    assert rows and all("RecompileLimit" in r["status"] and r["ms"] is None for r in rows)


def test_device_rounds_take_the_implementations_in_turn_and_keep_the_median_round(monkeypatch):
    order = []
    ms = {"course": iter([3.0, 1.0, 2.0]), "eager": iter([5.0, 4.0, 6.0])}

    def fake_time(run, timing):
        impl = run.impl
        order.append((impl, timing))
        t = next(ms[impl]) if timing == "device" else 1.0
        return bench.Timing(t, t - 0.5, t + 0.5, 1, timing)

    monkeypatch.setattr(bench, "STEADY_ROUNDS", 3)
    monkeypatch.setattr(peer_kernels, "_time", fake_time)
    monkeypatch.setattr(peer_kernels, "runner", lambda case, impl, pass_: type("Run", (), {"impl": impl})())
    case = peer_kernels.Case("swiglu", "s", "fp32", {"course": lambda x: x, "eager": lambda x: x},
                             [torch.randn(4)], backward=False)
    rows = {r["impl"]: r for r in peer_kernels.measure(case) if r["timing"] == "device"}
    assert [i for i, timing in order if timing == "device"] == ["course", "eager"] * 3
    assert rows["course"]["ms"] == 2.0 and rows["eager"]["ms"] == 5.0  # the median round
    assert (rows["course"]["ms_p20"], rows["course"]["ms_p80"]) == (0.5, 3.5)  # spread over every round
