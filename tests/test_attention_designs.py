import pytest
import torch

from helpers import HAS_CUDA
from helpers.studies import attention_designs
from helpers.studies.attention_designs import attention_flops, implementation, make_inputs, measure
from stand_ins import fixed_timer


def test_flop_convention():
    fwd = attention_flops(4, 32, 4096, 4096, 128, causal=False)
    assert fwd == 4 * 4 * 32 * 4096 * 4096 * 128
    assert attention_flops(4, 32, 4096, 4096, 128, causal=True) == fwd / 2
    assert attention_flops(1, 1, 8, 8, 64, False, "fwd+bwd") == 3.5 * attention_flops(1, 1, 8, 8, 64, False)
    with pytest.raises(ValueError):
        attention_flops(1, 1, 8, 8, 64, False, "bwd2")


def test_unknown_implementation_is_named():
    with pytest.raises(ValueError, match="known"):
        implementation("xformers")


def test_triton_and_naive_agree():
    dtype = torch.float16 if HAS_CUDA else torch.float32
    q, k, v, _ = make_inputs(1, 2, 40, 64, dtype, requires_grad=False)
    a = implementation("triton")(q, k, v, True)
    b = implementation("naive")(q, k, v, True)
    assert ((a.double() - b.double()).norm() / b.double().norm()).item() < 5e-3


@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
def test_measure_record(pass_, monkeypatch):
    dtype = torch.float16 if HAS_CUDA else torch.float32
    r = measure("naive", 1, 2, 32, 64, False, dtype, pass_, warmup_ms=0, rep_ms=1, min_reps=2)
    assert r["status"] == "ok" and r["ms"] > 0 and r["tflops"] > 0
    assert {k: r[k] for k in ("impl", "pass", "B", "H", "H_kv", "S", "D", "causal")} == \
        {"impl": "naive", "pass": pass_, "B": 1, "H": 2, "H_kv": 2, "S": 32, "D": 64, "causal": False}
    runs = []

    monkeypatch.setattr(attention_designs, "time_fn", fixed_timer(2.0, runs.append))  # the step runs; its time is set
    r = measure("naive", 1, 2, 32, 64, False, dtype, pass_)
    # the forward's two S x S x D products, 2 FLOP a multiply-add: 4 B H S^2 D; the backward's five more: 3.5 x
    flops = 4 * 1 * 2 * 32 * 32 * 64 * (3.5 if pass_ == "fwd+bwd" else 1)
    assert len(runs) == 1 and r["ms"] == 2.0 and r["tflops"] == pytest.approx(flops / 2e-3 / 1e12)


def test_measure_refuses_a_backward_it_cannot_time_alone():
    with pytest.raises(ValueError, match="fwd"):
        measure("naive", 1, 2, 32, 64, False, torch.float32, "bwd")


def test_backward_designs_count_their_matrix_products():
    from helpers.studies.attention_designs import BACKWARD_PRODUCTS, backward_designs, design_matmul_flops
    per_product = 2 * 2 * 3 * 100 * 80 * 64  # 2 S_q S_k D a head, B = 2, H = 3
    assert design_matmul_flops("standard", 2, 3, 100, 80, 64) == 4 * per_product
    assert design_matmul_flops("FlashAttention-2", 2, 3, 100, 80, 64) == 5 * per_product
    assert design_matmul_flops("this course's kernels", 2, 3, 100, 80, 64, "fwd+bwd") == 9 * per_product
    ratios = {r["design"]: (r["bwd FLOPs / standard's"], r["fwd+bwd FLOPs / standard's"]) for r in backward_designs()}
    assert ratios == {"standard": (1.0, 1.0), "FlashAttention-2": (1.25, 7 / 6), "this course's kernels": (1.75, 1.5)}
    with pytest.raises(ValueError, match="known"):
        design_matmul_flops("FlashAttention-3", 1, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="bwd"):
        design_matmul_flops("standard", 1, 1, 1, 1, 1, "fwd")
    # this course's count is the kernels' own: every tl.dot in the two backward kernels is one S x S x D product
    from helpers.kernels import flash_attention as fa, source
    dots = {name: source(kernel).count("tl.dot(") for name, kernel in
            (("dK/dV kernel", fa._bwd_dkdv_kernel), ("dQ kernel", fa._bwd_dq_kernel))}
    listed = BACKWARD_PRODUCTS["this course's kernels"]
    assert dots == {name: sum(p.startswith(name) for p in listed) for name in dots} == {"dK/dV kernel": 4,
                                                                                      "dQ kernel": 3}
