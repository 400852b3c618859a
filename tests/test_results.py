import json
import math

import pytest

from helpers import results


@pytest.fixture
def tmp_results(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name,count,slug", [
    ("NVIDIA H200", 1, "h200"),
    ("NVIDIA H200", 2, "h200x2"),
    ("NVIDIA A100-SXM4-40GB", 1, "a100-sxm4-40gb"),
    ("Tesla T4", 1, "t4"),
    ("NVIDIA RTX 6000 Ada Generation", 1, "rtx-6000-ada-generation"),
    ("cpu", 1, "cpu"),
])
def test_gpu_slug(name, count, slug):
    assert results.gpu_slug(name, count) == slug


def test_save_then_load_round_trip(tmp_results):
    records = [{"what": "copy", "gbps": 4280.5}, {"what": "matmul", "dtype": "bf16", "tflops": 780.0}]
    path = results.save("ceilings", records)
    assert path == tmp_results / results.gpu_slug() / "ceilings.json"
    back = results.load("ceilings", gpu=results.gpu_slug())
    assert back.records == records
    assert back.where(what="matmul")[0]["tflops"] == 780.0
    for key in ("gpu", "driver", "cuda", "torch", "triton", "bitsandbytes", "transformers", "peft", "python",
                "cpu", "cpu_count", "git_commit", "timestamp", "scale"):
        assert key in back.provenance, key
    assert "torch" in back.describe()
    assert not list(tmp_results.rglob("*.tmp"))


def test_multi_gpu_results_go_to_their_own_folder(tmp_results):
    path = results.save("fsdp", [{"gpus": 2}], gpus=2)
    assert path.parent.name == results.gpu_slug(count=2)
    with pytest.raises(ValueError, match="gpus"):
        results.save("fsdp", [{"gpus": 0}], gpus=0)


def test_records_must_be_flat(tmp_results):
    with pytest.raises(TypeError, match="flat"):
        results.save("ceilings", [{"sizes": [1, 2]}])
    with pytest.raises(ValueError):
        results.save("ceilings", [])
    with pytest.raises(ValueError):
        results.save("ceilings", [{"gbps": math.nan}])
    with pytest.raises(ValueError, match="topic"):
        results.save("../escape", [{"a": 1}])


def test_missing_topic_names_what_exists(tmp_results):
    (tmp_results / "h200").mkdir()
    (tmp_results / "h200" / "ceilings.json").write_text(json.dumps({"provenance": {}, "records": [{"a": 1}]}))
    with pytest.raises(FileNotFoundError, match="h200"):
        results.load("ceilings", gpu="l4")
    assert results.find("ceilings", gpu="l4") is None  # no other GPU's file in its place
    assert results.find("ceilings", gpu="h200").records == [{"a": 1}]


def test_a_topic_is_read_from_this_gpu_then_the_reference_then_the_h200(tmp_results):
    def write(gpu, topic):
        (tmp_results / gpu).mkdir(exist_ok=True)
        (tmp_results / gpu / f"{topic}.json").write_text(json.dumps({"provenance": {}, "records": [{"a": 1}]}))

    write("h200", "finetune")
    write("h200", "ceilings")
    write(results.REFERENCE_GPU, "ceilings")
    write("l4", "ceilings")
    assert results.source_gpu("ceilings", prefer="l4") == "l4"
    assert results.source_gpu("ceilings", prefer="a10") == results.REFERENCE_GPU
    assert results.source_gpu("finetune", prefer="l4") == "h200"
    write("h200x2", "fsdp")
    assert results.source_gpu("fsdp", gpus=2) == "h200x2"
    with pytest.raises(FileNotFoundError, match="no results for topic 'serving'"):
        results.source_gpu("serving", prefer="l4")
    assert results.reference("ceilings").path.parent.name == results.REFERENCE_GPU  # not this machine's "l4"
    assert results.reference("finetune").path.parent.name == "h200"
    assert results.reference("ceilings").provenance == {}  # another GPU's run: as saved


def test_the_reference_read_on_the_reference_gpu_itself_says_it_is_an_earlier_run(tmp_results, monkeypatch):
    (tmp_results / results.REFERENCE_GPU).mkdir()
    provenance = {"gpu": "NVIDIA H100 80GB HBM3", "timestamp": "2026-12-06T05:22:25+00:00"}
    (tmp_results / results.REFERENCE_GPU / "ceilings.json").write_text(
        json.dumps({"provenance": provenance, "records": [{"a": 1}]}))
    monkeypatch.setattr(results, "SCALE", "full")
    monkeypatch.setattr(results, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    ref = results.reference("ceilings")
    assert ref.provenance["gpu"] == "NVIDIA H100 80GB HBM3, an earlier run on this GPU (2026-12-06 05:22 UTC)"
    assert ref.short().startswith("NVIDIA H100 80GB HBM3, an earlier run")
    monkeypatch.setattr(results, "gpu_name", lambda: "NVIDIA H200")
    assert results.reference("ceilings").provenance["gpu"] == "NVIDIA H100 80GB HBM3"


def test_smoke_runs_never_write_into_committed_results(monkeypatch):
    monkeypatch.delenv("COURSE_RESULTS_DIR", raising=False)
    assert results.results_dir("full") == results.REPO_ROOT / "results"
    assert results.results_dir("smoke") != results.results_dir("full")


def test_provenance_records_versions():
    p = results.provenance()
    assert p["torch"] and p["python"] and p["timestamp"]


def test_a_save_that_dies_midway_leaves_the_old_file(tmp_results, monkeypatch):
    path = results.save("ceilings", [{"gbps": 1.0}])
    before = path.read_bytes()

    def killed(fd):  # the process dies before the new text reaches the disk
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        results.save("ceilings", [{"gbps": 2.0}])
    assert path.read_bytes() == before and [p.name for p in path.parent.iterdir()] == ["ceilings.json"]


def test_full_scale_without_a_gpu_is_refused(monkeypatch):
    if results.HAS_CUDA:
        pytest.skip("checks the refusal on a machine without a GPU")
    monkeypatch.delenv("COURSE_RESULTS_DIR", raising=False)
    monkeypatch.setattr(results, "SCALE", "full")
    with pytest.raises(RuntimeError, match="results/cpu"):
        results.save("ceilings", [{"gbps": 1.0}])
    assert not (results.REPO_ROOT / "results" / "cpu").exists()
