"""A kernel printed in a notebook is the kernel in helpers: every code cell that prints a source
(``inspect.getsource`` or ``helpers.kernels.source``) is marked ``# NBVAL_CHECK_OUTPUT``, so that nbval
compares its saved printout with what the module prints now, and CI fails when they drift apart."""
import json
import re

import pytest

from helpers.results import REPO_ROOT

MARK = "# NBVAL_CHECK_OUTPUT"
PRINTS_SOURCE = re.compile(r"print\(.*\b(?:getsource|source)\(", re.DOTALL)
NOTEBOOKS = sorted([*REPO_ROOT.glob("notebooks/*.ipynb"), *REPO_ROOT.glob("notebooks/appendix/*.ipynb")])


def source_printing_cells(nb: dict) -> list[tuple[int, str]]:
    """(index, source) of each code cell that prints a function's source."""
    cells = []
    for index, cell in enumerate(nb["cells"]):
        text = "".join(cell["source"])
        if cell["cell_type"] == "code" and any(PRINTS_SOURCE.search(line) for line in _statements(text)):
            cells.append((index, text))
    return cells


def _statements(text: str) -> list[str]:
    """The cell's lines, with a call spread over several lines joined to its first (brackets balanced)."""
    out, current, depth = [], "", 0
    for line in text.splitlines():
        current += line + "\n"
        depth += line.count("(") - line.count(")")
        if depth <= 0:
            out.append(current)
            current, depth = "", 0
    return out + ([current] if current else [])


def test_the_pattern_finds_source_printing_cells():
    nb = {"cells": [{"cell_type": "code", "source": ["for fn in (a, b):\n", "    print(inspect.getsource(fn.fn))"]},
                    {"cell_type": "code", "source": ["print(source(\n", "    fa._fwd_kernel))"]},
                    {"cell_type": "code", "source": ["text = inspect.getsource(f)\n", "print(len(text))"]},
                    {"cell_type": "markdown", "source": ["print(source(x))"]}]}
    assert [i for i, _ in source_printing_cells(nb)] == [0, 1]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_printed_source_is_compared_by_nbval(path):
    nb = json.loads(path.read_text())
    unmarked = [index for index, text in source_printing_cells(nb) if not text.startswith(MARK)]
    assert not unmarked, (f"{path.name}: cells {unmarked} print a source but do not start with {MARK!r}, so CI "
                          "would not notice the printout drifting from the module")
