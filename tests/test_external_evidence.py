"""The cited external measurements in results/external/: each loads through helpers.results, says where it comes
from, and holds exactly the numbers read at its source (a typo in a file fails here)."""
import re

import pytest

from helpers import results

PROVENANCE_KEYS = {"source", "source_commit", "title", "table", "setup", "kind", "note"}
TOPICS = ("h2ogpt_generate", "fms_acceleration_qlora", "tensorrt_llm_serving")
COMMIT = re.compile(r"^[0-9a-f]{40}$")

# h2oai/h2ogpt benchmarks/perf.md @ a65122797d9c, transformers backend, Llama-2-7B-chat, 1 GPU:
# (bits, GPU) -> generation speed [tokens/sec]
H2OGPT = {
    (16, "NVIDIA RTX 6000 Ada Generation"): 41.9433, (16, "NVIDIA GeForce RTX 4090"): 40.9252,
    (16, "NVIDIA A100-SXM4-80GB"): 32.4529, (16, "NVIDIA RTX A6000"): 29.8526, (16, "NVIDIA GeForce RTX 3090"): 18.0571,
    (8, "NVIDIA GeForce RTX 4090"): 9.21246, (8, "NVIDIA RTX 6000 Ada Generation"): 8.95532,
    (8, "NVIDIA A100-SXM4-80GB"): 7.47991, (8, "NVIDIA RTX A6000"): 6.61984, (8, "NVIDIA GeForce RTX 3090"): 4.35807,
    (4, "NVIDIA GeForce RTX 4090"): 32.571, (4, "NVIDIA RTX 6000 Ada Generation"): 32.3408,
    (4, "NVIDIA A100-SXM4-80GB"): 23.3267, (4, "NVIDIA RTX A6000"): 22.8456, (4, "NVIDIA GeForce RTX 3090"): 14.9456,
}
# foundation-model-stack/fms-acceleration scripts/benchmarks/refs, accelerated-peft-bnb, Mistral-7B:
# (GPU, num_gpus, per-device batch) -> train_tokens_per_second
FMS_COMMITS = {"A100 80GB": "04702cc5b9f0e198d545b88a7c6fd9ade8c50bb8",
               "L40": "8af8fa7de2b2065302455b4552b85d515b8ff814"}
FMS = {
    ("A100 80GB", 1, 4): 3428.645, ("A100 80GB", 2, 2): 2843.435, ("A100 80GB", 1, 8): 3514.427,
    ("A100 80GB", 2, 4): 3290.15, ("L40", 1, 4): 2517.044, ("L40", 2, 2): 2346.575, ("L40", 1, 8): 2521.802,
    ("L40", 2, 4): 2452.406,
}
# NVIDIA/TensorRT-LLM docs/source/performance.md (v0.9.0 data), peak throughput, LLaMA 7B, TP 1:
# (table, batch, input, output) -> output tokens/s per GPU
TRT = {
    ("H200 GPUs (FP8)", 896, 128, 128): 20618, ("H200 GPUs (FP8)", 120, 128, 2048): 8348,
    ("H200 GPUs (FP8)", 64, 2048, 128): 2391, ("H200 GPUs (FP8)", 56, 2048, 2048): 3522,
    ("H100 GPUs (FP8)", 896, 128, 128): 19854, ("H100 GPUs (FP8)", 120, 128, 2048): 6944,
    ("H100 GPUs (FP8)", 84, 2048, 128): 2163, ("H100 GPUs (FP8)", 56, 2048, 2048): 2826,
    ("L40S GPUs (FP8)", 256, 128, 128): 5885, ("L40S GPUs (FP8)", 64, 128, 2048): 1654,
    ("L40S GPUs (FP8)", 32, 2048, 128): 574, ("L40S GPUs (FP8)", 16, 2048, 2048): 537,
    ("A100 GPUs (FP16)", 256, 128, 128): 5390, ("A100 GPUs (FP16)", 32, 128, 2048): 1484,
    ("A100 GPUs (FP16)", 32, 2048, 128): 533, ("A100 GPUs (FP16)", 16, 2048, 2048): 603,
}


def _load(topic: str, monkeypatch) -> results.Result:
    monkeypatch.delenv("COURSE_RESULTS_DIR", raising=False)  # the committed files, wherever a run points its own
    return results.load(topic, gpu="external")


@pytest.mark.parametrize("topic", TOPICS)
def test_loads_with_provenance(topic, monkeypatch):
    res = _load(topic, monkeypatch)
    assert res.path == results.REPO_ROOT / "results" / "external" / f"{topic}.json"
    p = res.provenance
    assert PROVENANCE_KEYS <= set(p), f"{topic}: provenance lacks {PROVENANCE_KEYS - set(p)}"
    assert p["kind"] == "external: not measured by this course"
    assert p["source"].startswith("https://github.com/")
    assert p["source_commit"] is None or isinstance(p["source_commit"], str)
    assert all(isinstance(p[k], str) and p[k] for k in PROVENANCE_KEYS - {"source_commit"})
    assert res.records and all(isinstance(v, (str, int, float, bool, type(None)))
                               for r in res.records for v in r.values())


def test_h2ogpt_rows(monkeypatch):
    res = _load("h2ogpt_generate", monkeypatch)
    assert COMMIT.match(res.provenance["source_commit"]) and res.provenance["source_commit"] in res.provenance["source"]
    table = {(r["bits"], r["gpu"]): r["generation_tokens_per_s"] for r in res.records}
    assert len(table) == len(res.records) and table == H2OGPT
    assert all(r["gpus"] == 1 for r in res.records)


def test_fms_acceleration_rows(monkeypatch):
    res = _load("fms_acceleration_qlora", monkeypatch)
    rows = {(r["gpu"], r["num_gpus"], r["per_device_train_batch_size"]): r["train_tokens_per_s"] for r in res.records}
    assert len(rows) == len(res.records) and rows == FMS
    for r in res.records:
        assert r["source_commit"] == FMS_COMMITS[r["gpu"]]
        assert r["framework_config"] == "accelerated-peft-bnb" and r["model"] == "mistralai/Mistral-7B-v0.1"


def test_tensorrt_llm_rows(monkeypatch):
    res = _load("tensorrt_llm_serving", monkeypatch)
    rows = {(r["gpu_table"], r["batch_size"], r["input_len"], r["output_len"]): r["output_tokens_per_s_per_gpu"]
            for r in res.records}
    assert len(rows) == len(res.records) and rows == TRT
    for r in res.records:
        assert r["model"] == "LLaMA 7B" and r["tensor_parallel"] == 1
        assert r["precision"] == ("FP16" if r["gpu_table"].startswith("A100") else "FP8")
