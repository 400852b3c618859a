"""Child processes that never outlive the run that started them.

A long run (the fine-tuning sweep) starts each point in a child process. If the parent is killed
(SIGKILL, a lost session), an orphaned child would go on holding the GPU, and a resumed run would start
the same point beside it. So each child runs in its own process group (``run``), killed as a group when
the parent stops on an exception, and asks Linux to kill it when its parent dies (``die_with_parent``,
called first thing in the child; the parent's pid travels in ``PARENT_PID``). A child reports how far it
has got with :func:`report_progress`; ``run(..., on_progress=f)`` hands each report to ``f`` as it comes.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Callable

PARENT_PID = "COURSE_PARENT_PID"
PROGRESS = "progress: "  # a line of the child's stderr that starts so is a progress report
_PR_SET_PDEATHSIG = 1  # prctl(2)


def run(cmd: list[str], on_progress: Callable[[str], None] | None = None, timeout: float | None = None,
        **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)`` in a process group of its own,
    killed whole if this process stops while it runs (an exception, KeyboardInterrupt, SIGTERM turned into
    SystemExit) or it runs past ``timeout`` seconds (then ``subprocess.TimeoutExpired`` is raised); ``env``
    gets ``PARENT_PID`` so that the child can call :func:`die_with_parent`.
    ``on_progress``: called with the text of each :func:`report_progress` line, while the child runs."""
    env = {**kwargs.pop("env", os.environ), PARENT_PID: str(os.getpid())}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, **kwargs)
    out: list[str] = []
    err: list[str] = []

    def read(stream, lines: list[str], report: Callable[[str], None] | None) -> None:
        for line in stream:
            lines.append(line)
            if report is not None and line.startswith(PROGRESS):
                report(line[len(PROGRESS):].rstrip("\n"))

    readers = [threading.Thread(target=read, args=(proc.stdout, out, None), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, err, on_progress), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
        for reader in readers:
            reader.join()
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "".join(err))


def report_progress(message: str) -> None:
    """In a child started by :func:`run`: tell the parent how far it has got (one line on stderr). Does
    nothing in a process that no :func:`run` started (a notebook's own kernel, say)."""
    if os.environ.get(PARENT_PID):
        print(PROGRESS + message.replace("\n", " "), file=sys.stderr, flush=True)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (itself and whatever it started), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def die_with_parent() -> None:
    """In a child started by :func:`run`: be killed by Linux when the parent dies (``PR_SET_PDEATHSIG``),
    and exit now if it already has. Does nothing elsewhere (no ``PARENT_PID``, or not Linux)."""
    parent = os.environ.get(PARENT_PID)
    if parent is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(parent):  # the parent died before the request took hold
        os._exit(1)
