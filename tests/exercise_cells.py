"""What the exercise tests share: an exercise's notebook cells run as a learner runs them, its check's verdict on a
planted answer, its solution through Triton's compiler for a GPU (``from exercise_cells import run_exercise``;
pytest puts this folder on ``sys.path``)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from helpers.exercises.checks import CodeCheck
from helpers.results import REPO_ROOT


def code_cells(notebook: Path) -> list[str]:
    """The source of every code cell of ``notebook``, in order."""
    return ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]


def notebook_of(exercise: str) -> Path:
    """The notebook whose cells check ``exercise`` (e.g. "02.4")."""
    return next(p for p in sorted((REPO_ROOT / "notebooks").rglob("*.ipynb"))
                if any(f'CHECKS["{exercise}"].check' in cell for cell in code_cells(p)))


def exercise_cells(notebook: Path, exercise: str) -> tuple[str, str]:
    """The skeleton cell of ``exercise`` (e.g. "02.4") in ``notebook`` and its check cell, the one after it: the
    cells a learner runs for the exercise after a kernel restart. Where the two do not import ``CHECKS``
    themselves, the skeleton comes after the import cell of its Exercises section."""
    cells = code_cells(notebook)
    check = next(i for i, s in enumerate(cells) if f'CHECKS["{exercise}"].check' in s)
    skeleton = cells[check - 1]
    if "import CHECKS" not in skeleton + cells[check]:
        skeleton = next(c for c in reversed(cells[:check - 1]) if "import CHECKS" in c) + "\n" + skeleton
    return skeleton, cells[check]


def _run_alone(source: str) -> str:
    """What ``source`` prints run in a fresh Python from notebooks/, as the cells run after a kernel restart (no
    TRITON_INTERPRET set); fails the test if it exits with an error."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=300,
                          cwd=REPO_ROOT / "notebooks")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _filled_in(skeleton: str, answers: dict[str, str]) -> str:
    """``skeleton`` with each line that starts with a key of ``answers`` (a TODO) replaced by its value at the
    line's indent (an empty value drops the line); fails the test unless each non-empty answer replaced exactly one
    line, so that a TODO that moved or was renamed shows."""
    lines = []
    for line in skeleton.splitlines():
        todo = next((t for t in answers if line.strip().startswith(t)), None)
        indent = line[:len(line) - len(line.lstrip())]
        lines.append(line if todo is None else indent + answers[todo] if answers[todo] else "")
    assert sum(line not in skeleton for line in lines if line) == sum(map(bool, answers.values())), \
        "a TODO of the skeleton moved"
    return "\n".join(lines)


def run_exercise(notebook: Path, exercise: str, answers: dict[str, str] | None = None) -> str:
    """What the skeleton cell of ``exercise`` and its check cell print run alone, the skeleton as it stands or with
    its TODOs filled in from ``answers`` (a TODO line's start: what a learner writes in its place)."""
    skeleton, check = exercise_cells(notebook, exercise)
    return _run_alone((skeleton if answers is None else _filled_in(skeleton, answers)) + "\n" + check)


def checked(check: CodeCheck, answer: Callable, seed: int = 3) -> tuple[bool, str]:
    """Whether ``check`` passes ``answer`` on the inputs drawn from ``seed``, and what it printed."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        passed = check.check(answer, seed=seed).passed
    return passed, out.getvalue()


def shared_bytes_on_sm90(kernel: str, args: str) -> int:
    """The shared memory that ``kernel`` ("exNN.name", a kernel of helpers.exercises) takes compiled for sm_90 by
    Triton's compiler on this CPU (helpers.kernels.fit.shared_bytes, in a fresh Python with TRITON_INTERPRET=0);
    ``args`` is the source of its arguments' dict, in which ``b``, ``f`` and ``i`` are bfloat16, float32 and int32
    tensors on the meta device. Fails the test if the kernel does not compile."""
    code = (f"import torch\nfrom helpers.exercises import {kernel.split('.')[0]}\n"
            "from helpers.kernels.fit import shared_bytes\n"
            "b, f, i = (torch.empty(1, device='meta', dtype=d) for d in (torch.bfloat16, torch.float32, torch.int32))\n"
            f"print(shared_bytes({kernel}, {args}, arch='sm_90'))")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.split()[-1])
