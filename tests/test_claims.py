"""helpers.claims: each verdict follows from the records, and flips when the records say otherwise."""
import math
from pathlib import Path

import pytest

from helpers.studies import eager_chain, roofline
from helpers import claims, datasheets, results
from helpers.llama import models
from helpers.finetune import retime, step_model
from helpers.claims import CONFIRMED, PARTLY, REFUTED, UNDECIDED
from helpers.results import Result

H200 = {"gpu": "NVIDIA H200", "scale": "full"}
H200_SPEC = datasheets.by_name("H200")


def loader(files: dict):
    """A stand-in for the committed results: ``{(topic, gpu): records}``."""
    def load(topic, gpu):
        found = files.get((topic, gpu))
        if found is None:
            return None
        provenance, records = found if isinstance(found, tuple) else (H200, found)
        return Result(Path(f"stand-in/{gpu}/{topic}.json"), provenance, records)
    return load


def judge(claim_id: str, files: dict) -> claims.Verdict:
    claim = next(c for c in claims.CLAIMS if c.id == claim_id)
    return claim.judge(loader(files), "h200")


def test_nine_claims_each_with_its_notebooks():
    assert len(claims.CLAIMS) == 9 and len({c.id for c in claims.CLAIMS}) == 9
    assert all(c.notebooks and all(len(n) == 2 for n in c.notebooks) for c in claims.CLAIMS)


def test_committed_results_give_a_verdict_and_a_rule_for_every_claim():
    got = claims.verdicts("h200")
    for claim_id, v in got.items():
        assert v.verdict in (CONFIRMED, REFUTED, PARTLY, UNDECIDED), claim_id
        assert v.rule and (v.verdict != UNDECIDED or v.why), claim_id


def test_every_claim_is_decided_from_the_reference_gpu_as_from_the_h200_where_the_reference_has_not_run_it():
    undecided_for_want_of_a_file = {claim_id: v.why for claim_id, v in claims.verdicts(results.REFERENCE_GPU).items()
                                    if v.verdict == UNDECIDED and v.why.startswith("no results file")}
    assert not undecided_for_want_of_a_file  # two-GPU topics too: "h100-80gb-hbm3x2" falls back to "h200x2"


def test_missing_files_leave_every_results_claim_undecided():
    for c in claims.CLAIMS:
        if c.id != "memory-wall":  # read from the datasheets, not from results
            assert c.judge(loader({}), "h200").verdict == UNDECIDED, c.id


def _chain(copy_gbps, gbps=(1600.0, 3000.0, 2500.0), m=16384, n=4096):
    """naive_chain.json's forward kernels at 16384 x 4096 bf16 (eager_chain.eager_forward_bytes), each at ``gbps``."""
    bytes_ = eager_chain.eager_forward_bytes(m, n, 2)
    return {("naive_chain", "h200"): [{"what": "op", "pass": "fwd", "op": op, "dtype": "bf16", "M": m, "N": n,
                                       "bytes": bytes_[op], "gbps": g, "copy_gbps": copy_gbps}
                                      for op, g in zip(("add", "gelu", "layer_norm"), gbps)]}


def test_chain_memory_bound_flips_with_the_ridge():
    got = judge("chain-memory-bound", _chain(4200.0))  # fp32 ridge 66.9 TFLOP/s / 4.2 TB/s ~ 16 FLOP/byte
    assert got.verdict == CONFIRMED and got.evidence["slowest kernel"] == "add"
    assert judge("chain-memory-bound", _chain(31000.0)).verdict == PARTLY  # ridge 2.16: GELU's 2.25 above it
    assert judge("chain-memory-bound", _chain(1e6)).verdict == REFUTED  # ridge 0.07: every kernel above


def test_chain_memory_bound_is_judged_by_intensity_not_by_percent_of_copy():
    slow = judge("chain-memory-bound", _chain(4200.0, gbps=(100.0, 200.0, 300.0)))  # each under 10% of copy
    assert slow.verdict == CONFIRMED and slow.evidence["slowest kernel"] == "add"
    assert judge("chain-memory-bound", {}).verdict == UNDECIDED
    no_card = {key: (dict(H200, gpu="Some Unknown GPU"), recs) for key, recs in _chain(4200.0).items()}
    assert judge("chain-memory-bound", no_card).verdict == UNDECIDED


def _fused(fwd_x, graph_x, called_x=None, rung1_x=None, scale="full"):
    """Benchmark records with eager at ``*_x`` times the fused kernel's, and (``rung1_x``) a ladder whose rung 1
    (eager's formula) is ``rung1_x`` times faster than eager and rung 2 faster still."""
    recs = []
    for n in (1024, 4096):
        for pass_, timing, x in (("fwd", "events", fwd_x), ("fwd+bwd", "graph", graph_x),
                                 ("fwd+bwd", "events", graph_x if called_x is None else called_x)):
            recs += [{"impl": "eager", "pass": pass_, "timing": timing, "dtype": "bf16", "N": n, "ms": x},
                     {"impl": "triton", "pass": pass_, "timing": timing, "dtype": "bf16", "N": n, "ms": 1.0}]
    files = {("fused_bias_gelu_layernorm", "h200"): ({**H200, "scale": scale}, recs)}
    if rung1_x is not None:
        files["fused_ladder", "h200"] = [
            {"rung": rung, "impl": impl, "dtype": "bf16", "N": n, "ms": ms} for n in (1024, 4096)
            for rung, impl, ms in ((None, "eager", rung1_x), (None, "torch.compile", 2.0),
                                   (1, "plain, library erf", 1.0), (2, "cheaper exact GELU", 0.8))]
    return files


def test_fusion_verdict_in_three_parts():
    assert judge("fusion-3-4x", _fused(3.5, 3.2, rung1_x=3.1)).verdict == CONFIRMED
    assert judge("fusion-3-4x", _fused(3.5, 3.2)).verdict == UNDECIDED  # no ladder: the same FLOPs untested
    assert judge("fusion-3-4x", _fused(3.5, 3.2, rung1_x=2.0)).verdict == PARTLY  # 3x only with another GELU
    assert judge("fusion-3-4x", _fused(3.5, 2.5, rung1_x=3.1)).verdict == PARTLY  # training under 3x
    assert judge("fusion-3-4x", _fused(3.5, 3.2, called_x=1.5, rung1_x=3.1)).verdict == PARTLY  # at Python's pace
    assert judge("fusion-3-4x", _fused(2.0, 2.5, rung1_x=3.1)).verdict == REFUTED
    assert judge("fusion-3-4x", _fused(3.5, 3.2, rung1_x=3.1, scale="smoke")).verdict == UNDECIDED


def test_fusion_parts_each_follow_their_own_numbers():
    def parts(*args, **kwargs):
        files = _fused(*args, **kwargs)
        ladder = files.get(("fused_ladder", "h200"))
        return {k: v.verdict for k, v in claims.fusion_parts(files["fused_bias_gelu_layernorm", "h200"][1],
                                                             ladder).items()}
    assert parts(3.5, 3.2, rung1_x=3.1) == {"forward": CONFIRMED, "forward + backward": CONFIRMED,
                                            "the same FLOPs": CONFIRMED}
    assert parts(2.0, 2.5, called_x=3.5, rung1_x=1.5) == {"forward": REFUTED, "forward + backward": PARTLY,
                                                          "the same FLOPs": REFUTED}
    assert parts(3.5, 2.0, called_x=2.0)["forward + backward"] == REFUTED
    assert parts(3.5, 3.2)["the same FLOPs"] == UNDECIDED
    rule = claims.fusion_parts([], None)["the same FLOPs"].rule
    assert "erf_exp2" in rule and "rung 1" in rule


def _attention(flash_bwd_ms, flash_peak_growth=2, spread=0.0, b1_flash_bwd_ms=None, ours_bwd_ms=None):
    """Race records (B = 16, 8) with standard attention's backward 3 ms, FlashAttention-2's (sdpa_flash)
    ``flash_bwd_ms`` and this course's ``ours_bwd_ms`` (the same by default), each timing +-``spread`` ms at its
    20th/80th percentiles; a memory sweep; with ``b1_flash_bwd_ms`` a B = 1 file too."""
    def timed(impl, b, s, causal, bwd):
        base = {"impl": impl, "B": b, "H": 32, "S": s, "D": 128, "causal": causal, "status": "ok",
                "peak_mem_bytes": None}
        return [{**base, "pass": p, "ms": ms, "ms_p20": ms - spread, "ms_p80": ms + spread}
                for p, ms in (("fwd", 1.0), ("fwd+bwd", 1.0 + bwd))]
    recs = []
    for s, b in ((1024, 16), (2048, 8)):
        for causal in (False, True):
            recs += (timed("naive", b, s, causal, 3.0) + timed("sdpa_flash", b, s, causal, flash_bwd_ms)
                     + timed("triton", b, s, causal, ours_bwd_ms or flash_bwd_ms))
    for k, s in enumerate((1024, 2048, 4096)):
        for impl, peak in (("naive", 4.0 ** k * 1e9), ("triton", flash_peak_growth ** k * 1e7)):
            recs.append({"impl": impl, "pass": "fwd+bwd", "S": s, "B": 1, "H": 32, "D": 128, "causal": False,
                         "status": "ok", "ms": None, "peak_mem_bytes": peak})
    files = {("flash_attention", "h200"): recs}
    if b1_flash_bwd_ms is not None:
        files["flash_backward", "h200"] = timed("naive", 1, 1024, False, 3.0) + timed("triton", 1, 1024, False,
                                                                                      b1_flash_bwd_ms)
    return files


def test_flash_backward_verdict_follows_flashattention2_on_the_race_and_memory():
    assert judge("flash-backward", _attention(2.0)).verdict == CONFIRMED
    assert judge("flash-backward", _attention(4.0)).verdict == REFUTED  # slower everywhere
    assert judge("flash-backward", _attention(2.0, flash_peak_growth=4)).verdict == REFUTED  # an N x N footprint
    # launch-bound timings at B = 1 do not decide, nor does this course's kernel: it is shown beside
    assert judge("flash-backward", _attention(2.0, b1_flash_bwd_ms=4.0)).verdict == CONFIRMED
    beside = judge("flash-backward", _attention(2.0, ours_bwd_ms=6.0))
    assert beside.verdict == CONFIRMED
    assert beside.evidence["standard / this course's backward time (beside it)"] == "0.50-0.50"
    assert judge("flash-backward", _attention(2.9, spread=0.2)).verdict == UNDECIDED  # the bands overlap
    files = _attention(2.0)
    for r in files["flash_attention", "h200"]:
        if r["impl"] == "sdpa_flash" and r["S"] == 2048 and r["pass"] == "fwd+bwd" and r["ms"] is not None:
            r.update(ms=5.0, ms_p20=5.0, ms_p80=5.0)  # slower at one of the two lengths
    got = judge("flash-backward", files)
    assert got.verdict == PARTLY and got.evidence["FlashAttention-2, S = 2048"].startswith("faster 0, slower 1")
    files = _attention(2.0)
    for r in files["flash_attention", "h200"]:
        if r["impl"] == "sdpa_flash" and r["causal"] and r["pass"] == "fwd+bwd":
            r.update(ms=9.0, ms_p20=9.0, ms_p80=9.0)  # causal shapes are not judged: fewer FLOPs there
    assert judge("flash-backward", files).verdict == CONFIRMED
    no_fa2 = {k: [r for r in v if r["impl"] != "sdpa_flash"] for k, v in _attention(2.0).items()}  # e.g. a T4
    assert judge("flash-backward", no_fa2).verdict == UNDECIDED


def test_standard_attention_out_of_memory_is_told_apart_from_not_run():
    files = _attention(2.0)
    sweep = [r for r in files["flash_attention", "h200"] if r["ms"] is None and r["impl"] == "naive"]
    sweep[1].update(status="oom", peak_mem_bytes=None)  # ran at S = 2048 and ran out of memory
    sweep[2].update(status="skipped", peak_mem_bytes=None)  # S = 4096: the plan said it does not fit, never run
    evidence = judge("flash-backward", files).evidence
    assert evidence["standard out of memory at S"] == [2048]
    assert evidence["standard too large for the card (not run) at S"] == [4096]


def test_backward_outcomes_read_the_percentile_bands():
    rows = claims.backward_outcomes(_attention(2.0, spread=0.1)["flash_attention", "h200"])
    assert [r["S"] for r in rows] == [1024, 2048] and all(r["outcome"] == "faster" for r in rows)
    assert rows[0]["standard / flash"] == pytest.approx(1.5)
    assert {r["outcome"] for r in claims.backward_outcomes(_attention(2.9, spread=0.1)["flash_attention",
                                                                                       "h200"])} == {UNDECIDED}


def test_memory_wall_follows_the_flagships_tensor_rate_against_their_bandwidth(monkeypatch):
    verdict = judge("memory-wall", {})
    assert verdict.verdict == CONFIRMED  # V100 -> A100 -> H100: tensor x2.50 then x3.17, bandwidth x1.73 then x2.15
    assert verdict.evidence["V100 SXM2 -> A100 40GB SXM"] == "tensor x2.50, bandwidth x1.73"
    real = datasheets.by_name

    def with_bandwidth(changed):
        def by_name(name):
            row = real(name)
            return row if name not in changed else type(row)(**{**row.__dict__, "bandwidth_gbps": changed[name]})
        return by_name
    monkeypatch.setattr(claims.datasheets, "by_name", with_bandwidth({"A100 40GB SXM": 3000}))  # one step fails
    assert judge("memory-wall", {}).verdict == PARTLY
    monkeypatch.setattr(claims.datasheets, "by_name", with_bandwidth({"H100 SXM": 30000}))  # the span fails
    assert judge("memory-wall", {}).verdict == REFUTED


def _parts(train_bandwidth_ms=None, decode=None, host_ms=10.0, streamed=None, matmul_ms=100.0):
    """Stand-in step parts: each bandwidth part taking ``train_bandwidth_ms``, or (``streamed``) the time its
    bytes take at that fraction of the H200's datasheet bandwidth."""
    recs = []
    if train_bandwidth_ms is not None or streamed is not None:
        for batch, padded in ((1, 300.0), (4, 500.0)):
            work = step_model.work(models.MODELS["7b"], batch, padded)
            parts = ("nf4 dequantise", "softmax", "optimizer", "element-wise")
            if streamed is None:
                ms = {p: train_bandwidth_ms * (batch if p == "element-wise" else 1) for p in parts}
            else:
                ms = {p: 1e3 * work[p] / (streamed * H200_SPEC.bandwidth_gbps * 1e9) for p in parts}
            recs.append({"what": "train_parts", "model": "7b", "batch_size": batch, "mean_padded_len": padded,
                         "matmul ms": matmul_ms * batch, **{f"{p} ms": v for p, v in ms.items()}, "host ms": host_ms})
    for context, device, host in decode or []:
        recs.append({"what": "decode_parts", "kv_cache": True, "context": context, "s_per_token": device + host,
                     "device_s_per_token": device, "host_s_per_token": host})
    return {("step_parts", "h200"): recs}


def _with_sweep(files, off=0.0):
    """``files`` plus a sweep of 7B batches 1, 2, 4 under both caps whose step times are the part model's own
    predictions on the H200, times ``1 + off`` (so the model's error on them is ``off``)."""
    model = step_model.StepModel.from_records(files["step_parts", "h200"], H200_SPEC)
    recs = [{"kind": "train", "model": "7b", "cap_gb": cap, "batch_size": b, "status": "ok", "measured": True,
             "checkpointing": True, "attn": "eager", "lora_r": 16, "point": f"train/7b/{cap}/{b}",
             "mean_padded_len": 400.0, "step_s": (1 + off) * model.predict("7b", b, 400.0, H200_SPEC)["step_s"]}
            for cap in (40, 48) for b in (1, 2, 4)]
    return {**files, ("finetune", "h200"): recs}


def test_a100_small_batches_needs_the_part_model_and_its_validation():
    assert judge("a100-small-batches", {}).verdict == UNDECIDED
    assert judge("a100-small-batches", _parts(train_bandwidth_ms=300.0)).verdict == UNDECIDED  # no sweep: no error


def test_a100_small_batches_flips_with_the_parts_and_the_error():
    # bandwidth parts far below the bandwidth: paced by it or by the SM clock, which favour opposite cards
    slow = judge("a100-small-batches", _with_sweep(_parts(train_bandwidth_ms=300.0)))
    assert slow.verdict == UNDECIDED and "paces it sets the sign" in slow.why
    bandwidth_heavy = _parts(streamed=0.8, matmul_ms=5.0)  # streaming near the bandwidth, few FLOPs
    assert judge("a100-small-batches", _with_sweep(bandwidth_heavy)).verdict == CONFIRMED
    assert judge("a100-small-batches", _with_sweep(_parts(train_bandwidth_ms=0.01))).verdict == REFUTED  # FLOPs
    # host-bound: hidden behind the device or not, both cards wait for the same host: a range that holds 1
    host_bound = _with_sweep(_parts(train_bandwidth_ms=300.0, host_ms=1e5))
    assert judge("a100-small-batches", host_bound).verdict == UNDECIDED
    # a narrow margin: decided when the model meets the sweep, not when it misses it by 38% (steps 1.6x its own)
    narrow = _parts(streamed=0.8, matmul_ms=16.0)
    assert judge("a100-small-batches", _with_sweep(narrow)).verdict == CONFIRMED
    assert judge("a100-small-batches", _with_sweep(narrow, off=0.6)).verdict == UNDECIDED
    assert judge("a100-small-batches", _with_sweep(_parts(streamed=0.8, matmul_ms=8.0), off=0.6)).verdict == PARTLY


def test_a100_small_batches_reads_the_re_timed_steps():
    narrow = _with_sweep(_parts(streamed=0.8, matmul_ms=16.0), off=0.6)  # the sweep's few steps, 60% off the model
    assert judge("a100-small-batches", narrow).verdict == UNDECIDED
    model = step_model.StepModel.from_records(narrow["step_parts", "h200"], H200_SPEC)
    retimed = [{"point": r["point"], "status": "ok", "git_commit": "c" * 40, "measured_at": "2026-12-05T10:00",
                **{k: r.get(k) for k in retime.TIMING_FIELDS}, "timed_steps": 10,
                "step_s": model.predict("7b", r["batch_size"], 400.0, H200_SPEC)["step_s"]}
               for r in narrow["finetune", "h200"]]  # more steps, and the model meets them
    assert judge("a100-small-batches", {**narrow, ("finetune_timing", "h200"): retimed}).verdict == CONFIRMED


def test_ada_generation_verdict_from_the_host_device_split():
    assert judge("ada-generates-faster", {}).verdict == UNDECIDED
    # the Ada ahead if the device's time follows the clock, behind if it follows the bandwidth: undecided
    assert judge("ada-generates-faster", _parts(decode=[(64, 0.01, 0.02), (1024, 0.012, 0.02)])).verdict == UNDECIDED
    uncached = {key: [{**r, "kv_cache": False} for r in recs]
                for key, recs in _parts(decode=[(64, 0.01, 0.02), (1024, 0.012, 0.02)]).items()}
    assert judge("ada-generates-faster", uncached).verdict == UNDECIDED  # timed without the KV cache: no evidence
    files = _parts(decode=[(64, 0.01, 0.02), (1024, 0.012, 0.02)])
    files["step_parts", "h200"] += [{"what": "graphed_decode_parts", "kv_cache": True, "context": c,
                                     "s_per_token": 0.003, "device_s_per_token": 0.003, "host_s_per_token": 0.0}
                                    for c in (64, 2048)]
    v = judge("ada-generates-faster", files)  # the course's decoder is evidence beside the verdict, not its input
    assert v.verdict == UNDECIDED
    ada, a100 = datasheets.by_name("RTX 6000 Ada"), datasheets.by_name("A100 40GB SXM")
    assert v.evidence["course's graphed decoder, Ada over A100, device x bandwidth"].startswith(
        f"64: {ada.bandwidth_gbps / a100.bandwidth_gbps:.2f}")


def test_ada_generation_confirmed_when_the_projection_favours_the_ada(monkeypatch):
    real = datasheets.by_name

    def by_name(name, ada_bandwidth=5000.0):  # an Ada with more bandwidth than the A100: the claim must then hold
        row = real(name)
        return type(row)(**{**row.__dict__, "bandwidth_gbps": ada_bandwidth}) if name == "RTX 6000 Ada" else row
    monkeypatch.setattr(claims.datasheets, "by_name", by_name)
    growing = [(64, 0.01, 0.02), (1024, 0.02, 0.02), (2048, 0.04, 0.02)]
    assert judge("ada-generates-faster", _parts(decode=growing)).verdict == CONFIRMED
    flat = [(64, 0.02, 0.0), (1024, 0.02, 0.0)]
    assert judge("ada-generates-faster", _parts(decode=flat)).verdict == PARTLY


def test_ada_generation_refuted_when_both_scalings_favour_the_a100(monkeypatch):
    real_spec = datasheets.by_name

    def by_name(name):  # an Ada with the A100's clock: slower under either scaling of the device's time
        row = real_spec(name)
        return type(row)(**{**row.__dict__, "boost_mhz": 1000}) if name == "RTX 6000 Ada" else row
    monkeypatch.setattr(claims.datasheets, "by_name", by_name)
    assert judge("ada-generates-faster", _parts(decode=[(64, 0.01, 0.02), (1024, 0.012, 0.02)])).verdict == REFUTED


def _sweep(statuses):
    """Training records of the seed setting: {(model, cap, batch): status}."""
    return {("finetune", "h200"): [{"kind": "train", "model": m, "cap_gb": cap, "batch_size": b, "status": s,
                                    "attn": "eager", "lora_r": 16, "point": f"train/{m}/{cap}/{b}"}
                                   for (m, cap, b), s in statuses.items()]}


def test_7b_oom_verdict_follows_the_first_oom():
    def runs(oom40, oom48):
        return _sweep({("7b", cap, b): ("oom" if first and b >= first else "ok")
                       for cap, first in ((40, oom40), (48, oom48)) for b in (1, 16, 25, 32)})
    assert judge("7b-oom-batch-25", runs(25, None)).verdict == CONFIRMED
    assert judge("7b-oom-batch-25", runs(32, None)).verdict == PARTLY
    assert judge("7b-oom-batch-25", runs(25, 25)).verdict == REFUTED


def test_70b_verdict_follows_the_three_points():
    def runs(b1_40, b1_48, b2_48):
        return _sweep({("70b", 40, 1): b1_40, ("70b", 48, 1): b1_48, ("70b", 48, 2): b2_48})
    assert judge("70b-48gb-batch-1", runs("oom", "ok", "oom")).verdict == CONFIRMED
    assert judge("70b-48gb-batch-1", runs("oom", "ok", "ok")).verdict == PARTLY
    assert judge("70b-48gb-batch-1", runs("ok", "ok", "oom")).verdict == REFUTED
    assert judge("70b-48gb-batch-1", _sweep({("70b", 40, 1): "oom"})).verdict == UNDECIDED


def _fsdp(status, busbw, scale="full"):
    recs = [{"kind": "train", "model": "70b", "strategy": "fsdp", "gpus": 2, "cap_gb": 40, "batch_size": 1,
             "status": status, "tokens_per_s": 300.0},
            {"kind": "allreduce", "busbw_gbps": busbw}]
    return {("fsdp", "h200x2"): ({**H200, "scale": scale}, recs)}


def test_two_gpu_verdict_follows_memory_link_and_scale():
    assert judge("two-a100-nvlink-70b", _fsdp("ok", 300.0)).verdict == CONFIRMED
    assert judge("two-a100-nvlink-70b", _fsdp("ok", 20.0)).verdict == PARTLY
    assert judge("two-a100-nvlink-70b", _fsdp("oom", 300.0)).verdict == REFUTED
    assert judge("two-a100-nvlink-70b", _fsdp("ok", 300.0, scale="smoke")).verdict == UNDECIDED


def test_table_filters_by_notebook_and_rejects_an_unknown_one(capsys):
    t = claims.table(notebook="06", gpu="h200")
    assert len(t) == 4 and all("06" in n for n in t["notebooks"])
    claims.show(notebook="04", gpu="h200")
    out = capsys.readouterr().out
    assert "fusing it gives 3-4x" in out and "rule:" in out
    with pytest.raises(ValueError, match="notebook '09'"):
        claims.table(notebook="09")


def test_the_seed_sweep_never_takes_another_gpus_re_timed_steps():
    sweep = [{"point": "train/7b/b=1", "attn": "eager", "lora_r": 16, "status": "ok", "step_s": 1.0}]
    retimed = [{"point": "train/7b/b=1", "status": "ok", "git_commit": "c" * 40, "measured_at": "2026-12-05T10:00",
                **{k: 0.5 for k in retime.TIMING_FIELDS}, "timed_steps": 10}]

    def falling_back(topic, gpu):  # as claims.committed: a folder without the topic gives another GPU's file
        folder = {"finetune": "h200", "finetune_timing": "h100-80gb-hbm3"}[topic]
        return Result(Path(f"stand-in/{folder}/{topic}.json"), H200, sweep if topic == "finetune" else retimed)

    assert [r["step_s"] for r in claims.seed_sweep(falling_back, "h100-80gb-hbm3")] == [1.0]
    own = loader({("finetune", "h200"): sweep, ("finetune_timing", "h200"): retimed})
    assert [r["step_s"] for r in claims.seed_sweep(own, "h200")] == [0.5]


def test_a100_small_batches_takes_the_parts_of_the_gpu_that_ran_the_sweep():
    files = _with_sweep(_parts(streamed=0.8, matmul_ms=5.0))  # the H200's parts and sweep: confirmed
    files["step_parts", "h100-80gb-hbm3"] = _parts(train_bandwidth_ms=0.01)["step_parts", "h200"]  # refuted alone
    by_gpu = loader(files)

    def falling_back(topic, gpu):  # as claims.committed: the H100 has no sweep, so the H200's stands in
        return by_gpu(topic, gpu) or by_gpu(topic, "h200")

    claim = next(c for c in claims.CLAIMS if c.id == "a100-small-batches")
    assert claim.judge(falling_back, "h100-80gb-hbm3").verdict == CONFIRMED


def test_the_projection_reads_the_measured_elasticities_and_the_transfer_error():
    slow, fast = results.REFERENCE_GPU, results.SECOND_GPU
    files = _with_sweep(_parts(train_bandwidth_ms=300.0))
    files.update({(topic, g): results.load(topic, gpu=g).records for topic in ("ceilings", "device")
                  for g in (slow, fast)})  # the two GPUs' measured copy bandwidths
    assert claims.measured_elasticities(loader(files), claims.STEP_ELASTIC_PARTS) == {}  # no H100 step parts
    files["step_parts", slow] = [{**r, "element-wise ms": 1.2 * r["element-wise ms"]} if r["what"] == "train_parts"
                                 else r for r in files["step_parts", fast]]  # only element-wise slower on the H100
    bw_slow, bw_fast = (roofline.ceiling_values(files["ceilings", g])["copy"] for g in (slow, fast))
    got = claims.measured_elasticities(loader(files), claims.STEP_ELASTIC_PARTS)
    assert got["element-wise"] == pytest.approx(math.log(1.2) / math.log(bw_fast / bw_slow))
    assert got["softmax"] == pytest.approx(0.0)
    files["step_model_validation", slow] = [{"fit_gpu": fast, "model": "7b", "error": e} for e in (-0.3, 0.1)] + [
        {"fit_gpu": slow, "model": "7b", "error": 0.9}]  # another model's test: not this one's error
    assert claims.transfer_errors(loader(files), fast) == {"7b": pytest.approx(0.3)}
    v = judge("a100-small-batches", files)
    assert v.evidence["error on another GPU (H200-built model, H100 steps)"] == "7b 30%"
    assert "element-wise" in v.evidence["bandwidth elasticity, H100 against H200"]
    assert all("+-30%" in x for k, x in v.evidence.items() if k.endswith("Ada / A100 step time"))


def test_a100_small_batches_is_not_partly_true_where_only_the_ada_is_projected_faster(monkeypatch):
    files = _with_sweep(_parts(train_bandwidth_ms=300.0))
    real = step_model.rank

    def rank(*args, **kwargs):  # the Ada faster at batch 1, the other ranges holding 1
        return [{**r, "faster": "RTX 6000 Ada" if r["batch"] == 1 else UNDECIDED} for r in real(*args, **kwargs)]
    monkeypatch.setattr(claims.step_model, "rank", rank)
    v = judge("a100-small-batches", files)
    assert v.verdict == UNDECIDED and "the Ada is projected faster at 7b batch 1;" in v.why


def test_both_readings_of_the_seeds_card_are_projected():
    files = _with_sweep(_parts(streamed=0.8, matmul_ms=5.0, decode=[(64, 0.01, 0.02), (1024, 0.012, 0.02)]))
    a6000, a100 = datasheets.by_name(claims.OTHER_READING), datasheets.by_name("A100 40GB SXM")
    training = judge("a100-small-batches", files).evidence["the other reading, RTX A6000 / A100 step time"]
    assert training.startswith("7b batch 1 ") and "7b batch 4 " in training
    generation = judge("ada-generates-faster", files).evidence
    lead = generation["the other reading, RTX A6000 over A100, device x bandwidth"]
    h200 = H200_SPEC.bandwidth_gbps  # the measured token at context 64: host 0.02 s, device 0.01 s on the H200
    a100_s, a6000_s = (0.02 + 0.01 * h200 / card.bandwidth_gbps for card in (a100, a6000))
    assert float(lead.split(",")[0].split(": ")[1]) == pytest.approx(a100_s / a6000_s, abs=0.01)


def test_memory_verdicts_print_their_margin_in_gib(monkeypatch):
    run = {"kind": "train", "model": "70b", "cap_gb": 48, "batch_size": 2, "status": "ok", "peak_reserved_gb": 44.5,
           "context_gb": 0.5}
    margin = claims.memory_margin([run], "70b", 2, 48)
    a6000 = datasheets.VISIBLE_MEMORY_MIB["RTX A6000"] / 1024
    assert margin.startswith("needs 45.00 GiB") and "+3.00 under the 48 GiB cap" in margin
    assert f"{a6000 - 45.0:+.2f} on the RTX A6000's {a6000:.2f} GiB" in margin
    assert claims.memory_margin([{**run, "status": "oom"}], "70b", 2, 48) is None  # no need known where it failed
    assert "-5.00 on the A100 40GB SXM's 40.00 GiB" in claims.memory_margin([{**run, "cap_gb": 40}], "70b", 2, 40)
    monkeypatch.delitem(datasheets.VISIBLE_MEMORY_MIB, "A100 40GB SXM")
    assert "visible memory not on record" in claims.memory_margin([{**run, "cap_gb": 40}], "70b", 2, 40)
