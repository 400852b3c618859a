"""helpers.children: a child never outlives the process that started it."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import children
from helpers.results import REPO_ROOT

CHILD = "from helpers import children; children.die_with_parent(); import time; time.sleep(60)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper counts as gone
        return f.read().split(") ")[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_parent_killed_outright_takes_its_child(tmp_path):
    pid_file = tmp_path / "child.pid"
    parent = textwrap.dedent(f"""
        import subprocess, sys
        from helpers import children
        real = subprocess.Popen
        def popen(*a, **k):
            p = real(*a, **k)
            open({str(pid_file)!r}, "w").write(str(p.pid))
            return p
        subprocess.Popen = popen
        children.run([sys.executable, "-c", {CHILD!r}], cwd={str(REPO_ROOT)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=REPO_ROOT)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the child never started"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    time.sleep(1.5)  # the child has imported helpers and asked to die with its parent
    assert _alive(child)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the child outlived its killed parent"


def test_an_interrupted_run_kills_the_child_group(monkeypatch):
    started = []
    real = subprocess.Popen

    class Interrupted(subprocess.Popen):
        def wait(self, *a, **k):  # the first wait is interrupted (Ctrl-C); the reaping after the kill is not
            if not started:
                started.append(self.pid)
                raise KeyboardInterrupt
            return super().wait(*a, **k)

    monkeypatch.setattr(subprocess, "Popen", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        children.run([sys.executable, "-c", "import os, time; os.close(1); time.sleep(60)"])
    monkeypatch.setattr(subprocess, "Popen", real)
    assert started and not _alive(started[0])


def test_a_finished_run_returns_its_output_and_passes_the_parent_pid():
    out = children.run([sys.executable, "-c", f"import os; print(os.environ[{children.PARENT_PID!r}])"])
    assert out.returncode == 0 and out.stdout.strip() == str(os.getpid())


def test_progress_reports_arrive_while_the_child_runs():
    child = ("import time; from helpers import children\n"
             "children.report_progress('one'); time.sleep(1.5); children.report_progress('two')\n"
             "import sys; print('not progress', file=sys.stderr); print('out')")
    seen = []
    start = time.monotonic()
    out = children.run([sys.executable, "-c", child], cwd=REPO_ROOT,
                       on_progress=lambda text: seen.append((text, time.monotonic() - start)))
    assert out.returncode == 0 and out.stdout == "out\n" and "not progress" in out.stderr
    assert [text for text, _ in seen] == ["one", "two"]
    assert seen[1][1] - seen[0][1] > 1.0  # the first came before the child slept, not at its end


def test_report_progress_is_silent_outside_a_child(capsys, monkeypatch):
    monkeypatch.delenv(children.PARENT_PID, raising=False)
    children.report_progress("nobody listens")
    assert capsys.readouterr().err == ""


def test_a_run_past_its_timeout_is_killed_with_its_group():
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        children.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert time.monotonic() - start < 30
