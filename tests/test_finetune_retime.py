import pytest
import torch

from helpers.llama import data
from helpers.finetune import retime, runner, sweep
from helpers.llama.lora import LoraSettings, attach_lora, count_layer_forwards
from helpers.llama.models import build_model
from helpers.finetune.point_spec import PointSpec
from helpers.finetune.timing import run_timed_steps


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    texts = data.standin_texts(60)
    tok = data.train_tokenizer(texts, 2000)
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    path = data.TokenizedData(ids, 32000, "test", "test", [len(t) for t in texts]).save(tmp_path / "data.json")
    return {"data": path, "store": tmp_path / "progress.jsonl"}


def _sweep_records(points, oom=()):
    return [{"kind": p.kind, "point": p.key(), "model": p.model, "batch_size": p.batch_size,
             "status": "oom" if p.batch_size in oom else "ok", "measured": True, "step_s": 9.0,
             "peak_reserved_gb": 1.5, "mean_padded_len": 3.0} for p in points]


def test_a_group_is_timed_over_more_steps_in_one_process(env):
    specs = sweep.plan(["tiny"], [1, 2], [None], generate=False, max_len=32)
    got = []
    retime.time_group(specs, data.TokenizedData.load(env["data"]), torch.device("cpu"), float("inf"), got.append)
    assert [r["point"] for r in got] == [s.key() for s in specs]
    for r in got:
        assert r["status"] == "ok" and r["timed_steps"] == retime.TIMED_STEPS and r["checkpointing"] is True
        assert r["step_s_min"] <= r["step_s"] <= r["step_s_max"] and r["step_s_min"] <= r["step_s_mean"]
        assert r["tokens_per_s"] > 0
        assert r["s_per_padded_token_min"] <= r["s_per_padded_token"] <= r["s_per_padded_token_max"]
        assert 2 <= r["mean_padded_len"] <= 32 and r["measured_at"]
    none = []
    retime.time_group(specs, data.TokenizedData.load(env["data"]), torch.device("cpu"), 0.0, none.append)
    assert none == []  # past the deadline: no point starts


def test_a_group_without_checkpointing_trains_without_it(env):
    specs = sweep.plan(["tiny"], [1], [None], generate=False, max_len=32, grad_ckpt=False)
    got = []
    retime.time_group(specs, data.TokenizedData.load(env["data"]), torch.device("cpu"), float("inf"), got.append)
    assert [(r["status"], r["checkpointing"]) for r in got] == [("ok", False)]


def test_run_timed_steps_trains_in_training_mode(env):
    """A model built for inference (eval mode) would skip checkpointing's recomputation: its steps are not
    the QLoRA step the sweep measures."""
    spec = sweep.plan(["tiny"], [1], [None], generate=False, max_len=32)[0]
    model, _ = build_model(spec.model, torch.device("cpu"), vocab_size=32000, attn=spec.attn)
    model = attach_lora(model, LoraSettings(r=4))
    model.eval()
    batches = data.make_batches(data.TokenizedData.load(env["data"]).token_ids, 1, 2, 32)
    layer_runs = count_layer_forwards(model, lambda: run_timed_steps(model, batches[1:], torch.device("cpu"), 0, None))
    assert model.training and layer_runs == 2  # one forward, one recomputation in the backward


def test_out_of_memory_ends_the_group(env, monkeypatch):
    specs = sweep.plan(["tiny"], [1, 2, 4], [None], generate=False, max_len=32)
    real = retime.run_timed_steps

    def oom_at_2(model, batches, *args):
        if batches[0]["input_ids"].shape[0] == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return real(model, batches, *args)

    monkeypatch.setattr(retime, "run_timed_steps", oom_at_2)
    got = []
    retime.time_group(specs, data.TokenizedData.load(env["data"]), torch.device("cpu"), float("inf"), got.append)
    assert [(r["batch_size"], r["status"]) for r in got] == [(1, "ok"), (2, "oom")]


def test_only_points_that_trained_are_retimed_and_a_rerun_repeats_none(env, monkeypatch):
    points = sweep.plan(["tiny"], [1, 2, 4], [None], generate=False, max_len=32)
    records = retime.run(points, _sweep_records(points, oom=(4,)), data_path=env["data"], store_path=env["store"],
                         progress=False)
    assert sorted(r["batch_size"] for r in records) == [1, 2]

    def no_child(*args, **kwargs):
        raise AssertionError("a finished point ran again")

    monkeypatch.setattr(retime, "_run_child", no_child)
    again = retime.run(points, _sweep_records(points, oom=(4,)), data_path=env["data"], store_path=env["store"],
                       progress=False)
    assert sorted(r["point"] for r in again) == sorted(r["point"] for r in records)
    assert retime.run(points, [], data_path=env["data"], store_path=env["store"], budget_s=0, progress=False)


def test_a_child_that_fails_keeps_the_points_it_finished(env):
    points = [PointSpec("train", "tiny", b, max_len=32) for b in (1, 100)]  # 100: more texts than the data holds
    with pytest.raises(RuntimeError, match="larger than the data set"):
        retime.run(points, _sweep_records(points), data_path=env["data"], store_path=env["store"], progress=False)
    kept = runner.Store(env["store"], retime.TOPIC).records()
    assert [r["batch_size"] for r in kept] == [1]


def test_budget_must_not_be_negative(env):
    with pytest.raises(ValueError, match="budget_s must be >= 0"):
        retime.run([], [], budget_s=-1, data_path=env["data"], store_path=env["store"])


def test_merged_takes_the_times_and_keeps_the_memory():
    points = sweep.plan(["tiny"], [1, 2, 4], [None], generate=False)
    sweep_records = _sweep_records(points, oom=(4,))
    timing = [{"point": points[0].key(), "status": "ok", "git_commit": "a" * 40, "measured_at": "2026-12-04T10:00",
               **{k: 1.0 for k in retime.TIMING_FIELDS}, "timed_steps": 10},
              {"point": points[1].key(), "status": "oom", "git_commit": "b" * 40, "measured_at": "2026-12-04T10:01"}]
    out = retime.merged(sweep_records, timing)
    assert out[0]["step_s"] == 1.0 and out[0]["timed_steps"] == 10 and out[0]["peak_reserved_gb"] == 1.5
    assert out[0]["timed_from"].startswith("re-timed at aaaaaaaaaaaa")
    assert out[1]["step_s"] == 9.0 and out[1]["timed_from"] == "sweep" and out[1]["timed_steps"] == 3
    assert out[2]["status"] == "oom" and out[2]["timed_from"] == "sweep"
    assert sweep_records[0]["step_s"] == 9.0  # the sweep's own records are not changed


def test_select_keeps_the_points_asked_for():
    points = sweep.plan(["7b", "13b"], [1, 4, 16], [None, 40, 48], generate=False)
    got = retime.select(points, models=["13b"], max_batch=4, caps=[40, 48])
    assert {(p.model, p.batch_size, p.cap_gb) for p in got} == {("13b", b, c) for b in (1, 4) for c in (40, 48)}
    assert retime.select(points) == points
    assert {p.cap_gb for p in retime.select(points, caps=[None])} == {None}


def test_time_here_runs_a_child_a_setting_and_saves_nothing(env, monkeypatch, tmp_path):
    points = [PointSpec("train", "tiny", b, cap, max_len=32) for cap in (None, 0.15) for b in (1, 2)]
    groups = []

    def fake_child(specs, data_path, deadline, store_path, progress):
        groups.append([s.key() for s in specs])
        for s in specs:
            runner.append(store_path, s.key(), [{"point": s.key(), "batch_size": s.batch_size, "status": "ok"}])

    monkeypatch.setattr(retime, "_run_child", fake_child)
    got = retime.time_here(points, budget_s=60, data_path=env["data"])
    assert groups == [[p.key() for p in points[:2]], [p.key() for p in points[2:]]]  # one child a cap
    assert [r["point"] for r in got] == [p.key() for p in points]
    assert not (tmp_path / "results").exists()  # a card's own few points are shown, never saved
    groups.clear()
    assert retime.time_here(points, budget_s=0, data_path=env["data"]) == [] and groups == []
