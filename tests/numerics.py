"""Numerical comparisons shared by the kernel tests (``from numerics import rel_err``: pytest puts this folder
on ``sys.path``, as it does for every test module of a folder without ``__init__.py``)."""
from __future__ import annotations

import torch


def rel_err(got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None) -> float:
    """``norm(got - ref) / norm(scale)`` in float64 on the CPU, the scale being ``ref`` unless given.

    A NaN in ``got`` fails the check outright (with the ``poisoned`` fixture it marks an element that no
    program wrote), rather than making the ratio NaN, which compares false with every tolerance anyway but
    says less."""
    got = got.detach().to("cpu", torch.float64)
    assert not torch.isnan(got).any(), "NaN in the result (an element left unwritten?)"
    ref = ref.detach().to("cpu", torch.float64)
    scale = ref if scale is None else scale.detach().to("cpu", torch.float64)
    return ((got - ref).norm() / scale.norm()).item()
