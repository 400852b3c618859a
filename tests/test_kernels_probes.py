"""The three probe kernels, run in the Triton interpreter on the CPU (or compiled on a GPU)."""
import math

import pytest
import torch

import helpers
from helpers.kernels.probes import intensity_dial, pointer_chase, stream

DEV = helpers.DEVICE


# --- stream_sum ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n,programs,block,passes", [(10_007, 5, 1024, 3), (3_000, 7, 2048, 2), (1, 3, 16, 1),
                                                    (65_536, 4, 4096, 2)])
def test_stream_sum_reads_every_chunk_passes_times(n, programs, block, passes):
    x = torch.randn(n, device=DEV)
    out = torch.full((programs,), float("nan"), device=DEV)
    stream.stream_sum(x, passes, programs, block, num_warps=4, out=out)
    chunk, n_chunks = stream.plan(n, programs, block)
    x64 = x.double().cpu()
    expected = torch.tensor([passes * x64[(p % n_chunks) * chunk:(p % n_chunks + 1) * chunk].sum().item()
                             for p in range(programs)], dtype=torch.float64)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double().cpu(), expected, rtol=1e-4, atol=1e-3 * passes)
    # wherever the chunks are cut: the distinct chunks cover x once, and programs that share one agree bit for bit
    assert out[:n_chunks].double().sum().item() == pytest.approx(passes * x64.sum().item(), rel=1e-4, abs=1e-3 * passes)
    assert torch.equal(out, out[torch.arange(programs, device=out.device) % n_chunks])


def test_stream_plan_and_bytes():
    assert stream.plan(10_000, 5, 1024) == (2048, 5)
    assert stream.plan(100, 8, 64) == (64, 2)  # fewer chunks than programs: programs share them
    # 8 programs on 2 chunks of 64 and 36 elements: 4 read each, 2 passes, 4 bytes each
    assert stream.bytes_read(100, 8, 64, 2) == (4 * 64 + 4 * 36) * 2 * 4
    with pytest.raises(ValueError, match="n_elements"):
        stream.plan(0, 1, 16)


@pytest.mark.parametrize("kwargs,match", [
    ({"x": torch.zeros(8, dtype=torch.float64)}, "float32"),
    ({"x": torch.zeros(4, 4)}, "1-D"),
    ({"x": torch.zeros(16), "step": 2}, "contiguous"),  # a strided view, made on the device (.to would copy it)
    ({"x": torch.zeros(16), "passes": 0}, "passes"),
    ({"x": torch.zeros(16), "block": 24}, "power of two"),
])
def test_stream_sum_rejects_bad_input(kwargs, match):
    args = {"passes": 1, "programs": 2, "block": 16, **kwargs}
    args["x"] = args["x"].to(DEV)[::args.pop("step", 1)]
    with pytest.raises(ValueError, match=match):
        stream.stream_sum(**args)


# --- pointer chase ------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000])
def test_random_cycle_is_one_cycle_through_every_node(n):
    succ = pointer_chase.random_cycle(n, torch.Generator().manual_seed(n))
    assert sorted(succ.tolist()) == list(range(n))  # a permutation
    node, seen = 0, set()
    for _ in range(n):
        seen.add(node)
        node = int(succ[node])
    assert node == 0 and len(seen) == n  # back at the start after exactly n steps, all visited


@pytest.mark.parametrize("stride", [1, 32])
@pytest.mark.parametrize("n_nodes", [3, 37, 128])
def test_chase_visits_the_whole_cycle(stride, n_nodes):
    chain = pointer_chase.build_chain(n_nodes * stride * 4, stride=stride, device=DEV,
                                      generator=torch.Generator().manual_seed(n_nodes))
    end, trace = pointer_chase.chase(chain, n_nodes, start=0, trace=True)
    visited = trace.cpu().tolist()
    assert sorted(visited) == [j * stride for j in range(n_nodes)]  # every node once
    assert int(end) == 0 and visited[-1] == 0  # and back at the start
    ref, j = [], 0  # the same walk on the CPU
    for _ in range(n_nodes):
        j = int(chain[j])
        ref.append(j)
    assert visited == ref


def test_chase_end_after_more_than_one_lap():
    chain = pointer_chase.build_chain(10 * 128, device=DEV, generator=torch.Generator().manual_seed(1))
    end, _ = pointer_chase.chase(chain, 23, start=0)
    j = 0
    for _ in range(23):
        j = int(chain[j])
    assert int(end) == j and 23 % 10 != 0


@pytest.mark.parametrize("call,match", [
    (lambda: pointer_chase.build_chain(100), "multiple of 128"),
    (lambda: pointer_chase.build_chain(0), "multiple of 128"),
    (lambda: pointer_chase.random_cycle(0), "n_nodes"),
    (lambda: pointer_chase.chase(torch.zeros(8, dtype=torch.int64), 4), "int32"),
    (lambda: pointer_chase.chase(torch.zeros(8, dtype=torch.int32), 0), "steps"),
    (lambda: pointer_chase.chase(torch.zeros(8, dtype=torch.int32), 4, start=8), "start"),
])
def test_chase_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- intensity dial -----------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, 5, 8, 13, 40])
@pytest.mark.parametrize("n", [1, 1000, 4099])
def test_dial_matches_float64(k, n):
    x = torch.randn(n, device=DEV)
    a, b = 0.97 + 0.02 * torch.rand(()).item(), torch.randn(()).item() * 0.01
    out = torch.full_like(x, float("nan"))
    intensity_dial.dial(x, k, a, b, out=out, block=1024, unroll=4)
    ref = intensity_dial.dial_reference(x, k, a, b)
    assert not torch.isnan(out).any()
    err = (out.double().cpu() - ref).norm() / ref.norm()
    assert err < 5e-7 * max(k, 1), err  # about 10x the largest measured (5e-8 a step)


def test_dial_two_dimensional_and_default_out():
    x = torch.randn(33, 17, device=DEV)
    y = intensity_dial.dial(x, 3)
    torch.testing.assert_close(y.double().cpu(), intensity_dial.dial_reference(x, 3), rtol=1e-6, atol=1e-6)


def test_dial_counts():
    assert intensity_dial.flops_and_bytes(1000, 0) == (0, 8000)
    flops, nbytes = intensity_dial.flops_and_bytes(1000, 64)
    assert math.isclose(flops / nbytes, 16.0)


@pytest.mark.parametrize("kwargs,match", [
    ({"x": torch.zeros(8, dtype=torch.float16)}, "float32"),
    ({"x": torch.zeros(16), "step": 2}, "contiguous"),  # a strided view, made on the device
    ({"x": torch.zeros(0)}, "empty"),
    ({"k": -1}, "non-negative"),
    ({"k": 2.0}, "non-negative"),
    ({"block": 100}, "power of two"),
    ({"out": torch.zeros(9)}, "out"),
])
def test_dial_rejects_bad_input(kwargs, match):
    args = {"x": torch.zeros(8), "k": 1, **kwargs}
    args["x"] = args["x"].to(DEV)[::args.pop("step", 1)]
    if "out" in args:
        args["out"] = args["out"].to(DEV)
    with pytest.raises(ValueError, match=match):
        intensity_dial.dial(**args)
