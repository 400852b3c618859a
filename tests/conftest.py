import math
import os
import random
import zlib

import numpy as np
import pytest
import torch

SEED_BASE_VARIABLE = "TEST_SEED"  # another base draws other random inputs for every test
_SEED = pytest.StashKey[int]()


def seed_for(nodeid: str, base: int = 0) -> int:
    """The seed of the test ``nodeid``: fixed for a node id and a base, different between tests."""
    return (zlib.crc32(nodeid.encode()) + base) % 2**32


@pytest.fixture(autouse=True)
def _seeded(request):
    """Seeds torch (every device), numpy and random before each test from its node id and the base in
    $TEST_SEED (0 unless set), so that a failing draw replays; a failure's report names the seed."""
    base = int(os.environ.get(SEED_BASE_VARIABLE, "0"))
    seed = seed_for(request.node.nodeid, base)
    request.node.stash[_SEED] = seed
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    seed = item.stash.get(_SEED, None)
    if report.failed and seed is not None:
        base = os.environ.get(SEED_BASE_VARIABLE, "0")
        report.sections.append(("random seed", f"torch, numpy and random were seeded with {seed} (from the node id "
                                               f"and {SEED_BASE_VARIABLE}={base}); rerunning this test replays it"))
    return report


@pytest.fixture
def poisoned(monkeypatch):
    """Every float tensor that host code allocates with torch.empty or torch.empty_like starts as NaN,
    so an output element that no program of a kernel wrote fails the check. (Integer buffers, such as
    an L2-flush buffer, are left alone.)"""
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t):
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: nan(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: nan(empty_like(*a, **k)))



def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped on a machine without CUDA (``pytest -m gpu`` runs them on a GPU)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="marked gpu: needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
