"""The one resumable runner of the QLoRA experiment: the sweep (``sweep``), its re-timing (``retime``) and the
two-GPU runs (``distributed``) are plans that :func:`run` runs.

A plan (:class:`Plan`) is a list of points, each with a ``key()``, in the order they run. :func:`run` owns what
the three share:

* the store (:class:`Store`): the finished points, an append-only progress file (a JSON line a point, flushed
  to disk) merged with the results file of the plan's topic. A run killed at any moment resumes without losing
  or repeating a point: a point is finished once its line is on disk, a line cut short by a kill is skipped,
  and a results file one point behind its progress file catches up when the store opens;
* the time budget: no new point starts after ``budget_s`` seconds (0: none starts);
* the child processes (:func:`run_child`, through ``helpers.children``): each point, or group, runs in a
  process of its own that cannot outlive the run;
* out-of-memory skipping (:func:`oom_below`): a training point at a larger batch than one of the same settings
  that ran out of memory is recorded as out of memory without running (``measured: False``): memory grows
  with the batch.

What differs, a plan supplies: how one point runs (its records, which the runner stores) or one group (a child
that appends its own records to the progress file), its store, and how its points group. With several GPUs
(``gpus``) a worker a GPU takes a whole group at a time (one model, cap and setting, its batch sizes in order),
so the out-of-memory rule saves the work it saves on one GPU.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .. import children, results
from ..device import SCALE

Report = Callable[[str], None]  # takes a running point's progress reports (shown beside the progress bar)


def default_store(topic: str) -> Path:
    """The progress file of ``topic``, one per scale and GPU: git-ignored under ``build/``, or beside the results
    where ``COURSE_RESULTS_DIR`` moves them (so that the two never come from different places)."""
    moved = os.environ.get("COURSE_RESULTS_DIR")
    root = Path(moved) if moved else results.REPO_ROOT / "build"
    return root / f"{topic.replace('_', '-')}-progress" / f"{SCALE}-{results.gpu_slug()}.jsonl"


def append(path: Path, point: str, records: list[dict]) -> None:
    """Append one finished point to the progress file at ``path``, on disk when this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"point": point, "records": records}) + "\n")
        f.flush()
        os.fsync(f.fileno())


class Store:
    """Finished points (point key -> its records): the progress file at ``path`` (appended a line a point; None:
    none, the results file alone) merged with the results file of ``topic``.

    ``load`` and ``save`` read and write the results file's records (default: ``helpers.results`` at this scale);
    ``point_of`` names the plan point a record belongs to (default: its ``point``)."""

    def __init__(self, path: Path | None, topic: str, *, load: Callable[[], list[dict]] | None = None,
                 save: Callable[[list[dict]], Any] | None = None,
                 point_of: Callable[[dict], str] | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.topic = topic
        self._load = load or (lambda: results.load(topic, scale=SCALE).records)
        self._save = save or (lambda records: results.save(topic, records))
        self._point_of = point_of or (lambda record: record["point"])
        self.lock = threading.Lock()
        self.done: dict[str, list[dict]] = {}
        self.refresh()

    def refresh(self) -> None:
        """Read the finished points again (a child may have added some); a results file behind the progress file
        (a run killed between a point's two writes) catches up."""
        with self.lock:
            done: dict[str, list[dict]] = {}
            try:  # what earlier runs saved (on the GPU machine the results file is what travels between calls)
                for record in self._load():
                    done.setdefault(self._point_of(record), []).append(record)
            except FileNotFoundError:
                pass
            in_results = dict(done)
            if self.path is not None and self.path.exists():
                for line in self.path.read_text().splitlines():
                    if line.strip():
                        try:
                            entry = json.loads(line)
                        except json.JSONDecodeError:  # a line cut short by a kill: that point did not finish
                            continue
                        done[entry["point"]] = entry["records"]
            self.done = done
            if any(in_results.get(point) != recs for point, recs in done.items()):
                self._save(self.records())

    def add(self, point: str, records: list[dict]) -> None:
        """Append a finished point to the progress file and rewrite the results file (thread-safe)."""
        with self.lock:
            if self.path is not None:
                append(self.path, point, records)
            self.done[point] = records
            self._save(self.records())

    def records(self) -> list[dict]:
        return [r for recs in self.done.values() for r in recs]


def pending(points: Iterable, store: Store) -> list:
    """The points of ``points`` not finished in ``store``."""
    return [p for p in points if p.key() not in store.done]


def batch_group(point) -> str:
    """The key shared by the points that differ only in batch size."""
    return replace(point, batch_size=1).key()


def groups(points: list, key: Callable[[Any], str] = batch_group) -> list[list]:
    """``points`` split into groups of one ``key`` (plan order kept within and between them): one worker's unit."""
    out: dict[str, list] = {}
    for p in points:
        out.setdefault(key(p), []).append(p)
    return list(out.values())


def oom_below(point, done: dict[str, list[dict]]):
    """A finished smaller-batch point of the same settings as ``point`` that ran out of memory (None: none)."""
    if point.kind != "train":
        return None
    for smaller in range(1, point.batch_size):
        recs = done.get(replace(point, batch_size=smaller).key())
        if recs and recs[0]["status"] == "oom":
            return replace(point, batch_size=smaller)
    return None


def not_run(point, below_record: dict, below) -> dict:
    """The record of ``point``, not run because ``below`` (a smaller batch, its record ``below_record``) ran out
    of memory."""
    return {**below_record, "point": point.key(), "batch_size": point.batch_size, "measured": False,
            "oom_message": f"not run: batch {below.batch_size} already ran out of memory"}


@dataclass(frozen=True)
class Plan:
    """What one resumable run does: its ``points`` (each with a ``key()``) in the order they run, and

    * ``store``: opens the finished points;
    * ``run_point(point, gpu, report)``: runs one point (on GPU ``gpu``, None: the default device) and returns
      its records, which the runner stores; or None where the point saved its own (the store is read again);
    * or ``run_group(points, gpu, deadline, report)``: runs a whole group in a child that appends each point's
      records to the store's progress file as it finishes and starts none after ``deadline`` (``time.time()``);
      the store is read again after it, also when it fails. Out-of-memory skipping is then the group's own;
    * ``group``: the key of a point's group (default: the points that differ only in batch size);
    * ``skipped``: the record of a point not run after a smaller batch ran out of memory (default: :func:`not_run`).
    """

    points: Sequence
    store: Callable[[], Store]
    run_point: Callable[[Any, str | None, Report], list[dict] | None] | None = None
    run_group: Callable[[list, str | None, float, Report], None] | None = None
    group: Callable[[Any], str] = batch_group
    skipped: Callable[[Any, dict, Any], dict] = not_run
    desc: str = "points"
    unit: str = "point"


def run(plan: Plan, *, budget_s: float | None = None, progress: bool = True,
        gpus: Sequence[str] | None = None) -> Store:
    """Run the points of ``plan`` not finished yet, each saved as it finishes; the store afterwards.

    ``budget_s``: start no new point after this many seconds (so that one call stays inside a time limit; run
    again to go on); 0 starts none. ``gpus``: GPU ids, a worker on each taking a group at a time (None: one
    worker on the default device). The first failure stops every worker (the points finished stay saved) and
    is raised."""
    from tqdm.auto import tqdm

    if (plan.run_point is None) == (plan.run_group is None):
        raise ValueError("a plan runs either its points (run_point) or its groups (run_group)")
    if budget_s is not None and budget_s < 0:
        raise ValueError(f"budget_s must be >= 0, got {budget_s}")
    if gpus is not None and (not gpus or len(set(gpus)) != len(gpus)):
        raise ValueError(f"gpus must be distinct GPU ids, got {list(gpus)}")
    store = plan.store()
    deadline = time.time() + (float("inf") if budget_s is None else budget_s)
    left = pending(plan.points, store)
    todo: queue.Queue = queue.Queue()
    for group in groups(left, plan.group):
        todo.put(group)
    bar = tqdm(total=len(plan.points), initial=len(plan.points) - len(left), desc=plan.desc, unit=plan.unit,
               disable=not progress)
    failures: list[BaseException] = []

    def stop() -> bool:
        return bool(failures) or time.time() >= deadline

    def reporter(key: str) -> Report:
        return lambda text: bar.set_postfix_str(f"{key}: {text}")

    def run_group(group: list, gpu: str | None) -> None:
        try:
            plan.run_group(group, gpu, deadline, reporter(group[0].key()))
        finally:
            before = len(store.done)
            store.refresh()  # what the child finished, the results file caught up
            bar.update(len(store.done) - before)

    def run_points(group: list, gpu: str | None) -> None:
        for point in group:
            if stop():
                return
            key = point.key()
            bar.set_postfix_str(key)
            below = oom_below(point, store.done)
            if below is not None:
                store.add(key, [plan.skipped(point, store.done[below.key()][0], below)])
            else:
                records = plan.run_point(point, gpu, reporter(key))
                if records is None:
                    store.refresh()
                else:
                    store.add(key, records)
            bar.update(1)

    def work(gpu: str | None) -> None:
        while not stop():
            try:
                group = todo.get_nowait()
            except queue.Empty:
                return
            try:
                (run_points if plan.run_group is None else run_group)(group, gpu)
            except BaseException as error:  # stops the other workers too; raised below
                failures.append(error)
                return

    try:
        if gpus is None:
            work(None)
        else:
            threads = [threading.Thread(target=work, args=(gpu,), daemon=True) for gpu in gpus]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        bar.close()
    if failures:
        raise failures[0]
    return store


def run_child(cmd: list[str], progress: Report | None = None, env: dict[str, str] | None = None,
              timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` from the repository's root in a child process that dies with this one (``helpers.children``);
    ``progress`` gets its reports as they come. Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds
    (the child's whole process group killed)."""
    return children.run(cmd, on_progress=progress, cwd=results.REPO_ROOT, env=env or dict(os.environ),
                        timeout=timeout)


def failure(what: str, proc: subprocess.CompletedProcess, lines: int = 15) -> RuntimeError:
    """The error of a child that failed: its exit status and the last ``lines`` lines of its output."""
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-lines:])
    return RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")
