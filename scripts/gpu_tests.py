"""Run the tests marked ``gpu`` (``pytest -m gpu tests``) on this machine's GPU and save what they gave.

The CPU suite (CI) runs Triton's interpreter, which never runs inline PTX, autotuned configs or programs
out of order; the tests marked ``gpu`` check those on a real GPU. Run this whenever the notebooks are
refreshed on a GPU: it writes ``results/<gpu>/gpu_tests.json`` (one record per test: ``test``,
``outcome``, ``seconds``) with the run's provenance, and exits with pytest's exit code.

    python scripts/gpu_tests.py            # every gpu test
    python scripts/gpu_tests.py -k flash   # extra arguments go to pytest
"""
from __future__ import annotations

import argparse
import sys

import pytest

from helpers import device, results

TOPIC = "gpu_tests"


class Outcomes:
    """A pytest plugin that keeps one record per test: its outcome (a failing set-up is an "error")."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = "error" if report.when == "setup" and report.failed else report.outcome
            self.records.append({"test": report.nodeid, "outcome": outcome, "seconds": round(report.duration, 3)})


def summary(records: list[dict]) -> dict[str, int]:
    """How many tests gave each outcome."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="passed on to pytest (e.g. -k flash)")
    args = parser.parse_args(argv)
    if not device.HAS_CUDA:
        parser.error("needs a CUDA GPU: without one every test marked gpu is skipped, and there is nothing to record")
    plugin = Outcomes()
    code = pytest.main(["-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=-ra",
                        str(results.REPO_ROOT / "tests"), *args.pytest_args], plugins=[plugin])
    if not plugin.records:
        print("no test marked gpu ran; nothing saved", file=sys.stderr)
        return int(code) or 1
    path = results.save(TOPIC, plugin.records)
    print(f"{summary(plugin.records)} saved to {path}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
