import sys
import time
import types

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


def fake_pynvml(instant_ok=True, new_names=True):
    """A stand-in for the pynvml module: one GPU at 1,500 MHz, 400 W averaged, 650 W instantaneous."""
    class NVMLError(Exception):
        pass

    field = types.SimpleNamespace(nvmlReturn=0 if instant_ok else 3, value=types.SimpleNamespace(uiVal=650_000))
    nvml = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_SUCCESS=0, NVML_CLOCK_SM=1, NVML_FI_DEV_POWER_INSTANT=186,
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: "gpu0",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2e9, total=8e9),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=100),
        nvmlDeviceGetPowerUsage=lambda h: 400_000, nvmlDeviceGetClockInfo=lambda h, kind: 1500,
        nvmlDeviceGetFieldValues=lambda h, ids: [field])
    reasons = lambda h: 0x4  # noqa: E731
    if new_names:
        nvml.nvmlDeviceGetCurrentClocksEventReasons = reasons
    else:
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons = reasons
    return nvml


@pytest.mark.parametrize("instant_ok, new_names", [(True, True), (False, False)])
def test_nvml_reader_reads_clock_events_and_instant_power(monkeypatch, instant_ok, new_names):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(instant_ok, new_names))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    s = nvml_reader()(0.5)
    assert (s.t_s, s.util_pct, s.mem_pct, s.power_w, s.sm_clock_mhz) == (0.5, 100.0, 25.0, 400.0, 1500.0)
    assert clock_event_names(s.clock_events) == ["software power cap"]
    assert s.power_instant_w == (650.0 if instant_ok else None)
