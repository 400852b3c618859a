"""helpers.studies.eager_chain: the eager reference chain, the byte counts, the profiling helpers."""
import pytest
import torch
import torch.nn.functional as F

import helpers
from helpers.studies import eager_chain, roofline


def test_eager_chain_is_layernorm_of_gelu():
    x, b, w, lb = torch.randn(5, 33), torch.randn(33), torch.randn(33), torch.randn(33)
    h = F.gelu(x.double() + b.double())
    ref = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
    ref = ref * w.double() + lb.double()
    got = eager_chain.reference64(x, b, w, lb)
    assert got.dtype == torch.float64
    assert torch.allclose(got, ref, atol=1e-12)
    assert torch.allclose(eager_chain.eager_chain(x, b, w, lb).double(), ref, atol=1e-5)
    assert eager_chain.reference64(x, b).shape == x.shape


def test_byte_counts():
    m, n, e = 16384, 4096, 2
    t = m * n * e
    fwd = eager_chain.eager_forward_bytes(m, n, e)
    assert fwd == {"add": 2 * t + n * e, "gelu": 2 * t, "layer_norm": 2 * t + 2 * n * e + 8 * m}
    assert eager_chain.fused_forward_bytes(m, n, e) == 2 * t + 3 * n * e + 8 * m
    # three passes against one: the ratio is 3 up to the parameter vectors and statistics
    assert sum(fwd.values()) / eager_chain.fused_forward_bytes(m, n, e) == pytest.approx(3.0, rel=1e-3)
    bwd = eager_chain.eager_backward_bytes(m, n, e)
    # LayerNorm's backward is two kernels, each reading dy and x: dx, then the weight and bias gradients
    assert bwd["layer_norm_backward"] == 5 * t + 3 * n * e + 16 * m
    assert sum(bwd.values()) == 9 * t + 4 * n * e + 16 * m
    assert eager_chain.fused_backward_bytes(m, n, e) == 3 * t + 8 * m + 5 * n * e
    with pytest.raises(ValueError):
        eager_chain.eager_forward_bytes(4, 0, 2)
    with pytest.raises(ValueError):
        eager_chain.fused_forward_bytes(4, 8, 3)


def test_profile_kernels_lists_the_chain():
    x, b = torch.randn(64, 128, device=helpers.DEVICE), torch.randn(128, device=helpers.DEVICE)
    for reps in (2, 3):  # calls are per run of fn, whatever the number of runs
        rows = eager_chain.profile_kernels(lambda: eager_chain.eager_chain(x, b), reps=reps)
        assert rows and all(r["us_per_call"] > 0 for r in rows)
        gelu = [r for r in rows if "gelu" in r["name"].lower()]
        assert gelu and all(r["calls"] == 1 for r in gelu), gelu  # the chain applies GELU once
        assert any("norm" in r["name"].lower() for r in rows)
        totals = [r["us_per_call"] * r["calls"] for r in rows]
        assert totals == sorted(totals, reverse=True)  # slowest first
    with pytest.raises(ValueError):
        eager_chain.profile_kernels(lambda: None, reps=0)


@pytest.mark.skipif(helpers.HAS_CUDA, reason="the CPU path: its allocator keeps no peak")
def test_peak_extra_memory_is_none_without_a_gpu():
    x = torch.randn(256, 256)
    assert eager_chain.peak_extra_memory(lambda: eager_chain.eager_chain(x, torch.zeros(256))) is None


@pytest.mark.gpu
def test_peak_extra_memory_counts_the_chains_tensors():
    x = torch.randn(256, 256, device=helpers.DEVICE)
    peak = eager_chain.peak_extra_memory(lambda: eager_chain.eager_chain(x, torch.zeros(256, device=helpers.DEVICE)))
    # at least the output; at most the chain's three full-size results (x + b, GELU, LayerNorm) and a little more
    assert x.numel() * 4 <= peak <= 4 * x.numel() * 4


def test_forward_flops_follow_notebook_02s_count():
    flops = eager_chain.eager_forward_flops(3, 5)
    assert flops == {"add": 15, "gelu": 15 * roofline.GELU_FLOPS, "layer_norm": 15 * roofline.LAYERNORM_FLOPS}


@pytest.mark.parametrize("name, op", [
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
     "<c10::BFloat16> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<c10::BFloat16> const&)", "add"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
     "at::native::GeluType)::{lambda()#2}::operator()() const", "gelu"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
     "c10::BFloat16 const*, ...)", "layer_norm"),
    ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<c10::BFloat16, float>(long, float, ...)",
     "layer_norm"),
    ("aten::add", "add"), ("aten::gelu", "gelu"), ("aten::native_layer_norm", "layer_norm"),
    ("aten::empty_like", None), ("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float> >", None),
])
def test_profiled_kernels_map_to_their_op(name, op):
    assert eager_chain.kernel_op(name) == op


def test_profiled_ms_sums_each_ops_kernels_per_call():
    rows = [{"name": "aten::add", "calls": 1, "us_per_call": 100.0},
            {"name": "aten::layer_norm", "calls": 1, "us_per_call": 10.0},
            {"name": "aten::native_layer_norm", "calls": 2, "us_per_call": 45.0},
            {"name": "aten::empty", "calls": 3, "us_per_call": 1.0}]
    assert eager_chain.profiled_ms(rows) == pytest.approx({"add": 0.1, "layer_norm": 0.1})


def test_shares_of_copy_read_a_runs_timed_records(tmp_path):
    from helpers.results import Result

    run = Result(tmp_path / "naive_chain.json", {}, [
        {"what": "op", "pass": "fwd", "op": "add", "gbps": 1500.0, "copy_gbps": 3000.0},
        {"what": "op", "pass": "bwd", "op": "gelu_backward", "gbps": 2700.0, "copy_gbps": 3000.0},
        {"what": "launch overhead", "python_us": 14.0},
        {"what": "prediction", "pass": "fwd", "speedup_bytes": 3.0, "copy_gbps": 3000.0}])
    assert eager_chain.shares_of_copy(run) == {("fwd", "add"): 50.0, ("bwd", "gelu_backward"): 90.0}
    reference = eager_chain.shares_of_copy(helpers.results.reference("naive_chain"))
    assert {("fwd", "add"), ("fwd", "gelu"), ("fwd", "layer_norm")} <= set(reference)
    assert all(0 < share < 200 for share in reference.values())
