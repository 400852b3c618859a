"""The notebooks' saved files kept to what the course needs, whoever saves them.

JupyterLab stores the state of every progress-bar widget (tens of KB) and the running kernel's Python
version in a notebook when it saves it, so merely opening one changes the file; and a progress bar drawn as
text is saved as one output per update. ``clean`` keeps the kernel's name and the language, each cell's tags
and run timestamps (``clean_metadata``), and each progress bar's last state only (``clean_outputs``);
``scripts/execute_notebooks.py`` and JupyterLab (through ``jupyter_server_config.py``, which the README's
command loads) apply it on every save. ``python -m helpers.notebook_files NOTEBOOK...`` cleans files in place.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
CELL_KEYS = ("tags", "execution")  # per-cell metadata kept: tags, and the run's timestamps (nbclient records them)
# what a line became after carriage returns redrew it: the text after its last "\r" (nbval reads streams so too)
_REDRAWN = re.compile(r"^[^\n]*\r(?=[^\r\n])", re.MULTILINE)
_BARE_CR = re.compile(r"\r+(?=\n|$)")  # a "\r" that ends a line redraws nothing
# a tqdm bar's text ("desc:  40%|####      | 2/5 [00:01<00:02, 1.9it/s]"): a widget's saved stand-in
_TQDM = re.compile(r"^[^\n]*\d+%\|[^\n]*\| *[\d.]+[kMG]?/[\d.?]+[kMG]? \[[^\n]*\]\s*$")
_WIDGET = "application/vnd.jupyter.widget-view+json"


def clean_metadata(nb: dict) -> dict:
    """``nb`` (a notebook as a dict, changed in place and returned) without widget state, Python version or
    per-cell editor state: notebook metadata ``{"kernelspec": python3, "language_info": {"name": "python"}}``."""
    nb["metadata"] = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for cell in nb.get("cells", []):
        cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in CELL_KEYS}
    return nb


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _like(original: str | list[str], text: str) -> str | list[str]:
    """``text`` in the form ``original`` had: one string, or a list of lines (as in a saved .ipynb)."""
    return text if isinstance(original, str) else text.splitlines(keepends=True)


def collapse_redraws(text: str) -> str:
    """Each line as a terminal would finally show it: a progress bar redrawn with carriage returns keeps its
    last state only."""
    return _REDRAWN.sub("", _BARE_CR.sub("", text))


def _is_progress_widget(output: dict) -> bool:
    """A progress-bar widget's display: its live state is never saved, only a first-frame text stand-in."""
    data = output.get("data", {})
    if output.get("output_type") != "display_data":
        return False
    return _WIDGET in data or (set(data) == {"text/plain"} and bool(_TQDM.match(_text(data["text/plain"]))))


def clean_outputs(nb: dict) -> dict:
    """``nb`` (changed in place and returned) with each code cell's consecutive stream outputs of one name
    merged, carriage-return redraws collapsed to each line's last state, streams left empty dropped, and
    progress-bar widgets' stale first frames dropped."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        kept: list[dict] = []
        for output in cell.get("outputs", []):
            if _is_progress_widget(output):
                continue
            last = kept[-1] if kept else None
            if (output.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                    and last.get("name") == output.get("name")):
                last["text"] = _like(last["text"], _text(last["text"]) + _text(output["text"]))
                continue
            kept.append(output)
        for output in kept:
            if output.get("output_type") == "stream":
                output["text"] = _like(output["text"], collapse_redraws(_text(output["text"])))
        cell["outputs"] = [o for o in kept if o.get("output_type") != "stream" or _text(o["text"])]
    return nb


def clean(nb: dict) -> dict:
    """``nb`` with its metadata and its outputs cleaned (``clean_metadata``, ``clean_outputs``)."""
    return clean_outputs(clean_metadata(nb))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Clean saved notebooks in place (metadata and outputs).")
    parser.add_argument("notebooks", nargs="+", type=Path)
    for path in parser.parse_args(argv).notebooks:
        nb = json.loads(path.read_text())
        path.write_text(json.dumps(clean(nb), indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
