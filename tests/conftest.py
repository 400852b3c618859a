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


@pytest.fixture
def program_order(monkeypatch):
    """A function that sets the order in which Triton's interpreter runs the programs of each launch after it:
    ``"grid"`` (the interpreter's own: one program after another, in grid order), ``"reversed"`` or
    ``"shuffled"`` (a permutation per launch, from the test's seed). A GPU runs programs in any order, so a
    kernel whose programs depend on each other (an atomic ticket that elects the last one) is right only if
    it is right in every order. Without the interpreter the function does nothing: the GPU picks the order."""
    import helpers  # here, not above: helpers switches Triton to its interpreter before triton is first imported

    state = {"order": "grid", "perm": None, "next": 0}

    def choose(order: str) -> None:
        if order not in ("grid", "reversed", "shuffled"):
            raise ValueError(f"order must be 'grid', 'reversed' or 'shuffled', got {order!r}")
        state["order"] = order

    if not helpers.INTERPRET:
        return choose
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder  # the interpreter sets the grid, then each program's index, on it
    set_grid_dim, set_grid_idx = builder.set_grid_dim, builder.set_grid_idx

    def grid_dim(nx, ny, nz):
        set_grid_dim(nx, ny, nz)
        n, order = nx * ny * nz, state["order"]
        perm = None if order == "grid" else range(n - 1, -1, -1) if order == "reversed" else torch.randperm(n).tolist()
        state.update(perm=perm, next=0)

    def grid_idx(x, y, z):
        if state["perm"] is not None:  # the interpreter's i-th program in grid order runs program perm[i]
            _, ny, nz = builder.grid_dim
            i = state["perm"][state["next"]]
            state["next"] += 1
            x, y, z = i // (ny * nz), i // nz % ny, i % nz
        set_grid_idx(x, y, z)

    monkeypatch.setattr(builder, "set_grid_dim", grid_dim)
    monkeypatch.setattr(builder, "set_grid_idx", grid_idx)
    return choose


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped on a machine without CUDA (``pytest -m gpu`` runs them on a GPU)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="marked gpu: needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
