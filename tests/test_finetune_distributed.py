import math
import os
import subprocess

import pytest
import torch

from helpers import results
from helpers.llama import data
from helpers.finetune import distributed, fsdp_point
from helpers.finetune.distributed import DistSpec

SMOKE = dict(model="tiny", gpus=2, batch_size=1, lora_r=4, max_len=32, warmup_steps=1, timed_steps=2)


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    texts = data.standin_texts(60)
    tok = data.train_tokenizer(texts, 2000)
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    return data.TokenizedData(ids, 32000, "test", "test", [len(t) for t in texts]).save(
        tmp_path_factory.mktemp("data") / "data.json")


@pytest.fixture
def results_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "results"


def _both_ranks_trained(record):
    assert record["status"] == "ok" and record["backend"] == "gloo" and record["checkpointing"] is True
    for rank in (0, 1):
        assert math.isfinite(record[f"loss_rank{rank}"]) and record[f"step_s_rank{rank}"] > 0
        assert record[f"lora_change_rank{rank}"] > 0  # the adapters trained
    # the whole adapter, as each rank sees it after training, is the same on both ranks
    assert record["lora_norm_rank0"] == pytest.approx(record["lora_norm_rank1"], rel=1e-12)
    assert record["lora_change_rank0"] == pytest.approx(record["lora_change_rank1"], rel=1e-12)
    assert record["tokens_per_s"] > 0 and record["timed_steps"] == SMOKE["timed_steps"]
    assert 0 < record["step_s_min"] <= record["step_s"] <= record["step_s_max"]
    assert record["peak_alloc_gb_per_gpu"] == max(record["peak_alloc_gb_rank0"], record["peak_alloc_gb_rank1"])


def test_fsdp_smoke_run_on_two_gloo_processes_shards_and_trains(data_path, results_dir):
    [record] = distributed.launch(DistSpec("train", strategy="fsdp", **SMOKE), data_path, timeout_s=110)
    _both_ranks_trained(record)
    for rank in (0, 1):  # each rank holds half of the model (FSDP pads an odd row count)
        assert record[f"local_model_gb_rank{rank}"] == pytest.approx(record["whole_model_gb"] / 2, rel=0.02)
    saved = distributed.load_records()
    assert saved.path == results_dir / results.gpu_slug(count=2) / "fsdp.json"
    assert [r["point"] for r in saved.records] == [record["point"]]  # written once
    assert {k: v for k, v in saved.records[0].items()} == {k: v for k, v in record.items() if k != "results_file"}
    for field in ("model", "gpus", "cap_gb", "batch_size", "status", "step_s", "tokens_per_s",
                  "peak_alloc_gb_per_gpu", "scaling_efficiency"):
        assert field in record


def test_ddp_on_two_processes_is_scored_against_the_one_process_reference(data_path, results_dir):
    spec = DistSpec("train", strategy="ddp", **SMOKE)
    one = {"kind": "train", "point": "reference", "status": "ok", "gpus": 1, "tokens_per_s": 100.0,
           **{k: getattr(spec, k) for k in ("model", "batch_size", "cap_gb", "lora_r", "attn", "max_len", "grad_ckpt")}}
    distributed.save_records([one])
    [record] = distributed.launch(spec, data_path, timeout_s=110)
    _both_ranks_trained(record)
    assert record["local_model_gb_rank0"] == record["local_model_gb_rank1"] == record["whole_model_gb"]  # copies
    assert record["scaling_efficiency"] == pytest.approx(record["tokens_per_s"] / (2 * 100.0))
    points = [r["point"] for r in distributed.load_records().records]
    assert sorted(points) == sorted(["reference", record["point"]])


def test_a_rank_out_of_memory_ends_the_run_with_an_oom_record(data_path, results_dir):
    [record] = distributed.launch(DistSpec("train", strategy="fsdp", cap_gb=0.012, **SMOKE), data_path,
                                  timeout_s=110)
    assert record["status"] == "oom" and record["oom_stage"] == "train" and "cap" in record["oom_message"]
    assert record["peak_alloc_gb_per_gpu"] > 0.012 and record["tokens_per_s"] is None
    assert distributed.load_records().records[0]["status"] == "oom"


def test_allreduce_probe_sums_correctly_on_gloo(results_dir):
    records = distributed.launch(DistSpec("allreduce", gpus=2, sizes_mb=(0.1, 1), iters=3), timeout_s=60)
    assert [r["size_mb"] for r in records] == [0.1, 1]
    for r in records:
        assert r["sum_correct"] is True and r["time_s"] > 0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # 2 ranks: 2(n-1)/n = 1


def test_rank_batches_split_each_global_batch():
    ids = [[5] * n for n in (3, 9, 4, 12, 7, 2, 6, 8)]
    whole = data.make_batches(ids, 4, 3)
    parts = [fsdp_point.rank_batches(ids, 2, 2, rank, 3, None) for rank in (0, 1)]
    assert parts[0][1] == parts[1][1] == [int(b["attention_mask"].sum()) for b in whole]
    for step, b in enumerate(whole):
        for rank in (0, 1):
            mine = parts[rank][0][step]
            rows = b["attention_mask"][2 * rank:2 * rank + 2]
            assert mine["input_ids"].shape == (2, int(rows.sum(1).max()))  # padded to its own longest
            assert torch.equal(mine["attention_mask"], rows[:, :mine["input_ids"].shape[1]])
    assert parts[0][0][0]["input_ids"].shape[1] == 12  # rank 0's first batch holds the longest text
    single, _ = fsdp_point.rank_batches(ids, 4, 1, 0, 3, None)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(single, whole))


def test_scaling_efficiency_needs_a_matching_one_gpu_reference():
    base = {"kind": "train", "status": "ok", "model": "7b", "batch_size": 4, "cap_gb": None, "lora_r": 16,
            "attn": "sdpa", "max_len": 1024, "grad_ckpt": True}
    recs = distributed.with_scaling([{**base, "point": "a", "gpus": 1, "tokens_per_s": 1000.0},
                                     {**base, "point": "b", "gpus": 2, "tokens_per_s": 1800.0},
                                     {**base, "point": "c", "gpus": 2, "tokens_per_s": 900.0, "batch_size": 8},
                                     {**base, "point": "d", "gpus": 2, "status": "oom", "tokens_per_s": None}])
    assert [r["scaling_efficiency"] for r in recs] == [None, pytest.approx(0.9), None, None]


def test_children_keep_nvlink_multicast_off(monkeypatch, tmp_path):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    env = distributed.child_env()
    assert {k: env[k] for k in distributed.MULTICAST_OFF} == distributed.MULTICAST_OFF
    assert str(results.REPO_ROOT) in env["PYTHONPATH"].split(os.pathsep)
    assert "expandable_segments" not in env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64,expandable_segments:False")
    grown = distributed.child_env(DistSpec("train", "70b", gpus=2, cap_gb=40, expandable_segments=True))
    assert grown["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64,expandable_segments:True"
    assert grown["NCCL_NVLS_ENABLE"] == "0"
    cmd = distributed.command(DistSpec("train", "70b", gpus=2, cap_gb=40), tmp_path / "d.json", tmp_path)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[cmd.index("-m", 2) + 1] == "helpers.finetune.fsdp_point"


@pytest.mark.parametrize("spec,gpus,error,match", [
    (DistSpec("train", gpus=0), None, ValueError, "gpus must be an integer >= 1"),
    (DistSpec("train", gpus=-1), None, ValueError, "gpus must be an integer >= 1"),
    (DistSpec("train", gpus=1.5), None, ValueError, "gpus must be an integer"),
    (DistSpec("train", "70b", gpus=4), 2, ValueError, "asks for 4 GPUs; this machine has 2"),
    (DistSpec("train", "Llama-70B"), None, ValueError, "unknown model 'Llama-70B'"),
    (DistSpec("train", strategy="zero3"), None, ValueError, "strategy must be one of"),
    (DistSpec("train", batch_size=0), None, ValueError, "batch size must be an integer >= 1"),
    (DistSpec("train", cap_gb=-1), None, ValueError, "memory cap must be > 0"),
    (DistSpec("train", "70b", cap_gb=200), 2, ValueError, "larger than this card"),
    (DistSpec("allreduce", sizes_mb=()), None, ValueError, "sizes_mb"),
    (DistSpec("probe"), None, ValueError, "kind must be one of"),
])
def test_bad_input_is_refused_before_any_process_starts(monkeypatch, spec, gpus, error, match):
    monkeypatch.setattr(distributed, "machine_gpus", lambda: (gpus, 141.0 if gpus else None))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(error, match=match):
        distributed.launch(spec, "unused.json")


def test_full_scale_without_gpus_and_training_without_data_are_refused(monkeypatch):
    monkeypatch.setattr(distributed, "HAS_CUDA", False)
    with pytest.raises(RuntimeError, match="needs CUDA GPUs"):
        distributed.check(DistSpec("train", "70b"), scale="full")
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match="needs data_path"):
        distributed.launch(DistSpec("train"))


def test_every_training_run_of_the_full_plan_times_ten_steps_after_warm_up():
    train = [s for s in distributed.full_plan() if s.kind == "train"]
    assert train and all(s.timed_steps >= 10 and s.warmup_steps >= 1 for s in train)


def test_scaling_is_decided_only_from_enough_timed_steps_with_their_spread():
    base = {"kind": "train", "status": "ok", "model": "7b", "batch_size": 4, "cap_gb": None, "lora_r": 16,
            "attn": "eager", "max_len": 1024, "grad_ckpt": True, "strategy": "ddp"}
    one = {**base, "point": "ddp/gpus=1/7b/b=4/steps=2+10", "gpus": 1, "tokens_per_s": 1000.0, "step_s": 1.0,
           "step_s_min": 0.9, "step_s_max": 1.2, "timed_steps": 10}
    two = {**base, "point": "ddp/gpus=2/7b/b=4/steps=2+10", "gpus": 2, "tokens_per_s": 1900.0, "step_s": 1.0,
           "step_s_min": 0.95, "step_s_max": 1.1, "timed_steps": 10}
    [row] = distributed.scaling_spread([one, two])
    assert row["decided"] and row["efficiency"] == pytest.approx(0.95)
    assert row["low"] == pytest.approx(0.95 / 1.1 * 0.9) and row["high"] == pytest.approx(0.95 / 0.95 * 1.2)
    old = [{k: v for k, v in r.items() if k not in ("timed_steps", "step_s_min", "step_s_max")} for r in (one, two)]
    old = [{**r, "point": r["point"].replace("2+10", "1+2")} for r in old]
    [row] = distributed.scaling_spread(old)
    assert not row["decided"] and row["timed_steps"] == 2 and "at least 10" in row["why"]
    assert row["low"] is None
    [row] = distributed.scaling_spread([{k: v for k, v in r.items() if k != "step_s_min"} for r in (one, two)])
    assert not row["decided"] and row["why"] == "no step-time spread recorded"
