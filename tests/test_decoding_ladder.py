import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)

import dataclasses

import pandas as pd
import pytest
import torch

from helpers.finetune import kernels_step
from helpers.llama import kernel_set
from helpers.studies import decoding_ladder
from helpers.llama.data import TokenizedData, standin_texts, train_tokenizer
from helpers.llama.models import build_model

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def model():
    model, _ = build_model("tiny", DEV, vocab_size=128, seed=0)
    return model.eval()


def test_the_ladder_times_and_checks_its_rungs(model):
    """The first and the last rung (notebook 07 runs every rung, in CI too)."""
    rungs = (decoding_ladder.VARIANTS[0], decoding_ladder.VARIANTS[-1])
    records = decoding_ladder.ladder(model, "tiny", bytes_per_step=1e6, bandwidth_gbps=100.0, prompt_len=3,
                                  new_tokens=3, eager_new_tokens=2, check_len=5, repeats=2, variants=rungs,
                                  progress=False)
    assert [r["variant"] for r in records] == list(rungs)
    assert [r["new_tokens"] for r in records] == [2, 3]  # the eager stock path on its shorter run
    for r in records:
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["seconds"])
        assert r["roofline_tokens_per_s"] == pytest.approx(100e9 / 1e6)
        rounds = decoding_ladder.round_seconds(r)
        assert len(rounds) == 2 and r["seconds"] == pytest.approx(sum(rounds) / 2)
    assert records[0]["logits_max_rel_error"] is None  # the stock path is the reference
    assert 0 < records[1]["logits_max_rel_error"] and decoding_ladder.logits_ok(records[1])
    assert not decoding_ladder.logits_ok({**records[1], "logits_max_rel_error": 0.5})
    with pytest.raises(ValueError, match="unknown variants"):
        decoding_ladder.ladder(model, "tiny", 1e6, 100.0, variants=("fastest",))


@pytest.mark.parametrize("variant", decoding_ladder.VARIANTS[5:])
def test_a_variant_with_the_course_kernels_uses_them(model, monkeypatch, variant):
    calls = {"nf4": 0, "nf4 with gate": 0, "nf4 group": 0, "norm": 0, "add norm": 0, "attention": 0}

    def counted(name, fn):
        def call(*a, **k):
            calls[name + (" with gate" if k.get("gate") is not None else "")] += 1
            return fn(*a, **k)
        return call

    course = kernel_set.COURSE  # the rungs read the kernel set: count the calls of its parts
    monkeypatch.setattr(kernel_set, "COURSE", dataclasses.replace(
        course, linear=counted("nf4", course.linear), linear_group=counted("nf4 group", course.linear_group),
        norm=counted("norm", course.norm), add_norm=counted("add norm", course.add_norm),
        attention=counted("attention", course.attention)))
    monkeypatch.setattr(kernel_set, "nf4_linear", counted("nf4", kernel_set.nf4_linear))  # in swiglu_linear
    decoding_ladder.decoder(model, variant, 4).step(torch.tensor([5], device=DEV))
    layers = model.config.num_hidden_layers
    norms = 2 * layers + 1
    runs = (calls["norm"] + calls["add norm"]) // norms  # a step on the GPU runs more than once: warm-up, capture
    rung = decoding_ladder.VARIANTS.index(variant)
    fused, attention = rung >= 6, rung >= 7
    assert runs >= 1 and calls == {  # o_proj and down_proj alone; (q, k, v) and (gate, up) grouped
        "nf4": layers * runs * (1 if fused else 2), "nf4 with gate": layers * runs * fused,
        "nf4 group": 2 * layers * runs,
        "norm": runs * (1 if fused else norms), "add norm": (norms - 1) * runs * fused,
        "attention": layers * runs * attention}
    with pytest.raises(ValueError, match="variant"):
        decoding_ladder.decoder(model, "stock generate", 4)


def test_gemv_bandwidth_times_three_implementations():
    records = decoding_ladder.gemv_bandwidth({"small": (40, 128)})
    assert [r["impl"] for r in records] == list(decoding_ladder.GEMV_IMPLS)
    assert all(r["ms"] > 0 and r["gbps"] > 0 for r in records)


@pytest.fixture(scope="module")
def tiny_data():
    """40 stand-in texts, tokenized by a small local tokenizer and cut at 24 tokens."""
    texts = standin_texts(40)
    tok = train_tokenizer(texts, 500)
    ids = [t[:24] for t in tok(texts, add_special_tokens=False)["input_ids"]]
    return TokenizedData(ids, 512, "test", "test", [len(t) for t in texts])


def test_training_step_comparison_records_both_variants(tiny_data):
    data, device = tiny_data, DEV
    runs = {v: kernels_step.train("tiny", v, 2, data, device, steps=3, warmup_steps=1)
            for v in kernels_step.variants(device)}
    (stock, stock_losses, stock_grads), (course, course_losses, course_grads) = runs["stock"], runs["course"]
    assert course["replaced"] == ("attention: course, rms_norm_modules: 5, rotary_modules: 2, swiglu_modules: 2, "
                                  "nf4_modules: 14") and stock["replaced"] == "nothing"
    assert runs["sdpa bf16"][0]["replaced"] == "attention: sdpa_bf16"
    assert all(r[0]["checkpointing"] for r in runs.values())
    assert len(course_losses) == 3 and course_losses == pytest.approx(stock_losses, rel=1e-2)
    assert (course_grads - stock_grads).norm() <= 1e-2 * stock_grads.norm() and stock_grads.norm() > 0
    assert course["final_loss"] == course_losses[-1] and course["tokens_per_s"] > 0
    if kernels_step.GRAPHED in runs:  # a GPU
        graphed, graphed_losses, _ = runs[kernels_step.GRAPHED]
        assert graphed["graphs"] >= 1 and graphed["capture_s"] > 0 and graphed["replaced"] == course["replaced"]
        assert graphed_losses == pytest.approx(stock_losses, rel=1e-2)
    assert kernels_step.category("flash_fwd_kernel") == "attention" and kernels_step.category("foo") == "other"
    assert kernels_step.category("_rms_norm_fwd_kernel") == "RMSNorm"
    assert kernels_step.category("_rotary_kernel") == "rotary"
    assert kernels_step.category("_swiglu_bwd_kernel") == "SwiGLU"
    with pytest.raises(ValueError, match="variant"):
        kernels_step.train("tiny", "fast", 2, data, device, steps=3)


def test_a_reused_build_trains_as_a_new_one(tiny_data):
    data, device = tiny_data, DEV
    fresh = kernels_step.train("tiny", "course", 2, data, device, steps=2, warmup_steps=1, max_len=16)
    built = kernels_step.build("tiny", "course", data, device)
    kernels_step.train("tiny", "course", 3, data, device, steps=2, warmup_steps=1, max_len=16,
                       built=built)  # moves the adapters
    again = kernels_step.train("tiny", "course", 2, data, device, steps=2, warmup_steps=1, max_len=16, built=built)
    assert again[1] == fresh[1] and torch.equal(again[2], fresh[2])  # same losses, same first gradients
    assert again[0]["replaced"] == fresh[0]["replaced"]


def test_warm_up_runs_one_batch_per_tuning_bucket_and_multiple_of_16():
    texts = standin_texts(8)
    data = TokenizedData([[5] * 8] * 8, 128, "test", "test", [len(t) for t in texts])
    model, _ = kernels_step.build("tiny", "stock", data, DEV)  # the buckets are the attention kernel's, not the model's
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def batch(width: int) -> dict:
        ids = torch.randint(3, 128, (2, width))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    # widths 20 and 24 share a class (bucket 32, not a multiple of 16); 32 and 40 open two more
    assert kernels_step.warm_up(model, [batch(w) for w in (20, 24, 32, 40)], DEV) == 3
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad)


def test_step_pacing_splits_the_wall_time(tiny_data, monkeypatch):
    profiled, profile = [], kernels_step.profile_kernels

    def spy(fn, reps):
        profiled.append(reps)
        return profile(fn, reps)
    monkeypatch.setattr(kernels_step, "profile_kernels", spy)
    [r] = kernels_step.pacing_side_by_side("tiny", ["stock"], 2, tiny_data, DEV, steps=2, max_len=32)
    assert profiled == [2]  # the timed steps, each once, under the profiler: its rows are per step
    assert r["wall_ms_min"] <= r["wall_ms"] <= r["wall_ms_max"] and r["rounds"] == 1
    assert r["idle_ms"] == pytest.approx(max(0.0, r["wall_ms"] - r["kernel_ms"]))
    shares = {k: v for k, v in r.items() if k.endswith(" ms")}
    assert shares and sum(shares.values()) == pytest.approx(r["kernel_ms"])
    assert set(shares) <= {f"{name} ms" for name, _ in kernels_step.CATEGORIES} | {"other ms"}
    assert r["kernel_ms"] > 0


def test_kernel_time_per_category_adds_the_profiler_rows():
    rows = [{"name": "_rms_norm_fwd_kernel", "calls": 2, "us_per_call": 500.0},
            {"name": "ampere_bf16_gemm", "calls": 1, "us_per_call": 250.0},
            {"name": "cutlass_80_tensorop", "calls": 4, "us_per_call": 1000.0},
            {"name": "elementwise_add", "calls": 3, "us_per_call": 100.0}]
    assert kernels_step.by_category(rows) == pytest.approx({"RMSNorm": 1.0, "matmul": 4.25, "other": 0.3})


def test_pacing_side_by_side_takes_each_variant_in_turn(tiny_data):
    records = kernels_step.pacing_side_by_side("tiny", ["stock", "sdpa bf16"], 2, tiny_data, DEV, steps=1,
                                               max_len=32, rounds=3)
    assert [r["variant"] for r in records] == ["stock", "sdpa bf16"]
    for r in records:
        assert r["rounds"] == 3 and r["wall_ms_min"] <= r["wall_ms"] <= r["wall_ms_max"]
        assert r["idle_ms"] == pytest.approx(max(0.0, r["wall_ms"] - r["kernel_ms"]))
    with pytest.raises(ValueError, match="each variant once"):
        kernels_step.pacing_side_by_side("tiny", ["stock", "stock"], 2, tiny_data, DEV)


def test_nf4_ladder_checks_and_times_every_rung():
    records = decoding_ladder.nf4_ladder({"small": (40, 256)}, bandwidth_gbps=100.0, reps=1)
    names = [r["impl"] for r in records]
    assert names[0] == "bitsandbytes" and records[0]["rung"] is None
    assert [r["rung"] for r in records[1:]] == [1, 2, 3, 4, 5, 6]
    for r in records:
        assert r["ms"] > 0 and r["rel_err"] < 2e-2, r
        assert r["pct_of_copy"] == pytest.approx(r["gbps"])  # 100 GB/s of copy: % and GB/s coincide


def test_speedup_per_round_pairs_the_rounds():
    slow = {"new_tokens": 2, "round 1 seconds": 2.0, "round 0 seconds": 1.0}
    fast = {"new_tokens": 8, "round 0 seconds": 0.5, "round 1 seconds": 0.5}
    assert decoding_ladder.round_seconds(slow) == [1.0, 2.0]
    assert decoding_ladder.speedup_per_round(pd.Series(fast), pd.Series(slow)) == [8.0, 16.0]  # DataFrame rows too
    assert decoding_ladder.speedup_per_round(fast, slow) == [8.0, 16.0]
    with pytest.raises(ValueError, match="rounds"):
        decoding_ladder.speedup_per_round(fast, {"new_tokens": 2, "round 0 seconds": 1.0})


def test_graphed_decode_parts_times_each_context_and_splits_device_from_host(model):
    records = decoding_ladder.graphed_decode_parts(model, [2, 5], new_tokens=2, rounds=2)
    assert [r["context"] for r in records] == [2, 5]
    for r in records:
        assert r["what"] == "graphed_decode_parts" and r["variant"] == decoding_ladder.VARIANTS[-1] and r["kv_cache"]
        assert r["s_per_token_min"] <= r["s_per_token"] <= r["s_per_token_max"]
        # on a CPU the device is the host: all of it device time
        assert r["device_s_per_token"] == pytest.approx(r["s_per_token"]) and r["host_s_per_token"] == 0.0
    with pytest.raises(ValueError, match="contexts"):
        decoding_ladder.graphed_decode_parts(model, [], rounds=1)
    with pytest.raises(ValueError, match="new_tokens"):
        decoding_ladder.graphed_decode_parts(model, [2], new_tokens=0)
