"""The course's display style: matplotlib figures with readable sizes, light grids and units on every axis,
and pandas tables shown whole."""
from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd

from .results import Result

STYLE = {
    "figure.figsize": (8.0, 4.5),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "axes.grid.which": "both",
    "grid.alpha": 0.25,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "lines.linewidth": 2.0,
    "lines.markersize": 5,
}

# Tables show every column, and rows up to a sweep's size; a table wider than 120 characters
# wraps its columns, and a cell longer than 60 characters ends in "..." (kernel names: bench.kernel_table).
TABLE_OPTIONS = {
    "display.max_columns": None,
    "display.max_rows": 500,
    "display.width": 120,
    "display.max_colwidth": 60,
}


def use_course_style() -> None:
    """Apply the course style to every figure and pandas table made after this call."""
    mpl.rcParams.update(STYLE)
    for option, value in TABLE_OPTIONS.items():
        pd.set_option(option, value)


def smoke_note(what: str, reference: Result) -> str:
    """One line for a smoke-scale run (a CPU): ``what`` timed tiny sizes and means nothing as a timing, so the
    reference GPU's committed run (named with its versions) is shown beside it or instead of it."""
    return f"smoke scale: these timings mean nothing ({what}); reference: {reference.short()}"


def labelled_axes(title: str, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False,
                  ax: plt.Axes | None = None) -> plt.Axes:
    """An axes with a title and axis labels (put units in brackets: "bandwidth [GB/s]")."""
    for what, text in (("title", title), ("xlabel", xlabel), ("ylabel", ylabel)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{what} must be a non-empty string")
    if ax is None:
        _, ax = plt.subplots()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    return ax


def bar_against(ax: plt.Axes, labels: list[str], measured: list[float], reference: list[float | None],
                unit: str) -> None:
    """Measured bars beside their datasheet references, each measured bar labelled with its % of the reference."""
    if not (len(labels) == len(measured) == len(reference)):
        raise ValueError("labels, measured and reference must have the same length")
    xs = range(len(labels))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [r or 0 for r in reference], width, label="datasheet", color="0.75")
    bars = ax.bar([x + width / 2 for x in xs], measured, width, label="measured", color="C0")
    for bar, m, r in zip(bars, measured, reference):
        note = f"{m:,.0f} {unit}" + (f"\n{100 * m / r:.0f}%" if r else "")
        ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel(unit)
    ax.legend()
