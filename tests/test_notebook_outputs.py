"""What a learner reads in the committed notebooks' saved outputs: lines that fit the page, and no prediction's
answer printed above the cell that asks for it."""
import json
import re

import pytest

from helpers.exercises import CHECKS, NumberCheck
from helpers.results import REPO_ROOT

NOTEBOOKS = [*sorted((REPO_ROOT / "notebooks").glob("*.ipynb")),
             *sorted((REPO_ROOT / "notebooks").glob("appendix/*.ipynb"))]
IDS = [p.relative_to(REPO_ROOT / "notebooks").as_posix() for p in NOTEBOOKS]
MAX_LINE = 150
# Predictions whose answer is worked out from numbers their own task gives, not measured: an output above that
# rounds to the same value is chance, not the answer.
WORKED_FROM_THE_TASK = {"10.3": "a made-up step's share, from the times and elasticities its task states"}
NUMBER = re.compile(r"(?<![\w.])(?!0\d)\d[\d,]*(?:\.\d+)?")  # not "06.1": that is an exercise's name


def _output_text(cell: dict) -> str:
    texts = []
    for out in cell.get("outputs", []):
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        texts.append("".join(text))
    return "\n".join(texts)


def shows(text: str, value: float) -> list[str]:
    """The numbers in ``text`` that read as ``value`` at the precision they are printed with: equal after
    rounding and within 1%. Integers of one or two digits (batch sizes, counts) are too common to tell apart."""
    found = []
    for match in NUMBER.finditer(text):
        digits = match.group().replace(",", "")
        decimals = len(digits.partition(".")[2])
        if decimals == 0 and len(digits.lstrip("0")) < 3:
            continue
        shown = float(digits)
        if abs(shown - value) <= 0.5 * 10 ** -decimals + 1e-12 and abs(shown - value) <= 0.01 * abs(value):
            found.append(text[max(0, match.start() - 50):match.end() + 10].replace("\n", " "))
    return found


def test_shows_reads_numbers_at_their_printed_precision():
    assert shows("copy 3,016.1 GB/s, 89.8% of the datasheet", 89.78)
    assert shows("rate 1,830 MHz", 1830.4) and not shows("rate 1,830 MHz", 1850.0)
    assert not shows("batch 20, 4 GPUs", 20) and not shows("0.9 and 2.5", 0.93)
    assert shows("ratio 0.93x", 0.9263) and not shows("ratio 0.94x", 0.9263)
    assert not shows("CHECKS['06.1']", 6.1)


def predictions(nb: dict) -> list[tuple[str, int, int]]:
    """Each prediction asked in a notebook: (id, its heading cell, its check cell)."""
    cells, asked = nb["cells"], []
    for at, cell in enumerate(cells):
        for check_id in re.findall(r'CHECKS\["([\w.]+)"\]\.check\(', "".join(cell["source"])):
            if isinstance(CHECKS[check_id], NumberCheck):
                heading = next(i for i in range(at, -1, -1) if cells[i]["cell_type"] == "markdown"
                               and f"Exercise {check_id} " in "".join(cells[i]["source"]))
                asked.append((check_id, heading, at))
    return asked


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_saved_output_line_is_wider_than_the_page(path):
    nb = json.loads(path.read_text())
    wide = [f"cell {i}: {len(line)} characters: {line[:80]}..." for i, cell in enumerate(nb["cells"])
            for line in _output_text(cell).split("\n") if len(line) > MAX_LINE]
    assert not wide, "\n".join(wide)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_prediction_is_answered_above_the_cell_that_asks_it(path):
    nb = json.loads(path.read_text())
    answered = []
    for check_id, heading, _ in predictions(nb):
        check = CHECKS[check_id]
        if check.choices or check_id in WORKED_FROM_THE_TASK:  # multiple choice: the answer is an option's number
            continue
        answered += [f"{check_id} (reference {check.solution:.4g}) in cell {i}: ...{hit}..."
                     for i in range(heading) for hit in shows(_output_text(nb["cells"][i]), check.solution)]
    assert not answered, "\n".join(answered)
