import json

import pytest
import torch

from helpers import results
from helpers.llama import data
from helpers.finetune import runner, sweep_point, sweep
from helpers.finetune.point_spec import PointSpec


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(sweep, "card_gb", lambda: None)
    texts = data.standin_texts(60)
    tok = data.train_tokenizer(texts, 2000)
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    path = data.TokenizedData(ids, 32000, "test", "test", [len(t) for t in texts]).save(tmp_path / "data.json")
    return {"data": path, "store": tmp_path / "progress.jsonl"}


def _fake_runner(calls, fail_at=None, gpus_used=None):
    def run(spec, data_path, gpu=None, progress=None):
        calls.append(spec.key())
        if gpus_used is not None:
            gpus_used.setdefault(gpu, []).append(spec)
        if len(calls) == fail_at:
            raise KeyboardInterrupt  # the sweep is killed while this point runs
        status = "oom" if spec.batch_size >= 8 else "ok"
        return [{"kind": spec.kind, "point": spec.key(), "model": spec.model, "batch_size": spec.batch_size,
                 "status": status, "tokens_per_s": None if status == "oom" else 100.0 * spec.batch_size}]
    return run


def test_killed_sweep_resumes_without_losing_or_repeating_a_point(env):
    points = sweep.plan(["tiny"], [1, 2, 4], [None], generate=False)
    calls = []
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(points, data_path=env["data"], store_path=env["store"],
                        runner=_fake_runner(calls, fail_at=2), progress=False)
    saved = results.load("finetune", scale=results.SCALE)
    assert [r["point"] for r in saved.records] == [points[0].key()]  # the finished point is saved
    first = saved.records[0]
    with env["store"].open("a") as f:
        f.write('{"point": "cut short')  # a line half-written when the process died
    calls_after = []
    records = sweep.run_sweep(points, data_path=env["data"], store_path=env["store"],
                              runner=_fake_runner(calls_after), progress=False)
    assert calls_after == [p.key() for p in points[1:]]  # nothing redone
    assert sorted(r["point"] for r in records) == sorted(p.key() for p in points)  # nothing lost or doubled
    assert records[0] == first
    assert results.load("finetune", scale=results.SCALE).records == records
    again = []
    sweep.run_sweep(points, data_path=env["data"], store_path=env["store"], runner=_fake_runner(again), progress=False)
    assert again == [] and sweep.pending(points, env["store"]) == []


def test_resume_from_the_results_file_alone(env):
    # on the GPU machine only the results file travels between calls: it must be enough to resume
    points = sweep.plan(["tiny"], [1, 2], [None], generate=False)
    sweep.run_sweep(points[:1], data_path=env["data"], store_path=env["store"], runner=_fake_runner([]),
                    progress=False)
    env["store"].unlink()
    calls = []
    sweep.run_sweep(points, data_path=env["data"], store_path=env["store"], runner=_fake_runner(calls), progress=False)
    assert calls == [points[1].key()]


def test_a_zero_budget_runs_no_point_and_returns_what_is_saved(env):
    # the notebook at full scale reads a sweep run beforehand: budget 0 must start nothing
    points = sweep.plan(["tiny"], [1, 2], [None], generate=False)
    sweep.run_sweep(points[:1], data_path=env["data"], store_path=env["store"], runner=_fake_runner([]),
                    progress=False)
    calls = []
    records = sweep.run_sweep(points, data_path=env["data"], store_path=env["store"], runner=_fake_runner(calls),
                              budget_s=0, progress=False)
    assert calls == [] and [r["point"] for r in records] == [points[0].key()]
    assert sweep.pending(points, env["store"]) == points[1:]
    with pytest.raises(ValueError, match="budget_s must be >= 0"):
        sweep.run_sweep(points, data_path=env["data"], store_path=env["store"], runner=_fake_runner(calls),
                        budget_s=-1, progress=False)


def test_larger_batches_after_an_oom_are_recorded_without_running(env):
    points = sweep.plan(["tiny"], [4, 8, 16], [None], generate=False)
    calls = []
    records = sweep.run_sweep(points, data_path=env["data"], store_path=env["store"], runner=_fake_runner(calls),
                              progress=False)
    assert calls == [points[0].key(), points[1].key()]
    assert [(r["status"], r["measured"]) for r in records] == [("ok", True), ("oom", True), ("oom", False)]


def test_two_gpus_share_the_sweep_a_group_on_one_gpu(env):
    points = sweep.plan(["tiny"], [4, 8, 16], [None, 40, 48], generate=False)
    calls, used = [], {}
    records = sweep.run_sweep(points, data_path=env["data"], store_path=env["store"],
                              runner=_fake_runner(calls, gpus_used=used), progress=False, gpus=["0", "1"])
    assert sorted(r["point"] for r in records) == sorted(p.key() for p in points)
    assert len(calls) == 6 and len(set(calls)) == 6  # batch 16 never runs after batch 8 ran out of memory
    assert set(used) <= {"0", "1"}
    for specs in used.values():  # a GPU runs whole groups, batch sizes in order
        for a, b in zip(specs, specs[1:]):
            assert a.cap_gb != b.cap_gb or a.batch_size < b.batch_size
    assert sorted(r["point"] for r in results.load("finetune", scale=results.SCALE).records) == sorted(calls + [
        p.key() for p in points if p.batch_size == 16])


def test_a_childs_gpu_is_named_through_the_parents_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert sweep._child_devices("0") == "2" and sweep._child_devices("1") == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert sweep._child_devices("1") == "1"


def test_the_same_gpu_twice_is_refused(env):
    with pytest.raises(ValueError, match="distinct GPU ids"):
        sweep.run_sweep(sweep.plan(["tiny"], [1], [None]), data_path=env["data"], store_path=env["store"],
                        runner=_fake_runner([]), gpus=["0", "0"])


def test_simulated_cuda_oom_in_a_point_is_recorded(env, monkeypatch):

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(sweep_point, "check_checkpointing", out_of_memory)
    spec = PointSpec("train", "tiny", 2, max_len=32, warmup_steps=1, timed_steps=1)
    [record] = sweep_point.run_point(spec, env["data"])
    assert record["status"] == "oom" and record["oom_stage"] == "train"
    assert "out of memory" in record["oom_message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the simulated cap is the CPU's stand-in for a GPU's")
def test_simulated_cap_on_cpu_runs_out_of_memory_for_the_larger_batch(env):
    fits = sweep_point.run_point(PointSpec("train", "tiny", 1, cap_gb=0.1, max_len=64, warmup_steps=1, timed_steps=1),
                           env["data"])[0]
    assert fits["status"] == "ok" and fits["checkpointing"] is True
    assert fits["peak_alloc_gb"] < 0.1 and fits["tokens_per_s"] > 0 and fits["step_s"] > 0
    big = sweep_point.run_point(PointSpec("train", "tiny", 8, cap_gb=0.1, max_len=64, warmup_steps=1, timed_steps=1),
                          env["data"])[0]
    assert big["status"] == "oom" and big["peak_alloc_gb"] > 0.1


def test_one_point_in_a_subprocess(env):
    spec = PointSpec("generate", "tiny", new_tokens=(3, 5))
    reports = []
    records = sweep.subprocess_runner(spec, env["data"], progress=reports.append)
    assert [r["new_tokens"] for r in records] == [3, 5]
    assert all(r["status"] == "ok" and r["seconds"] > 0 for r in records)
    assert all(r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["seconds"]) for r in records)
    assert reports[0] == "model built; warming up" and [r.split(" tokens")[0] for r in reports[1:]] == [
        "generated 3", "generated 5"]  # the child's progress, as it went


@pytest.mark.parametrize("points,match", [
    ([PointSpec("train", "7B")], "unknown model"),
    ([PointSpec("train", "tiny", 0)], "batch size must be an integer >= 1"),
    ([PointSpec("train", "tiny", 2.5)], "batch size"),
    ([PointSpec("train", "tiny", cap_gb=-1)], "memory cap must be > 0"),
    ([PointSpec("train", "tiny", lora_r=0)], "rank"),
    ([PointSpec("train", "tiny", attn="flash")], "attn"),
    ([PointSpec("train", "tiny"), PointSpec("train", "tiny")], "twice"),
    ([], "no points"),
])
def test_bad_input_is_refused_before_any_point_runs(env, points, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        sweep.run_sweep(points, data_path=env["data"], store_path=env["store"], runner=_fake_runner(calls))
    assert calls == [] and not env["store"].exists()


def test_cap_larger_than_the_card_is_refused(env, monkeypatch):
    monkeypatch.setattr(sweep, "card_gb", lambda: 44.0)
    calls = []
    with pytest.raises(ValueError, match="larger than this card"):
        sweep.run_sweep(sweep.plan(["tiny"], [1], [40, 48]), data_path=env["data"], store_path=env["store"],
                        runner=_fake_runner(calls))
    assert calls == []


def test_full_run_without_a_gpu_is_refused(env, monkeypatch):
    monkeypatch.setattr(sweep, "HAS_CUDA", False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        sweep.validate(sweep.plan(["7b"], [1], [None]), scale="full")


def test_point_cli_writes_its_records(env, tmp_path):
    out = tmp_path / "out.json"
    sweep_point.main(["--spec", PointSpec("train", "tiny", 1, max_len=16, warmup_steps=1, timed_steps=1).to_json(),
                "--data", str(env["data"]), "--out", str(out)])
    [record] = json.loads(out.read_text())
    assert record["status"] == "ok" and record["batch_size"] == 1 and record["max_seq_len"] <= 16
    assert record["measured_at"] and "git_commit" in record  # each point keeps its own provenance


class Killed(BaseException):
    """The process dies here (raised from inside a save)."""


def test_a_kill_at_every_save_then_a_resume_loses_no_finished_point(env, monkeypatch):
    points = sweep.plan(["tiny"], [1, 2, 4], [None], generate=False)
    save = results.save
    for kill_at in range(1, 2 * len(points) + 1):  # each point writes the progress file, then the results file
        store = env["store"].with_name(f"progress-{kill_at}.jsonl")
        monkeypatch.setenv("COURSE_RESULTS_DIR", str(env["store"].parent / f"results-{kill_at}"))
        writes = []

        def dying(*a, **k):
            writes.append(a)
            if len(writes) == kill_at:
                raise Killed
            return save(*a, **k)

        monkeypatch.setattr(results, "save", dying)
        appended = runner.Store.add

        def add(self, point, records):  # the progress line is the other write of a point
            writes.append(point)
            if len(writes) == kill_at:
                raise Killed
            appended(self, point, records)

        monkeypatch.setattr(runner.Store, "add", add)
        with pytest.raises(Killed):
            sweep.run_sweep(points, data_path=env["data"], store_path=store, runner=_fake_runner([]),
                            progress=False)
        monkeypatch.setattr(results, "save", save)
        monkeypatch.setattr(runner.Store, "add", appended)
        finished = {json.loads(line)["point"] for line in store.read_text().splitlines()} if store.exists() else set()
        calls = []
        sweep.run_sweep(points, data_path=env["data"], store_path=store, runner=_fake_runner(calls), progress=False)
        assert not finished & set(calls), kill_at  # a finished point is not run again
        saved = results.load("finetune", scale=results.SCALE).records
        assert sorted(r["point"] for r in saved) == sorted(p.key() for p in points), kill_at


def test_a_point_killed_between_its_two_writes_reaches_the_results_file(env):
    points = sweep.plan(["tiny"], [1, 2], [None], generate=False)
    sweep.run_sweep(points, data_path=env["data"], store_path=env["store"], runner=_fake_runner([]), progress=False)
    path = results.path_for("finetune")
    payload = json.loads(path.read_text())
    payload["records"] = payload["records"][:1]  # the last point's progress line written, its results not
    path.write_text(json.dumps(payload))
    calls = []
    sweep.run_sweep(points, data_path=env["data"], store_path=env["store"], runner=_fake_runner(calls), progress=False)
    assert calls == [] and len(results.load("finetune", scale=results.SCALE).records) == 2
    path.unlink()  # the results folder deleted: the progress file is enough
    assert len(runner.Store(env["store"], sweep.TOPIC).records()) == 2 and path.exists()


def test_the_progress_file_moves_with_the_results(env):
    assert runner.default_store(sweep.TOPIC).parent == env["store"].parent / "results" / "finetune-progress"


def test_the_command_line_follows_the_scale():
    args = sweep.cli().parse_args([])
    if results.SCALE == "smoke":  # notebook 06's smoke plan
        assert args.models == ["tiny"] and args.caps == ["0.15"] and args.new_tokens == [4, 8]
    else:
        assert args.models == ["7b", "13b", "70b"] and args.new_tokens == list(sweep.NEW_TOKENS)
    assert "tiny" in sweep.cli().format_help()
    with pytest.raises(SystemExit):
        sweep.cli().parse_args(["--models", "8b"])


@pytest.mark.gpu
def test_a_cap_below_the_cuda_context_is_refused_clearly():
    from helpers.llama.memory_caps import apply_cap, context_bytes

    with pytest.raises(ValueError, match="CUDA context"):
        apply_cap(context_bytes() / 2**30 / 2)
    assert apply_cap(None) == {"alloc_limit_gb": None, "context_gb": None}
