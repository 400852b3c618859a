"""helpers.studies.fused_kernel_timing: the inputs notebook 04 times, and the share of the copy ceiling."""
import pytest
import torch

from helpers.studies import fused_kernel_timing


def test_setup_gives_rows_of_the_asked_width():
    m, x, b, w, lb = fused_kernel_timing.setup(100, torch.float16, elems=1000)
    assert m == 10 and x.shape == (10, 100) and x.dtype == torch.float16
    assert all(t.shape == (100,) and t.dtype == torch.float16 for t in (b, w, lb))
    with pytest.raises(ValueError, match="n <= elems"):
        fused_kernel_timing.setup(2000, torch.float32, elems=1000)


def test_time_it_runs_the_call():
    calls = []
    t = fused_kernel_timing.time_it(lambda: calls.append(1))
    assert calls and t.ms >= 0


def test_pct_of_copy():
    assert fused_kernel_timing.pct_of_copy(2e9, 1000.0, 4.0) == pytest.approx(50.0)  # 2 GB/s of a 4 GB/s ceiling
    with pytest.raises(ValueError, match="ms > 0"):
        fused_kernel_timing.pct_of_copy(1.0, 0.0, 4.0)
