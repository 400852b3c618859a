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


def _ladder(dtype, n, ms, pct):
    impls = [(None, "eager"), (None, "torch.compile"), (1, "plain, library erf"), (2, "cheaper exact GELU"),
             (3, "rows per program"), (4, "tuned kernel")]
    return [{"rung": r, "impl": i, "dtype": dtype, "N": n, "ms": t, "pct_of_copy": p}
            for (r, i), t, p in zip(impls, ms, pct)]


def test_ladder_steps_say_what_each_rung_bought():
    recs = (_ladder("fp32", 1024, [6.0, 2.0, 3.0, 2.0, 1.0, 1.25], [20, 60, 40, 60, 99, 96])
            + _ladder("bf16", 1024, [4.0, 2.0, 2.0, 1.0, 1.0, 0.8], [20, 40, 40, 80, 80, 97]))
    df = fused_kernel_timing.ladder_frame(recs)
    assert list(dict.fromkeys(df["bar"]))[:3] == ["eager", "torch.compile", "1 plain, library erf"]
    lines = fused_kernel_timing.ladder_steps(recs)
    assert lines[0] == ("fp32 N = 1024: rung 1 is 2.00x eager; each rung over the one before: 2: 1.50x, 3: 2.00x, "
                        "4: 0.80x")
    assert lines[1] == "  the largest step: 3 rows per program; the tuned kernel 4.80x eager, 1.60x torch.compile"
    assert lines[2] == "  rung 3 already ran at 99% of copy: nothing left for the tuned kernel to gain (96%)"
    assert lines[3].startswith("bf16 N = 1024: rung 1 is 2.00x eager")
    assert "largest step: 2 cheaper exact GELU" in lines[4]
    assert len(lines) == 5  # bf16's rungs stayed under 98% of copy: no such line
