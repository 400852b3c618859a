import numpy as np
import pytest

from helpers import specs
from helpers.finetune import analysis

H200, A100, ADA = specs.by_name("H200"), specs.by_name("A100 40GB SXM"), specs.by_name("RTX 6000 Ada")


def _train(batch, cap, status, **extra):
    return {"kind": "train", "model": "7b", "batch_size": batch, "cap_gb": cap, "status": status, "lora_r": 16,
            "attn": "eager", "point": f"p{batch}{cap}", "measured": True, **extra}


def test_fit_recovers_a_known_step_model_and_projects_with_datasheets():
    truth = np.array([1.7, 3.0, 2e-3])
    records = []
    for batch in (1, 2, 4, 8, 16):
        r = _train(batch, None, "ok", mean_padded_len=300 + 37 * batch, checkpointing=True)
        r["step_s"] = float(analysis.step_features(r, H200) @ truth)
        records.append(r)
    fit = analysis.fit_step_model(records, H200)
    assert fit["max_rel_error"] < 1e-6
    assert np.allclose([fit["flops_factor"], fit["bytes_factor"], fit["overhead_s_per_layer_pass"]], truth, rtol=1e-4)
    small = analysis.project_step(fit, records[0], A100)
    assert small["step_s"] == pytest.approx(small["compute_s"] + small["memory_s"] + small["overhead_s"])
    # the same bytes take longer at the Ada's lower bandwidth, the same FLOPs less at its higher rate
    ada = analysis.project_step(fit, records[0], ADA)
    assert ada["memory_s"] > small["memory_s"] and ada["compute_s"] < small["compute_s"]


def test_fit_never_returns_negative_terms():
    rng = np.random.default_rng(0)
    records = []
    for batch in (1, 2, 4):
        r = _train(batch, None, "ok", mean_padded_len=500, checkpointing=True)
        r["step_s"] = 0.5 + 0.01 * rng.random()  # flat: only the overhead explains it
        records.append(r)
    fit = analysis.fit_step_model(records, H200)
    assert min(fit["flops_factor"], fit["bytes_factor"], fit["overhead_s_per_layer_pass"]) >= 0
    with pytest.raises(ValueError, match="at least 2"):
        analysis.fit_step_model(records[:1], H200)


def test_decode_projection_scales_overhead_with_clock_only_when_asked():
    records = [{"kind": "generate", "model": m, "status": "ok", "new_tokens": n, "cap_gb": None, "kv_cache": True,
                "seconds": n * (0.002 * analysis.MODELS[m].num_hidden_layers)}
               for m in ("7b", "13b") for n in (64, 512)]
    fit = analysis.fit_decode_model(records, H200)
    assert fit["overhead_s_per_layer"] == pytest.approx(0.002, rel=0.05)
    plain = analysis.project_decode(fit, records[0], ADA, H200, clock_scaled=False)
    scaled = analysis.project_decode(fit, records[0], ADA, H200, clock_scaled=True)
    assert scaled > plain  # the Ada's 2,505 MHz beats the H200's 1,980 MHz


def test_generation_timed_without_the_kv_cache_is_left_out():
    cached = {"kind": "generate", "model": "7b", "status": "ok", "new_tokens": 64, "kv_cache": True}
    records = [cached, {**cached, "kv_cache": False}, {k: v for k, v in cached.items() if k != "kv_cache"},
               {**cached, "status": "oom"}]
    assert analysis.generate_runs(records) == [cached]
    with pytest.raises(ValueError, match="at least 2"):
        analysis.fit_decode_model(records, H200)


def test_seed_table_first_oom_and_status():
    records = [_train(1, 40, "ok", step_s=0.5, peak_reserved_gb=30.0, context_gb=0.6, gpu_util_pct=90.0),
               _train(2, 40, "oom"), {**_train(4, 40, "oom"), "measured": False},
               _train(1, None, "ok", step_s=0.4, mem_pct=20.0, gpu_util_pct=50.0)]
    table = analysis.seed_table(records, "7b", (None, 40))
    assert list(table.columns) == ["whole card", "40 GB cap"]  # the caps' order, not the records'
    assert table.loc[1, "40 GB cap"] == "0.50 s, mem 76%, util 90%"
    assert table.loc[2, "40 GB cap"] == "OOM" and table.loc[4, "40 GB cap"] == "OOM (smaller batch did)"
    assert table.loc[2, "whole card"] == "-"
    assert analysis.first_oom(records, "7b", 40) == 2 and analysis.first_oom(records, "7b", None) is None
    assert analysis.status(records, "7b", 1, None) == "ok" and analysis.status(records, "7b", 8, 40) is None
