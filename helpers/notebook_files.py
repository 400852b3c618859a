"""The notebooks' saved metadata kept to what the course needs, whoever saves them.

JupyterLab stores the state of every progress-bar widget (tens of KB) and the running kernel's Python
version in a notebook when it saves it, so merely opening one changes the file. ``clean_metadata`` keeps
the kernel's name and the language, and each cell's tags and run timestamps; ``scripts/execute_notebooks.py``
and JupyterLab (through ``jupyter_server_config.py``, which the README's command loads) apply it on every save.
"""
from __future__ import annotations

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
CELL_KEYS = ("tags", "execution")  # per-cell metadata kept: tags, and the run's timestamps (nbclient records them)


def clean_metadata(nb: dict) -> dict:
    """``nb`` (a notebook as a dict, changed in place and returned) without widget state, Python version or
    per-cell editor state: notebook metadata ``{"kernelspec": python3, "language_info": {"name": "python"}}``."""
    nb["metadata"] = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for cell in nb.get("cells", []):
        cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in CELL_KEYS}
    return nb
