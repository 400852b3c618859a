import importlib.util
from types import SimpleNamespace

import pytest

from helpers import device, results

spec = importlib.util.spec_from_file_location("gpu_tests", results.REPO_ROOT / "scripts" / "gpu_tests.py")
gpu_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_tests)


def report(nodeid, when, outcome, duration=0.5):
    return SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, duration=duration, passed=outcome == "passed",
                           failed=outcome == "failed")


def test_one_record_per_test_with_its_outcome():
    plugin = gpu_tests.Outcomes()
    for r in [report("a", "setup", "passed"), report("a", "call", "passed", 1.23456), report("a", "teardown", "passed"),
              report("b", "setup", "skipped"), report("c", "setup", "failed"), report("d", "setup", "passed"),
              report("d", "call", "failed")]:
        plugin.pytest_runtest_logreport(r)
    assert plugin.records == [{"test": "a", "outcome": "passed", "seconds": 1.235},
                              {"test": "b", "outcome": "skipped", "seconds": 0.5},
                              {"test": "c", "outcome": "error", "seconds": 0.5},
                              {"test": "d", "outcome": "failed", "seconds": 0.5}]
    assert gpu_tests.summary(plugin.records) == {"passed": 1, "skipped": 1, "error": 1, "failed": 1}


@pytest.mark.skipif(device.HAS_CUDA, reason="checks the refusal on a machine without a GPU")
def test_refuses_to_run_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_tests.main([])
    assert exit_.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err



def test_the_recorded_gpu_run_has_no_failures():
    """The committed record of the last GPU run (scripts/gpu_tests.py on the H200)."""
    saved = results.load(gpu_tests.TOPIC, gpu="h200")
    counts = gpu_tests.summary(saved.records)
    assert counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("error"), counts
    assert saved.provenance["gpu"] == "NVIDIA H200" and saved.provenance["git_commit"]
