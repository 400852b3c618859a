"""Sample the GPU in a background thread while a block of code runs: utilisation, memory, power
(NVML's trailing average and, where the driver has it, the instantaneous reading), SM clock and the reasons
NVML gives for holding the clock down, read through NVML (what nvitop shows, as data).

    with GpuMonitor() as mon:
        train_step()
    mon.summary()   # {"util_pct_mean": ..., "mem_used_gb_max": ..., ...}
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Sample:
    t_s: float  # seconds since the monitor started
    util_pct: float  # GPU utilisation: % of time a kernel was running
    mem_used_gb: float
    mem_pct: float
    power_w: float
    sm_clock_mhz: float
    clock_events: int = 0  # bit mask of NVML's clock-event (throttle) reasons: CLOCK_EVENTS names the bits
    power_instant_w: float | None = None  # NVML_FI_DEV_POWER_INSTANT; None where the driver lacks it


# NVML's clock-event reasons (nvml.h, nvmlClocksEventReason*; "throttle reasons" in older NVML): why the SM
# clock is below the highest one allowed. Bits not named here are reported as "other".
CLOCK_EVENTS = {
    0x1: "GPU idle",
    0x2: "applications clock setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


def clock_event_names(mask: int) -> list[str]:
    """The reasons set in an NVML clock-event bit mask, by name ("other" for bits NVML added later)."""
    names = [name for bit, name in CLOCK_EVENTS.items() if mask & bit]
    return names + ["other"] if mask & ~sum(CLOCK_EVENTS) else names


def nvml_reader(index: int | None = None) -> Callable[[], Sample]:
    """A function that reads one sample of GPU ``index`` (the current CUDA device by default)."""
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("GPU monitoring needs nvidia-ml-py (pip install nvidia-ml-py)") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"NVML could not start ({exc}): no NVIDIA driver on this machine?") from exc
    handle = _nvml_handle(pynvml, index)
    clock_events = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons  # the older name, in older nvidia-ml-py
    instant = _instant_power(pynvml, handle) is not None

    def read(t_s: float = 0.0) -> Sample:
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return Sample(
            t_s=t_s,
            util_pct=float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            mem_used_gb=mem.used / 1e9,
            mem_pct=100.0 * mem.used / mem.total,
            power_w=pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            sm_clock_mhz=float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            clock_events=int(clock_events(handle)),
            power_instant_w=_instant_power(pynvml, handle) if instant else None,
        )

    return read


def _instant_power(pynvml, handle) -> float | None:
    """NVML's instantaneous board power in W (field NVML_FI_DEV_POWER_INSTANT, in mW), or None where this
    driver or GPU does not report it. ``nvmlDeviceGetPowerUsage`` is instead an average over about a second."""
    field = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)
    if field is None:
        return None
    try:
        value = pynvml.nvmlDeviceGetFieldValues(handle, [field])[0]
    except (pynvml.NVMLError, AttributeError, TypeError):  # a driver, or a binding, without field values
        return None
    return value.value.uiVal / 1e3 if value.nvmlReturn == pynvml.NVML_SUCCESS else None


def card_limits(index: int | None = None) -> tuple[int | None, int | None]:
    """GPU ``index``'s highest SM clock (MHz) and its power limit (W) as NVML reports them; None where it cannot."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, index)
        clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
        power = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) // 1000
    except Exception:  # no nvidia-ml-py, no driver, or an NVML too old for one of the calls
        return None, None
    return int(clock), int(power)


def _nvml_handle(pynvml, index: int | None):
    """NVML's handle for a CUDA device; matched by UUID because NVML and CUDA may number GPUs differently."""
    if index is None and torch.cuda.is_available():
        index = torch.cuda.current_device()
    index = index or 0
    if torch.cuda.is_available():
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass  # fall back to NVML's own numbering
    count = pynvml.nvmlDeviceGetCount()
    if not 0 <= index < count:
        raise ValueError(f"GPU index {index} out of range: NVML sees {count} GPU(s)")
    return pynvml.nvmlDeviceGetHandleByIndex(index)


class GpuMonitor:
    """Context manager that samples every ``interval_s`` seconds in a daemon thread.

    ``read`` defaults to NVML on the current GPU; pass another callable ``read(t_s) -> Sample`` to
    sample something else (tests do).
    """

    def __init__(self, interval_s: float = 0.1, read: Callable[[float], Sample] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self._read = read
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> "GpuMonitor":
        if self._read is None:
            self._read = nvml_reader()
        self.samples = []
        self._stop.clear()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        if self._error is None:
            try:  # one sample at the very end
                self.samples.append(self._read(time.perf_counter() - self._t0))
            except Exception as error:
                self._error = error
        if self._error is not None:
            raise RuntimeError(f"GPU monitor failed while sampling: {self._error}") from self._error

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.samples.append(self._read(time.perf_counter() - self._t0))
                self._stop.wait(self.interval_s)
        except BaseException as exc:  # surfaced in __exit__
            self._error = exc

    def summary(self) -> dict:
        """Mean and max of each quantity over the samples, as a flat dict (ready for a results record)."""
        if not self.samples:
            raise RuntimeError("no samples: use the monitor as a context manager around the code to watch")
        out: dict = {"samples": len(self.samples)}
        for field in ("util_pct", "mem_used_gb", "mem_pct", "power_w", "power_instant_w", "sm_clock_mhz"):
            values = [getattr(s, field) for s in self.samples if getattr(s, field) is not None]
            if values:
                out[f"{field}_mean"] = statistics.fmean(values)
                out[f"{field}_max"] = max(values)
        return out

    def clock_events(self, since_s: float = 0.0, until_s: float = math.inf) -> dict[str, float]:
        """The share of the samples taken from ``since_s`` to ``until_s`` in which NVML set each clock-event
        reason, by name ("none" for samples with no reason set)."""
        chosen = [s for s in self.samples if since_s <= s.t_s <= until_s]
        if not chosen:
            raise RuntimeError(f"no samples from {since_s} s to {until_s} s")
        counts: dict[str, int] = {}
        for s in chosen:
            for name in clock_event_names(s.clock_events) or ["none"]:
                counts[name] = counts.get(name, 0) + 1
        return {name: n / len(chosen) for name, n in counts.items()}

    def as_records(self) -> list[dict]:
        """Every sample as a flat dict (for a plot or a DataFrame)."""
        return [asdict(s) for s in self.samples]
