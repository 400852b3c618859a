import pytest

from helpers import datasheets, results
from helpers.finetune import analysis, step_model
from helpers.llama import models

H200, A100, ADA = datasheets.by_name("H200"), datasheets.by_name("A100 40GB SXM"), datasheets.by_name("RTX 6000 Ada")


def _train(batch, cap, status, **extra):
    return {"kind": "train", "model": "7b", "batch_size": batch, "cap_gb": cap, "status": status, "lora_r": 16,
            "attn": "eager", "point": f"p{batch}{cap}", "measured": True, **extra}


def _reference(batch, padded, matmul_ms, bandwidth_ms, host_ms):
    return {"what": "train_parts", "model": "7b", "batch_size": batch, "mean_padded_len": padded,
            "matmul ms": matmul_ms, "nf4 dequantise ms": bandwidth_ms, "softmax ms": bandwidth_ms,
            "optimizer ms": bandwidth_ms, "element-wise ms": bandwidth_ms, "host ms": host_ms}


def test_step_model_reproduces_its_references_and_interpolates_between_them():
    refs = [_reference(1, 300.0, 40.0, 20.0, 200.0), _reference(16, 800.0, 1200.0, 300.0, 10.0)]
    model = step_model.StepModel.from_records(refs, H200)
    for r in refs:
        got = model.predict("7b", r["batch_size"], r["mean_padded_len"], H200)
        assert got["matmul"] == pytest.approx(r["matmul ms"] / 1e3) and got["host"] == pytest.approx(r["host ms"] / 1e3)
        assert got["step_s"] == pytest.approx(got["device_s"] + got["host"])
    mid = model.predict("7b", 4, 500.0, H200)
    assert 10e-3 < mid["host"] < 200e-3  # between the references' host times
    hidden = model.predict("7b", 1, 300.0, H200, overlap=True)
    assert hidden["step_s"] == pytest.approx(max(hidden["device_s"], hidden["host"]))
    with pytest.raises(ValueError, match="train_parts"):
        step_model.StepModel.from_records([], H200)


def test_validation_error_and_uncertainty_per_model():
    model = step_model.StepModel.from_records([_reference(4, 500.0, 100.0, 50.0, 20.0)], H200)
    truth = model.predict("7b", 4, 500.0, H200)["step_s"]
    sweep = [_train(4, cap, "ok", step_s=truth * x, mean_padded_len=500.0, checkpointing=True)
             for cap, x in ((40, 1.0), (48, 1.5), (None, 2.0))]
    rows = step_model.validate(model, sweep + [_train(8, 40, "oom")])
    assert len(rows) == 1 and rows[0]["runs"] == 3 and rows[0]["error"] == pytest.approx(1 / 1.5 - 1)
    assert step_model.uncertainty(rows) == {"7b": pytest.approx(1 / 3)}


def test_validation_pairs_each_run_with_its_own_padded_length():
    model = step_model.StepModel.from_records([_reference(4, 500.0, 100.0, 50.0, 20.0)], H200)
    runs = [_train(4, cap, "ok", step_s=model.predict("7b", 4, padded, H200)["step_s"], mean_padded_len=padded,
                   checkpointing=True) for cap, padded in ((40, 300.0), (48, 900.0))]  # other texts, other widths
    rows = step_model.validate(model, runs)
    assert rows[0]["error"] == pytest.approx(0.0, abs=1e-12) and rows[0]["mean_padded_len"] == 600.0


def _streamed(batch, padded, matmul_ms, fraction, host_ms):
    """A reference whose bandwidth parts each stream their bytes at ``fraction`` of the H200's bandwidth."""
    work = step_model.work(models.MODELS["7b"], batch, padded)
    return {**_reference(batch, padded, matmul_ms, 0.0, host_ms),
            **{f"{p} ms": 1e3 * work[p] / (fraction * H200.bandwidth_gbps * 1e9)
               for p, scale in step_model.PARTS.items() if scale == "bandwidth"}}


def test_parts_far_below_the_bandwidth_may_follow_the_clock_instead():
    slow = step_model.StepModel.from_records([_reference(4, 500.0, 100.0, 100.0, 1.0)], H200)
    assert slow.unpaced_parts() == ("nf4 dequantise", "softmax", "optimizer", "element-wise")
    c = step_model.compare(slow, "7b", 4, 500.0, A100, ADA, 0.0)
    assert c["ratio"] > 1 and c["low"] < 1 < c["high"]  # the Ada slower by bandwidth, faster by its clock
    paced = step_model.StepModel.from_records([_streamed(4, 500.0, 100.0, 0.6, 1.0)], H200)
    assert paced.unpaced_parts() == ()


def test_the_card_comparison_follows_the_parts_and_widens_with_the_error():
    bandwidth_heavy = step_model.StepModel.from_records([_streamed(4, 500.0, 20.0, 0.8, 1.0)], H200)
    flops_only = step_model.StepModel.from_records([_reference(4, 500.0, 100.0, 1e-3, 1.0)], H200)
    assert step_model.compare(bandwidth_heavy, "7b", 4, 500.0, A100, ADA, 0.0)["low"] > 1  # Ada slower
    assert step_model.compare(flops_only, "7b", 4, 500.0, A100, ADA, 0.0)["high"] < 1  # Ada faster
    narrow, wide = (step_model.compare(bandwidth_heavy, "7b", 4, 500.0, A100, ADA, e) for e in (0.0, 0.5))
    assert wide["low"] < narrow["low"] <= narrow["high"] < wide["high"]
    assert step_model.PARTS[narrow["deciding"]] == "bandwidth"  # what makes the Ada slower here
    assert step_model.compare(flops_only, "7b", 4, 500.0, A100, ADA, 0.0)["deciding"] == "matmul"
    # the deciding bandwidth part paced by the clock instead: the Ada's 2,505 MHz makes it shorter there
    assert narrow["clock what-if"] < narrow["ratio"]
    assert step_model.tie_share(H200, A100, ADA) == pytest.approx(0.24, abs=0.01)
    with pytest.raises(ValueError, match="no tie"):
        step_model.tie_share(A100, H200, A100)  # H200 has both more FLOP/s and more bandwidth than the A100


def test_decode_projection_holds_the_host_and_scales_the_device():
    host_only = [{"what": "decode_parts", "kv_cache": True, "context": c, "host_s_per_token": 0.02,
                  "device_s_per_token": 0.0} for c in (64, 2048)]
    device_only = [{**r, "host_s_per_token": 0.0, "device_s_per_token": 0.01} for r in host_only]
    assert step_model.decode_lead(host_only, H200, A100, ADA, [64, 1024]) == {
        "bandwidth": [pytest.approx(1.0)] * 2, "clock": [pytest.approx(1.0)] * 2}
    lead = step_model.decode_lead(device_only, H200, A100, ADA, [64])
    assert lead["bandwidth"][0] == pytest.approx(ADA.bandwidth_gbps / A100.bandwidth_gbps)
    assert lead["clock"][0] == pytest.approx(ADA.sms * ADA.boost_mhz / (A100.sms * A100.boost_mhz))  # SMs x boost clock
    assert step_model.decode_seconds(host_only, H200, A100, 100, "bandwidth") == pytest.approx(2.0)
    with pytest.raises(ValueError, match="scaling"):
        step_model.decode_seconds(host_only, H200, A100, 10, "power")
    graphed = [{**r, "what": "graphed_decode_parts"} for r in device_only]  # each decoder reads its own records
    assert step_model.decode_lead(graphed + host_only, H200, A100, ADA, [64], what="graphed_decode_parts") == lead
    with pytest.raises(ValueError, match="graphed_decode_parts records"):
        step_model.decode_seconds(host_only, H200, A100, 10, "clock", what="graphed_decode_parts")
    with pytest.raises(ValueError, match="what must be one of"):
        step_model.decode_seconds(host_only, H200, A100, 10, "clock", what="generate")


def test_generation_timed_without_the_kv_cache_is_left_out():
    cached = {"kind": "generate", "model": "7b", "status": "ok", "new_tokens": 64, "kv_cache": True}
    records = [cached, {**cached, "kv_cache": False}, {k: v for k, v in cached.items() if k != "kv_cache"},
               {**cached, "status": "oom"}]
    assert analysis.generate_runs(records) == [cached]


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


def test_a_cards_points_sit_beside_the_references_twins():
    ref = [{"kind": "train", "model": "7b", "batch_size": 4, "cap_gb": None, "attn": "eager", "status": "ok",
            "point": "train/7b/b=4/cap=none/r=16/eager/len=1024/steps=2+3/no-ckpt", "step_s": 9.0,
            "tokens_per_s": 1.0, "peak_reserved_gb": 56.0},
           {"kind": "train", "model": "7b", "batch_size": 4, "cap_gb": None, "attn": "eager", "status": "ok",
            "point": "train/7b/b=4/cap=none/r=16/eager/len=1024/steps=2+3", "step_s": 0.6, "tokens_per_s": 2000.0,
            "peak_reserved_gb": 9.4}]
    here = [{"kind": "train", "model": "7b", "batch_size": 4, "cap_gb": None, "attn": "eager", "status": "ok",
             "step_s": 0.5, "tokens_per_s": 2400.0, "peak_reserved_gb": None},
            {"kind": "train", "model": "7b", "batch_size": 1, "cap_gb": 40, "attn": "eager", "status": "oom"}]
    table = analysis.beside(here, ref, "here", "ref")
    four = table.loc[("7b", 4, "whole card")]
    assert (four[("here", "step s")], four[("ref", "step s")], four[("ref", "peak GiB")]) == ("0.50", "0.60", "9.4")
    assert four[("here", "peak GiB")] == "-"  # the no-checkpointing twin (56 GiB) is not the one beside it
    one = table.loc[("7b", 1, "40 GiB")]
    assert (one[("here", "step s")], one[("ref", "step s")]) == ("OOM", "-")
    tiny = analysis.beside([{**here[0], "model": "tiny"}], ref, "here", "ref", model="7b")
    assert tiny.loc[("tiny", 4, "whole card")][("ref", "tokens/s")] == "2,000"


def test_split_parts_sums_each_part_and_names_the_longest_matmuls():
    rows = [{"name": "nvjet_sm90_tst_256x8_bf16", "calls": 10, "us_per_call": 100.0},
            {"name": "ampere_sgemm_128x64_tn", "calls": 2, "us_per_call": 1000.0},
            {"name": "kDequantizeBlockwise", "calls": 5, "us_per_call": 20.0},
            {"name": "vectorized_elementwise_kernel", "calls": 3, "us_per_call": 10.0}]
    rows += [{"name": f"cutlass_gemm_{i}", "calls": 1, "us_per_call": float(i)} for i in range(1, 20)]
    parts, fields = step_model.split_parts(rows)
    assert parts["matmul"] == pytest.approx(1.0 + 2.0 + sum(range(1, 20)) / 1e3)
    assert parts["nf4 dequantise"] == pytest.approx(0.1) and parts["element-wise"] == pytest.approx(0.03)
    assert [fields[f"matmul kernel {i}"] for i in (1, 2, 3)] == ["ampere_sgemm_128x64_tn", "nvjet_sm90_tst_256x8_bf16",
                                                                 "cutlass_gemm_19"]
    assert fields["matmul kernel 1, ms a step"] == pytest.approx(2.0)
    assert len(fields) == 2 * step_model.MATMUL_KERNELS_KEPT
    results._check_records([{**parts, **fields}])  # flat: a results file can hold them


def test_a_measured_bandwidth_elasticity_splits_a_part_between_the_bandwidth_and_the_rest():
    bw, clock = A100.bandwidth_gbps / ADA.bandwidth_gbps, (A100.sms * A100.boost_mhz) / (ADA.sms * ADA.boost_mhz)
    assert step_model.elastic_factor(A100, ADA, 1.0, "fixed") == pytest.approx(bw)  # all bandwidth
    assert step_model.elastic_factor(A100, ADA, 0.0, "fixed") == pytest.approx(1.0)  # a latency no card changes
    assert step_model.elastic_factor(A100, ADA, 0.0, "clock") == pytest.approx(clock)
    assert step_model.elastic_factor(A100, ADA, 0.5, "clock") == pytest.approx((bw * clock) ** 0.5)
    assert step_model.elastic_factor(A100, ADA, 1.4, "clock") == pytest.approx(bw)  # clipped to [0, 1]
    with pytest.raises(ValueError, match="rest must be one of"):
        step_model.elastic_factor(A100, ADA, 0.5, "power")


def test_measured_elasticities_replace_the_unpaced_parts_either_or():
    slow = step_model.StepModel.from_records([_reference(4, 500.0, 100.0, 100.0, 1.0)], H200)
    bandwidth = [p for p, scale in step_model.PARTS.items() if scale == "bandwidth"]
    full = step_model.compare(slow, "7b", 4, 500.0, A100, ADA, 0.0, {p: 1.0 for p in bandwidth})
    assert full["low"] == pytest.approx(full["ratio"], rel=1e-3) == pytest.approx(full["high"], rel=1e-3)
    assert full["ratio"] == pytest.approx(step_model.compare(slow, "7b", 4, 500.0, A100, ADA, 0.0)["ratio"])
    half = step_model.compare(slow, "7b", 4, 500.0, A100, ADA, 0.0, {p: 0.5 for p in bandwidth})
    assert half["low"] < half["ratio"] < full["ratio"]  # the rest fixed (nominal) is the Ada's slow end
    assert half["high"] == pytest.approx(half["ratio"], rel=1e-3)
    host_only = [{"what": "decode_parts", "kv_cache": True, "context": c, "host_s_per_token": 0.0,
                  "device_s_per_token": 0.01} for c in (64, 2048)]
    lead = step_model.decode_lead(host_only, H200, A100, ADA, [64], elasticity=0.25)
    assert set(lead) == set(step_model.REST_SCALINGS)
    assert lead["fixed"][0] == pytest.approx(1 / step_model.elastic_factor(A100, ADA, 0.25, "fixed"))
    with pytest.raises(ValueError, match="scaling must be one of"):
        step_model.decode_seconds(host_only, H200, A100, 10, "bandwidth", elasticity=0.25)


def test_a_replayed_timeline_sets_the_host_beside_the_device():
    """With a recorded step, each card's step is the replay: a step the host paces is a tie on any two cards; a step
    the device paces gives the device's ratio; the host's own error no longer widens the range."""
    from helpers.finetune.launch_replay import Launch, Sync, Timeline
    model = step_model.StepModel.from_records([_streamed(4, 500.0, 100.0, 0.6, 1.0)], H200)
    host_paced = Timeline((Launch(0, 5, 1, "matmul"), Launch(1000, 1005, 1, "element-wise")), (Sync(1001, 1010),))
    device_paced = Timeline((Launch(0, 5, 800, "matmul"), Launch(1, 805, 200, "element-wise")), (Sync(2, 1010),))
    tie = step_model.compare(model, "7b", 4, 500.0, A100, ADA, 0.2, timeline=host_paced)
    assert tie["host"] == "replayed" and tie["ratio"] == pytest.approx(1.0, abs=2e-3)
    assert tie["high"] - tie["low"] < 4e-3  # only the last kernel, after the host's last launch, moves the step
    device = step_model.compare(model, "7b", 4, 500.0, A100, ADA, 0.0, timeline=device_paced)
    on = {card: model.predict("7b", 4, 500.0, card) for card in (H200, A100, ADA)}
    expected = sum((800, 200)[i] * on[ADA][p] / on[H200][p] for i, p in enumerate(("matmul", "element-wise"))) / sum(
        (800, 200)[i] * on[A100][p] / on[H200][p] for i, p in enumerate(("matmul", "element-wise")))
    assert device["ratio"] == pytest.approx(expected, rel=2e-3)  # the launch latency and the last wait, not scaled
    assert step_model.compare(model, "7b", 4, 500.0, A100, ADA, 0.0)["host"] == "added or hidden"
