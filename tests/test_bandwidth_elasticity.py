"""Bandwidth elasticity (notebook 10): the formula against hand-computed values, the roofline's prediction, the
rows built from small fake records, a part measured on one GPU only, and the code-changed marking."""
import dataclasses
import functools
import json
import math
import subprocess
from pathlib import Path

import pytest

from helpers import results
from helpers.studies import bandwidth_elasticity as be


def test_elasticity_against_hand_computed_values():
    assert be.elasticity(1.42, 1.0, 1.0, 1.42) == pytest.approx(1.0)  # time follows the copy ratio exactly
    assert be.elasticity(2.0, 2.0, 3000, 4250) == 0.0  # time does not move
    assert be.elasticity(1.2, 1.0, 1.0, 1.44) == pytest.approx(0.5)  # ln 1.2 / ln 1.44 = 1/2
    assert be.elasticity(0.94, 1.0, 3016, 4250) == pytest.approx(math.log(0.94) / math.log(4250 / 3016))
    assert be.elasticity(1.0, 1.1, 1.0, 1.42) < 0  # the faster-memory GPU is slower


@pytest.mark.parametrize("args", [(0.0, 1.0, 1.0, 1.42), (1.0, 1.0, 2.0, 2.0), (1.0, 1.0, -1.0, 1.42)])
def test_elasticity_rejects_undefined_inputs(args):
    with pytest.raises(ValueError):
        be.elasticity(*args)


def test_roofline_prediction():
    peaks, bw = (50_000.0, 50_000.0), (3000.0, 4200.0)  # GFLOP/s, GB/s: ridges 16.7 and 11.9 FLOP per byte
    assert be.predicted(0.0, *peaks, *bw) == pytest.approx(1.0)
    assert be.predicted(5.0, *peaks, *bw) == pytest.approx(1.0)  # below both ridges
    assert be.predicted(100.0, *peaks, *bw) == pytest.approx(0.0)  # above both
    # at 14 FLOP per byte the slow GPU is memory-bound (1/3000 s per GB), the fast one compute-bound (14/50000)
    assert be.predicted(14.0, *peaks, *bw) == pytest.approx(math.log((1 / 3000) / (14 / 50_000)) / math.log(1.4))


def test_combined_share_is_the_time_weighted_clipped_elasticity():
    assert be.combined([(60.0, 0.0), (40.0, 1.0)]) == pytest.approx(0.4)
    assert be.combined([(50.0, -0.5), (50.0, 1.5)]) == pytest.approx(0.5)  # clipped to 0 and 1
    assert be.combined([(30.0, 0.5)]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        be.combined([])


def fake(records, commit="abc"):
    return results.Result(Path("fake.json"), {"git_commit": commit}, records)


PART = be.Part("toy kernel", "toy", "kernel", "ms",
               be._by(("M",), lambda r: r["impl"] == "mine", lambda r: r["ms"], lambda r: be._spread(r, "p20", "p80"),
                      lambda r: r.get("fpb")), ())


def test_row_builder_on_small_fake_records():
    slow = fake([{"impl": "mine", "M": 1, "ms": 1.42, "p20": 1.40, "p80": 1.50, "fpb": 2.0},
                 {"impl": "mine", "M": 2, "ms": 2.0, "p20": 2.0, "p80": 2.0, "fpb": 4.0},
                 {"impl": "mine", "M": 3, "ms": 9.0, "fpb": 4.0},  # only on the slow GPU: not compared
                 {"impl": "other", "M": 1, "ms": 5.0}])
    fast = fake([{"impl": "mine", "M": 1, "ms": 1.0, "p20": 0.9, "p80": 1.1, "fpb": 2.0},
                 {"impl": "mine", "M": 2, "ms": 2.0, "p20": 2.0, "p80": 2.0, "fpb": 4.0}])
    row = be.build_row(PART, slow, fast, (1.0, 1.42), ({}, {}))
    assert row.status == "compared" and [p.key for p in row.points] == [(1,), (2,)]
    assert [p.e for p in row.points] == pytest.approx([1.0, 0.0])
    assert row.e == pytest.approx(0.5) and row.intensity == pytest.approx(3.0)
    assert row.points[0].e_lo == pytest.approx(math.log(1.40 / 1.1) / math.log(1.42))
    assert row.points[0].e_hi == pytest.approx(math.log(1.50 / 0.9) / math.log(1.42))
    assert row.time("slow") == pytest.approx(math.sqrt(1.42 * 2.0))
    assert row.code == "unknown"  # commit "abc" is in no history


def test_no_repeats_means_no_spread():
    slow, fast = fake([{"impl": "mine", "M": 1, "ms": 2.0}]), fake([{"impl": "mine", "M": 1, "ms": 1.5}])
    row = be.build_row(PART, slow, fast, (1.0, 1.42), ({}, {}))
    assert row.spread is None and "none" in be.format_table([row], {}, (1.0, 1.42))


def test_a_part_on_one_gpu_only_is_listed_not_a_crash():
    row = be.build_row(PART, None, fake([{"impl": "mine", "M": 1, "ms": 1.0}]), (1.0, 1.42), ({}, {}))
    assert row.status == f"not measured on {be.SLOW} yet" and row.e is None and row.points == []
    assert f"not measured on {be.SLOW} yet" in be.format_table([row], {}, (1.0, 1.42))
    row = be.build_row(PART, fake([{"impl": "other", "M": 1, "ms": 1.0}]), fake([{"impl": "mine", "M": 1, "ms": 1.0}]),
                       (1.0, 1.42), ({}, {}))
    assert row.status == f"no records of it on {be.SLOW} yet"


def write(folder: Path, gpu: str, topic: str, records: list[dict], commit: str = "abc") -> None:
    (folder / gpu).mkdir(parents=True, exist_ok=True)
    (folder / gpu / f"{topic}.json").write_text(json.dumps({"provenance": {"git_commit": commit},
                                                            "records": records}))


def step(batch, scale):
    """A fake QLoRA step: 60 ms of matmul, 40 ms of element-wise on the slow GPU; ``scale`` the fast GPU's."""
    parts = {"matmul ms": 60.0, "nf4 dequantise ms": 1.0, "softmax ms": 1.0, "element-wise ms": 40.0,
             "optimizer ms": 1.0, "host ms": 1.0}
    return {"what": "train_parts", "model": "7b", "batch_size": batch, "step_s": 0.104 * scale["step"],
            **{k: v * scale.get(k, 1.0) for k, v in parts.items()}}


def test_table_picks_up_a_topic_when_it_appears(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    for gpu, gbps in ((be.SLOW, 3000.0), (be.FAST, 4260.0)):
        write(tmp_path, gpu, "ceilings", [{"what": "copy", "gbps": gbps}])
        write(tmp_path, gpu, "device", [{"l2_bytes": 50 * 2**20}])
    ratio = 4260.0 / 3000.0
    write(tmp_path, be.FAST, "step_parts", [step(4, {"element-wise ms": 1 / ratio, "step": 1.0})])
    rows = {r.part.name: r for r in be.table()}
    assert rows["QLoRA step: matmul"].status == f"not measured on {be.SLOW} yet"
    assert rows["copy 1 GiB (the yardstick, nb 00)"].e == pytest.approx(1.0)
    assert "not decided" in be.verdict(list(rows.values()))[0]

    write(tmp_path, be.SLOW, "step_parts", [step(4, {"step": 1.0})])
    rows = be.table()
    got = be.shares(rows, be.STEP_PARTS, "QLoRA step: whole step")
    assert list(got) == [("7b", 4)]
    assert got[("7b", 4)][0] == pytest.approx(40.0 / 104.0)  # only the element-wise part follows bandwidth
    assert "38% of its time follows bandwidth" in be.verdict(rows)[0]


@pytest.fixture
def repo(tmp_path):
    """A git repository with two commits: a.py changes between them, b.py does not."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "a.py").write_text("1\n")
    (tmp_path / "b.py").write_text("1\n")
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=tmp_path, check=True)
    (tmp_path / "a.py").write_text("2\n")
    subprocess.run([*git, "commit", "-qam", "two"], cwd=tmp_path, check=True)
    head = lambda rev: subprocess.run(["git", "rev-parse", rev], cwd=tmp_path, capture_output=True,  # noqa: E731
                                      text=True, check=True).stdout.strip()
    return tmp_path, head("HEAD~1"), head("HEAD")


def test_code_status_marks_changed_sources(repo):
    path, one, two = repo
    assert be.code_status(one, two, ("a.py",), path) == "changed: a.py"
    assert be.code_status(one, two, ("a.py", "b.py"), path) == "changed: a.py"
    assert be.code_status(one, two, ("b.py",), path) == "same"
    assert be.code_status(one, two + "-dirty", ("b.py",), path) == "same*"
    assert be.code_status(one, "0" * 40, ("b.py",), path) == "unknown"  # a commit not in this history
    assert be.code_status(None, two, ("b.py",), path) == "unknown"  # a provenance without a commit


def test_a_row_is_marked_when_its_code_changed_between_the_runs(repo, monkeypatch):
    path, one, two = repo
    monkeypatch.setattr(be, "code_status", functools.partial(be.code_status, repo=path))
    records = [{"impl": "mine", "M": 1, "ms": 1.0}]
    changed, same = dataclasses.replace(PART, sources=("a.py",)), dataclasses.replace(PART, sources=("b.py",))
    assert be.build_row(changed, fake(records, one), fake(records, two), (1.0, 1.42), ({}, {})).code == "changed: a.py"
    assert be.build_row(same, fake(records, one), fake(records, two), (1.0, 1.42), ({}, {})).code == "same"
    # records that carry their own commit override the file's provenance
    own = [{**records[0], "git_commit": one}]
    assert be.build_row(changed, fake(own, one), fake(own, two), (1.0, 1.42), ({}, {})).code == "same"


def test_code_status_without_git_is_unknown(repo, monkeypatch):
    path, one, two = repo

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(be.subprocess, "run", no_git)
    assert be.code_status(one, two, ("a.py",), path) == "unknown"


def test_worst_status_wins():
    assert be.worst(["same", "changed: a.py", "changed: b.py"]) == "changed: a.py, b.py"
    assert be.worst(["same", "same*"]) == "same*" and be.worst(["same", "unknown"]) == "unknown"
    assert be.worst(["same"]) == "same"


def test_the_committed_results_build_a_table():
    """The committed H100 and H200 results: every part either compared or said to be missing."""
    rows = be.table()
    assert all(r.status == "compared" or r.status.endswith(" yet") or r.status == "no configuration on both"
               for r in rows)
    assert all(r.e is not None for r in rows if r.status == "compared")
    copy = next(r for r in rows if r.part.topic == "ceilings" and r.part.name.startswith("copy"))
    assert copy.e == pytest.approx(1.0)


def test_every_part_reads_the_committed_records_of_the_gpu_that_has_them(tmp_path, monkeypatch):
    """With the H200's committed files standing in for both GPUs (the H100's ceilings kept, so the copy rates
    differ), every part finds records (the extractors match the real schema) and the verdict is computed."""
    fast = results.results_dir("full") / be.FAST
    for gpu in (be.SLOW, be.FAST):
        (tmp_path / gpu).mkdir()
        for f in fast.glob("*.json"):
            (tmp_path / gpu / f.name).write_text(f.read_text())
    (tmp_path / be.SLOW / "ceilings.json").write_text((results.results_dir("full") / be.SLOW / "ceilings.json")
                                                      .read_text())
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    rows = be.table()
    assert [r.part.name for r in rows if r.status != "compared"] == []
    assert {r.code for r in rows if r.part.topic != "ceilings"} <= {"same", "same*", "unknown"}  # the same files
    lines = be.verdict(rows)
    assert any(line.startswith("a QLoRA step (model 7b, batch_size 16): ") and "% of its time follows bandwidth" in line
               for line in lines), lines
    assert not any("not decided" in line or "yet" in line for line in lines), lines
