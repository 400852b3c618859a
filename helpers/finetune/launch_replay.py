"""A step's launch timeline, replayed with its kernels sped up or slowed down: the host's issue times kept as measured,
the device's work scaled, the overlap between the two worked out again.

The step model's ``host`` part is a step's wall time minus its kernels' time. That is the time the device waited for
the host, not the host's own time: on a slower device more of the host's work hides behind kernels and the part
shrinks; on a faster one it grows. The profiler records, for every launch, when the host issued it and when and how
long the device ran it, and when the host blocked on the device (a synchronisation). From that:

* ``Timeline.host_issue_us``: the host's issue time, the span of the step less the time the host spent blocked;
* ``Timeline.replay``: the step's wall time when each kernel's time is multiplied by a factor (a card's rate ratio
  for the kernel's part): each launch is issued when the host issued it, shifted by how much sooner or later the
  host came back from each synchronisation before it; it starts when it is issued (plus the launch latency measured
  on this run) or when the device is free, whichever is later.

With every factor 1 the replay gives back the measured step (``tests/test_launch_replay.py``).
"""
from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..bench import profiled
from ..results import beside, read_beside, write_beside

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # the device's events in a Kineto trace
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpyDtoH_v2")  # they return once the device caught up


@dataclass(frozen=True)
class Launch:
    """One kernel (or copy): when the host issued it, when the device started it, how long it ran (microseconds on
    the profiler's clock) and its name."""

    issued_us: float
    start_us: float
    duration_us: float
    name: str


@dataclass(frozen=True)
class Sync:
    """A call in which the host waited for the device: when it was made and when it returned."""

    called_us: float
    returned_us: float


@dataclass(frozen=True)
class Timeline:
    """A step's launches and synchronisations, from its first host event to its last synchronisation's return."""

    launches: tuple[Launch, ...]
    syncs: tuple[Sync, ...]

    def __post_init__(self):
        if not self.launches or not self.syncs:
            raise ValueError("a timeline needs at least one launch and a synchronisation that ends the step")
        if self.syncs[-1].returned_us < max(launch.start_us + launch.duration_us for launch in self.launches):
            raise ValueError("the last synchronisation returns before the device finished: the step's end is unknown")

    @property
    def begin_us(self) -> float:
        return min(self.launches[0].issued_us, self.syncs[0].called_us)

    def wall_us(self) -> float:
        """The measured step: its first host event to its last synchronisation's return."""
        return self.syncs[-1].returned_us - self.begin_us

    def device_us(self) -> float:
        """The device's busy time: every launch's duration."""
        return sum(launch.duration_us for launch in self.launches)

    def host_issue_us(self) -> float:
        """The host's own time: from the step's start to its last launch, less the time blocked in synchronisations
        before it (a measurement of the host, unlike wall minus device)."""
        last = self.launches[-1].issued_us
        blocked = sum(min(s.returned_us, last) - s.called_us for s in self.syncs if s.called_us < last)
        return last - self.begin_us - blocked

    def launch_latency_us(self) -> float:
        """Issue to start, median over the launches that found the device idle (the run's own launch latency)."""
        free, gaps = -float("inf"), []
        for launch in self.launches:
            if launch.start_us >= free and launch.issued_us >= free:
                gaps.append(launch.start_us - launch.issued_us)
            free = max(free, launch.start_us + launch.duration_us)
        return statistics.median(gaps) if gaps else 0.0

    def replay(self, factor: Callable[[str], float]) -> float:
        """The step's wall time (microseconds) with each launch's duration multiplied by ``factor(name)``."""
        latency = self.launch_latency_us()
        events = sorted([(launch.issued_us, 0, launch) for launch in self.launches]
                        + [(s.called_us, 1, s) for s in self.syncs], key=lambda e: (e[0], e[1]))
        shift, free, measured_free = 0.0, -float("inf"), -float("inf")
        for _, is_sync, event in events:
            if is_sync:  # the host comes back as long after the device catches up as it did when measured
                slack = event.returned_us - max(measured_free, event.called_us)
                shift = max(free, event.called_us + shift) + slack - event.returned_us
                continue
            start = max(event.issued_us + shift + latency, free)
            free = start + event.duration_us * factor(event.name)
            measured_free = max(measured_free, event.start_us + event.duration_us)
        return self.syncs[-1].returned_us + shift - self.begin_us


def to_record(timeline: Timeline, name: Callable[[str], str] = str) -> dict:
    """The timeline's summary times, and its events (``"launches"``: ``[issued, start, duration, name(kernel)]``,
    ``"syncs"``: ``[called, returned]``, microseconds from the step's start; ``name``: for example a kernel's part,
    to keep the file small). ``save_events`` writes the events apart from the flat results record."""
    t0 = timeline.begin_us
    return {"wall_us": timeline.wall_us(), "device_us": timeline.device_us(), "host_issue_us": timeline.host_issue_us(),
            "launch_latency_us": timeline.launch_latency_us(), "launch_count": len(timeline.launches),
            "launches": [[round(x.issued_us - t0, 3), round(x.start_us - t0, 3), round(x.duration_us, 3), name(x.name)]
                         for x in timeline.launches],
            "syncs": [[round(s.called_us - t0, 3), round(s.returned_us - t0, 3)] for s in timeline.syncs]}


def from_record(record: dict) -> Timeline:
    """A timeline back from :func:`to_record`'s events."""
    return Timeline(tuple(Launch(*x) for x in record["launches"]), tuple(Sync(*s) for s in record["syncs"]))


EVENTS = ("launches", "syncs")


EVENTS_SUFFIX = "_events.json.gz"  # the file beside a results file that holds its points' events


def events_path(results_path: Path) -> Path:
    """The gzipped JSON beside a results file that holds its points' events (too many for a flat record)."""
    return beside(results_path, EVENTS_SUFFIX)


def save_events(results_path: Path, records: list[dict]) -> None:
    """Each record's events, keyed "model:batch_size", written beside ``results_path``."""
    write_beside(results_path, EVENTS_SUFFIX,
                 json.dumps({f"{r['model']}:{r['batch_size']}": {k: r[k] for k in EVENTS} for r in records}))


def load_events(results_path: Path) -> dict[str, Timeline]:
    """The timelines ``save_events`` wrote beside ``results_path``, by "model:batch_size"."""
    return {key: from_record(events) for key, events in json.loads(read_beside(results_path, EVENTS_SUFFIX)).items()}


def from_trace(trace: dict) -> Timeline:
    """The launches and synchronisations of a Kineto (``torch.profiler``) Chrome trace: each device event joined to
    the host call that issued it by their correlation id."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    issued = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    launches = sorted((Launch(issued[e["args"]["correlation"]], e["ts"], e["dur"], e["name"]) for e in events
                       if e.get("cat") in DEVICE_CATS and e.get("args", {}).get("correlation") in issued),
                      key=lambda launch: launch.issued_us)
    syncs = sorted((Sync(e["ts"], e["ts"] + e["dur"]) for e in events
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in SYNC_CALLS),
                   key=lambda s: s.called_us)
    return Timeline(tuple(launches), tuple(syncs))


def record(fn: Callable[[], object]) -> Timeline:
    """``fn()`` once under the profiler (after one call to warm up, ``bench.profiled``), the device synchronised at
    its end: its timeline. Needs a CUDA GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError("a launch timeline needs a CUDA GPU (the profiler's device events)")
    prof = profiled(fn)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        return from_trace(json.loads(path.read_text()))
