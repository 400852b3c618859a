"""scripts/step_parts.py: a run keeps the earlier records of every point it did not measure again."""
import importlib.util

from helpers import results
from helpers.results import REPO_ROOT

spec = importlib.util.spec_from_file_location("step_parts_script", REPO_ROOT / "scripts" / "step_parts.py")
step_parts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_parts)


def test_a_13b_run_keeps_7bs_points_and_the_decoders(monkeypatch, tmp_path):
    old = [{"what": "train_parts", "model": "7b", "batch_size": 1},
           {"what": "train_parts", "model": "13b", "batch_size": 1, "step_s": 9.0},
           {"what": "decode_parts", "model": "7b", "context": 64}]
    saved = results.Result(tmp_path / "step_parts.json", {"git_commit": "abc", "timestamp": "then"}, old)
    monkeypatch.setattr(step_parts.results, "load", lambda *a, **k: saved)
    kept = step_parts.earlier_records({("train_parts", "13b", 1, None), ("train_parts", "13b", 4, None)})
    assert [(r["model"], r["what"]) for r in kept] == [("7b", "train_parts"), ("7b", "decode_parts")]
    assert all(r["git_commit"] == "abc" and r["timestamp"] == "then" for r in kept)


def test_no_earlier_file_keeps_nothing(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("step_parts.json")
    monkeypatch.setattr(step_parts.results, "load", missing)
    assert step_parts.earlier_records(set()) == []
