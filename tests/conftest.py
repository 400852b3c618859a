import math

import pytest
import torch


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
