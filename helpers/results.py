"""The one reader and writer of ``results/<gpu>/<topic>.json``.

A file holds ``{"provenance": {...}, "records": [flat dicts]}``. Full-scale runs write to the
repository's ``results/``; smoke-scale runs write to ``.smoke-results/`` (git-ignored), so a CPU
or smoke run can never overwrite a GPU measurement. ``COURSE_RESULTS_DIR`` overrides both.
"""
from __future__ import annotations

import datetime as _dt
import gzip
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .device import HAS_CUDA, SCALE, gpu_name

REPO_ROOT = Path(__file__).resolve().parents[1]
_TOPIC = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")
_PACKAGES = ("triton", "bitsandbytes", "transformers", "peft")


def results_dir(scale: str | None = None) -> Path:
    """Where results of this scale live: ``results/`` for full runs, ``.smoke-results/`` otherwise."""
    if os.environ.get("COURSE_RESULTS_DIR"):
        return Path(os.environ["COURSE_RESULTS_DIR"])
    return REPO_ROOT / ("results" if (scale or SCALE) == "full" else ".smoke-results")


def gpu_slug(name: str | None = None, count: int = 1) -> str:
    """Short folder name for a device: "NVIDIA H200" -> "h200", ``count=2`` of them -> "h200x2", no GPU -> "cpu".

    ``count`` is the number of GPUs a measurement *used* (not how many the machine has)."""
    name = name if name is not None else gpu_name()
    slug = re.sub(r"^(nvidia|tesla)\s+", "", name.strip().lower())
    slug = re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "unknown"
    return f"{slug}x{count}" if count > 1 else slug


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    if not HAS_CUDA:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing or unusable: the record says so rather than failing the run
        return None


def _cpu_name() -> str | None:
    """The host CPU's model name (Linux: /proc/cpuinfo): a step's host time is this CPU's, not the GPU's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git_commit() -> str | None:
    """HEAD of the checkout (with "-dirty" if tracked files changed); COURSE_GIT_COMMIT where no .git travelled."""
    if os.environ.get("COURSE_GIT_COMMIT"):
        return os.environ["COURSE_GIT_COMMIT"]
    try:
        # safe.directory: a checkout copied to another machine belongs to another user there
        git = ["git", "-c", f"safe.directory={REPO_ROOT}"]
        out = subprocess.run([*git, "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def provenance() -> dict:
    """What produced a measurement: GPU, driver, CUDA, package versions, host CPU, commit, time, scale."""
    info = {
        "gpu": gpu_name(),
        "gpu_count": torch.cuda.device_count() if HAS_CUDA else 0,
        "driver": _driver_version(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        **{pkg: _version(pkg) for pkg in _PACKAGES},
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "git_commit": _git_commit(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "scale": SCALE,
    }
    return info


@dataclass(frozen=True)
class Result:
    """A results file read back."""

    path: Path
    provenance: dict
    records: list[dict]

    def where(self, **fields) -> list[dict]:
        """The records whose fields equal all of ``fields``."""
        return [r for r in self.records if all(r.get(k) == v for k, v in fields.items())]

    def describe(self) -> str:
        p = self.provenance
        return (f"{p.get('gpu')} (driver {p.get('driver')}, CUDA {p.get('cuda')}, torch {p.get('torch')}, "
                f"triton {p.get('triton')}), commit {(p.get('git_commit') or 'not recorded')[:12]}, "
                f"{p.get('timestamp')}")

    def short(self) -> str:
        """A line's worth of provenance: "NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, Triton 3.6.0)"."""
        p = self.provenance
        return f"{p.get('gpu')} (torch {p.get('torch')}, Triton {p.get('triton')})"


def _check_topic(topic: str) -> None:
    if not isinstance(topic, str) or not _TOPIC.match(topic):
        raise ValueError(f"topic must be lower-case letters, digits, '_' or '-', got {topic!r}")


def _check_records(records: list[dict]) -> None:
    if not isinstance(records, list) or not records:
        raise ValueError("records must be a non-empty list of dicts")
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise TypeError(f"record {i} is a {type(record).__name__}, not a dict")
        for key, value in record.items():
            if not isinstance(key, str):
                raise TypeError(f"record {i}: key {key!r} is not a string")
            if value is not None and not isinstance(value, (str, int, float, bool)):
                raise TypeError(f"record {i}: field {key!r} holds a {type(value).__name__}; records are flat "
                                "(str, int, float, bool or None)")


REFERENCE_GPU = "h100-80gb-hbm3"  # the course's reference run: every notebook executed on one H100 80GB
SECOND_GPU = "h200"  # the same chip with faster memory, for the side-by-side comparison


def source_gpu(topic: str, prefer: str | None = None, gpus: int = 1) -> str:
    """The GPU folder a committed ``topic`` is read from: ``prefer`` (default: this GPU's) where it holds the
    topic, else the reference H100's, else the H200's; ``gpus``: a run on that many GPUs ("h200x2").
    FileNotFoundError names the folders that hold it."""
    _check_topic(topic)
    many = f"x{gpus}" if gpus > 1 else ""
    folders = [prefer or gpu_slug(count=gpus), REFERENCE_GPU + many, SECOND_GPU + many]
    for gpu in folders:
        if path_for(topic, gpu, "full").exists():
            return gpu
    known = sorted(p.parent.name for p in results_dir("full").glob(f"*/{topic}.json"))
    raise FileNotFoundError(f"no results for topic {topic!r} in {folders}; available for: {known or 'no GPU yet'}")


def path_for(topic: str, gpu: str | None = None, scale: str | None = None) -> Path:
    """The file that holds ``topic`` for ``gpu`` (a slug such as "h200"; this machine's by default)."""
    _check_topic(topic)
    return results_dir(scale) / (gpu or gpu_slug()) / f"{topic}.json"


def save(topic: str, records: list[dict], gpus: int = 1) -> Path:
    """Write ``records`` with this run's provenance to ``results/<gpu>/<topic>.json`` (atomically);
    ``gpus``: how many GPUs the measurement used (2 -> ``results/h200x2/``)."""
    _check_records(records)
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    if SCALE == "full" and not HAS_CUDA and not os.environ.get("COURSE_RESULTS_DIR"):
        raise RuntimeError(f"{topic}: a full-scale run on a machine without a GPU would write results/cpu/ beside "
                           "the GPU results; run at smoke scale (unset COURSE_SCALE) or set COURSE_RESULTS_DIR")
    path = path_for(topic, gpu_slug(count=gpus))
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"provenance": provenance(), "records": records}
    if payload["provenance"]["git_commit"] is None and SCALE == "full":
        warnings.warn(f"{path.name}: no git commit recorded (no .git here); set COURSE_GIT_COMMIT to the commit "
                      "whose code ran, so the result can be traced to it", stacklevel=2)
    write_atomically(path, json.dumps(payload, indent=1, allow_nan=False) + "\n")
    return path


def beside(path: Path, suffix: str) -> Path:
    """The file beside the results file ``path`` that holds what a flat record cannot (``suffix``, e.g.
    ``"_events.json.gz"``)."""
    return path.with_name(path.stem + suffix)


def write_beside(path: Path, suffix: str, text: str) -> Path:
    """``text`` gzipped (``suffix`` ends in ".gz"; no timestamp inside, so the same text gives the same bytes) into
    the file :func:`beside` the results file ``path``."""
    if not suffix.endswith(".gz"):
        raise ValueError(f"suffix must end in .gz (the file is gzipped), got {suffix!r}")
    target = beside(path, suffix)
    target.write_bytes(gzip.compress(text.encode(), mtime=0))
    return target


def read_beside(path: Path, suffix: str) -> str:
    """What :func:`write_beside` wrote beside ``path``."""
    return gzip.decompress(beside(path, suffix).read_bytes()).decode()


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash at any moment leaves the old file or the new one: a
    temporary file of its own in the same folder, on disk (fsync) before it is renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # a name no other writer has
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(topic: str, gpu: str | None = None, scale: str = "full") -> Result:
    """Read ``results/<gpu>/<topic>.json`` (committed GPU results by default)."""
    path = path_for(topic, gpu, scale)
    if not path.exists():
        known = sorted(p.parent.name for p in results_dir(scale).glob(f"*/{topic}.json"))
        raise FileNotFoundError(f"no results for topic {topic!r} on {gpu or gpu_slug()!r} at {path}; "
                                f"available for: {known or 'no GPU yet'}")
    data = json.loads(path.read_text())
    return Result(path, data["provenance"], data["records"])


def find(topic: str, gpu: str) -> Result | None:
    """``results/<gpu>/<topic>.json`` itself, or None where that GPU has no run of it yet (no other GPU's file in
    its place: that is :func:`source_gpu`'s choice)."""
    try:
        return load(topic, gpu=gpu)
    except FileNotFoundError:
        return None


def reference(topic: str) -> Result:
    """The committed run of ``topic`` to show beside a learner's own: the reference H100's, else the H200's.

    On that very GPU at full scale the file is this machine's own, written by an earlier run (the committed one,
    or the learner's last): its GPU name then says so, with the run's time, so that it is never read as this run."""
    res = load(topic, gpu=source_gpu(topic, prefer=REFERENCE_GPU))
    if SCALE == "full" and res.path.parent.name == gpu_slug():
        when = str(res.provenance.get("timestamp") or "time not recorded")[:16].replace("T", " ")
        res = Result(res.path, {**res.provenance, "gpu": f"{res.provenance.get('gpu')}, an earlier run on this GPU "
                                                         f"({when} UTC)"}, res.records)
    return res
