"""helpers.finetune.runner: the one resumable runner of the sweep, the re-timing and the two-GPU runs, tested
through plans of its own (no model, no child process) and through the two-GPU plan with its launch faked."""
import json

import pytest

from helpers import results
from helpers.finetune import distributed, runner
from helpers.finetune.distributed import DistSpec
from helpers.finetune.point_spec import PointSpec

TOPIC = "runner_test"


@pytest.fixture
def store_path(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "progress.jsonl"


def _points(batches=(1, 2, 4), caps=(None,)):
    return [PointSpec("train", "tiny", b, cap) for cap in caps for b in batches]


def _plan(points, store_path, calls, *, oom_from=None, kill_at=None, **fields):
    def run_point(point, gpu, report):
        calls.append(point.key())
        if len(calls) == kill_at:
            raise KeyboardInterrupt  # the run is killed while this point runs
        status = "oom" if oom_from is not None and point.batch_size >= oom_from else "ok"
        return [{"kind": point.kind, "point": point.key(), "batch_size": point.batch_size, "status": status}]

    return runner.Plan(points, lambda: runner.Store(store_path, TOPIC), run_point=run_point, **fields)


def _saved():
    return results.load(TOPIC, scale=results.SCALE).records


def test_a_killed_run_resumes_without_losing_or_repeating_a_point(store_path):
    points = _points()
    calls = []
    with pytest.raises(KeyboardInterrupt):
        runner.run(_plan(points, store_path, calls, kill_at=2), progress=False)
    assert [r["point"] for r in _saved()] == [points[0].key()]  # the finished point is saved, in both files
    assert [json.loads(line)["point"] for line in store_path.read_text().splitlines()] == [points[0].key()]
    with store_path.open("a") as f:
        f.write('{"point": "cut short')  # a line half-written when the process died
    again = []
    store = runner.run(_plan(points, store_path, again), progress=False)
    assert again == [p.key() for p in points[1:]]  # nothing redone, nothing skipped
    assert sorted(r["point"] for r in store.records()) == sorted(p.key() for p in points)  # nothing lost or doubled
    assert _saved() == store.records()
    none = []
    runner.run(_plan(points, store_path, none), progress=False)
    assert none == [] and runner.pending(points, runner.Store(store_path, TOPIC)) == []


def test_the_budget_stops_new_points_and_zero_starts_none(store_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "time", lambda: clock[0])
    points = _points((1, 2, 4, 8))
    calls = []

    def slow(point, gpu, report):  # each point takes 10 s of the fake clock
        calls.append(point.key())
        clock[0] += 10
        return [{"point": point.key(), "status": "ok"}]

    plan = runner.Plan(points, lambda: runner.Store(store_path, TOPIC), run_point=slow)
    store = runner.run(plan, budget_s=15, progress=False)
    assert calls == [p.key() for p in points[:2]]  # started at 0 s and 10 s; none at 20 s
    assert sorted(store.done) == sorted(calls)
    calls.clear()
    assert runner.run(plan, budget_s=0, progress=False).done.keys() == store.done.keys() and calls == []
    with pytest.raises(ValueError, match="budget_s must be >= 0"):
        runner.run(plan, budget_s=-1, progress=False)


def test_an_oom_at_a_batch_skips_the_larger_batches_of_its_settings(store_path):
    points = _points((4, 8, 16), caps=(None, 40))
    calls = []
    store = runner.run(_plan(points, store_path, calls, oom_from=8), progress=False)
    assert calls == [p.key() for p in points if p.batch_size < 16]  # batch 16 runs under neither cap
    for cap in (None, 40):
        [skipped] = store.done[PointSpec("train", "tiny", 16, cap).key()]
        assert skipped["status"] == "oom" and skipped["measured"] is False and skipped["batch_size"] == 16
        assert skipped["oom_message"] == "not run: batch 8 already ran out of memory"
    assert sorted(r["point"] for r in _saved()) == sorted(p.key() for p in points)


def test_workers_on_several_gpus_take_whole_groups_and_a_failure_stops_them(store_path):
    points = _points((4, 8, 16), caps=(None, 40, 48))
    used = {}

    def run_point(point, gpu, report):
        used.setdefault(gpu, []).append(point)
        return [{"point": point.key(), "status": "oom" if point.batch_size >= 8 else "ok"}]

    plan = runner.Plan(points, lambda: runner.Store(store_path, TOPIC), run_point=run_point)
    store = runner.run(plan, progress=False, gpus=["0", "1"])
    assert sorted(store.done) == sorted(p.key() for p in points)
    assert sum(len(v) for v in used.values()) == 6 and set(used) <= {"0", "1"}  # batch 16 never runs
    for specs in used.values():  # a GPU runs whole groups, batch sizes in order
        for a, b in zip(specs, specs[1:]):
            assert a.cap_gb != b.cap_gb or a.batch_size < b.batch_size
    with pytest.raises(ValueError, match="distinct GPU ids"):
        runner.run(plan, gpus=["0", "0"], progress=False)

    def broken(point, gpu, report):
        raise RuntimeError("the child failed")

    other = store_path.with_name("other.jsonl")
    with pytest.raises(RuntimeError, match="the child failed"):
        runner.run(runner.Plan(points, lambda: runner.Store(other, "runner_other"), run_point=broken),
                   progress=False, gpus=["0", "1"])


def test_a_group_that_writes_its_own_records_is_read_back_also_when_it_fails(store_path):
    points = _points((1, 2, 4))
    groups = []

    def run_group(group, gpu, deadline, report):  # like the re-timing's child: a line a point, then a failure
        groups.append([p.batch_size for p in group])
        for point in group:
            if point.batch_size == 4:
                raise RuntimeError("the child failed")
            runner.append(store_path, point.key(), [{"point": point.key(), "status": "ok"}])

    plan = runner.Plan(points, lambda: runner.Store(store_path, TOPIC), run_group=run_group)
    with pytest.raises(RuntimeError, match="the child failed"):
        runner.run(plan, progress=False)
    assert sorted(r["point"] for r in _saved()) == sorted(p.key() for p in points[:2])  # the results file caught up
    runner.run(runner.Plan(points, lambda: runner.Store(store_path, TOPIC), run_group=lambda *a: None),
               progress=False)
    assert groups == [[1, 2, 4]]
    with pytest.raises(ValueError, match="either its points"):
        runner.run(runner.Plan(points, lambda: runner.Store(store_path, TOPIC)), progress=False)


def test_the_two_gpu_plan_resumes_from_its_results_file_and_skips_after_an_oom(monkeypatch, store_path):
    monkeypatch.setattr(distributed, "check", lambda spec: None)
    launched = []

    def launch(spec, data_path, *, progress=None, timeout_s=None):  # rank 0 saves the run's records itself
        launched.append(spec.key())
        if spec.kind == "allreduce":
            records = [{"kind": "allreduce", "point": f"{spec.key()}/size={s:g}", "gpus": spec.gpus}
                       for s in spec.sizes_mb]
        else:
            records = [{"kind": "train", "point": spec.key(), "model": spec.model, "gpus": spec.gpus,
                        "batch_size": spec.batch_size, "global_batch": spec.batch_size * spec.gpus,
                        "status": "oom" if spec.batch_size >= 2 else "ok", "tokens_per_s": 1.0}]
        return distributed.save_records(records)

    monkeypatch.setattr(distributed, "launch", launch)
    specs = ([DistSpec("train", gpus=2, batch_size=b) for b in (1, 2, 4)]
             + [DistSpec("allreduce", gpus=2, sizes_mb=(0.1, 1))])
    records = distributed.run_plan(specs, "data.json", progress=False)
    assert launched == [s.key() for s in specs if s.batch_size != 4 or s.kind != "train"]
    [skipped] = [r for r in records if r["point"] == specs[2].key()]
    assert skipped["status"] == "oom" and skipped["measured"] is False and skipped["global_batch"] == 8
    assert [r["point"] for r in records] == [s.key() for s in specs[:3]] + [
        f"{specs[3].key()}/size={s}" for s in ("0.1", "1")]
    launched.clear()
    assert distributed.run_plan(specs, "data.json", progress=False) == records and launched == []
