import time

import pytest
import torch

from helpers.monitor import GpuMonitor, Sample, clock_event_names, nvml_reader


def fake_reader():
    calls = []

    def read(t_s):
        calls.append(t_s)
        return Sample(t_s, util_pct=50.0 + len(calls), mem_used_gb=1.0, mem_pct=10.0, power_w=100.0,
                      sm_clock_mhz=1500.0)

    return read, calls


def test_samples_in_background_while_the_block_runs():
    read, calls = fake_reader()
    with GpuMonitor(interval_s=0.01, read=read) as mon:
        time.sleep(0.15)
    assert len(mon.samples) >= 5
    assert [s.t_s for s in mon.samples] == sorted(s.t_s for s in mon.samples)
    s = mon.summary()
    assert s["samples"] == len(mon.samples)
    assert s["util_pct_max"] == 50.0 + len(calls)
    assert s["util_pct_mean"] < s["util_pct_max"]
    assert mon.as_records()[0]["mem_pct"] == 10.0


def test_clock_event_bits_are_named():
    assert clock_event_names(0) == []
    assert clock_event_names(0x4 | 0x8) == ["software power cap", "hardware slowdown"]
    assert clock_event_names(0x1 | 0x1000) == ["GPU idle", "other"]


def test_clock_event_shares_and_missing_instant_power():
    masks = iter([0x1, 0x1, 0x4, 0x4, 0x4 | 0x8, 0x0] + [0x0] * 1000)

    def read(t_s):
        return Sample(t_s, 100.0, 1.0, 10.0, 400.0, 1500.0, clock_events=next(masks))

    mon = GpuMonitor(interval_s=1.0, read=read)
    mon.samples = [read(float(t)) for t in range(6)]
    shares = mon.clock_events()
    assert shares == {"GPU idle": 2 / 6, "software power cap": 3 / 6, "hardware slowdown": 1 / 6, "none": 1 / 6}
    assert mon.clock_events(since_s=2.0) == {"software power cap": 0.75, "hardware slowdown": 0.25, "none": 0.25}
    assert mon.clock_events(since_s=2.0, until_s=3.0) == {"software power cap": 1.0}
    assert "power_instant_w_mean" not in mon.summary()  # no instantaneous reading: left out, not averaged as 0
    with pytest.raises(RuntimeError, match="no samples"):
        mon.clock_events(since_s=10.0)


def test_sampler_errors_surface_on_exit():
    def broken(t_s):
        raise OSError("nvml went away")

    with pytest.raises(RuntimeError, match="nvml went away"):
        with GpuMonitor(interval_s=0.01, read=lambda t: broken(t) if t > 0.02 else Sample(t, 0, 0, 0, 0, 0)):
            time.sleep(0.1)


def test_bad_interval_and_empty_summary():
    with pytest.raises(ValueError):
        GpuMonitor(interval_s=0)
    with pytest.raises(RuntimeError, match="context manager"):
        GpuMonitor().summary()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a driver")
def test_nvml_without_driver_is_a_clear_error():
    with pytest.raises(RuntimeError, match="NVML"):
        nvml_reader()
