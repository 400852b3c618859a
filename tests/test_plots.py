import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers import plots  # noqa: E402


def test_style_and_labels():
    plots.use_course_style()
    ax = plots.labelled_axes("copy", "working set [bytes]", "bandwidth [GB/s]", logx=True)
    assert ax.get_xlabel() == "working set [bytes]" and ax.get_xscale() == "log"
    assert matplotlib.rcParams["axes.grid"]
    plt.close("all")


def test_labels_required():
    with pytest.raises(ValueError, match="ylabel"):
        plots.labelled_axes("t", "x [s]", "")


def test_bar_against_annotates_percentages():
    _, ax = plt.subplots()
    plots.bar_against(ax, ["copy"], [4000.0], [4800.0], "GB/s")
    assert any("83%" in t.get_text() for t in ax.texts)
    with pytest.raises(ValueError):
        plots.bar_against(ax, ["a", "b"], [1.0], [1.0], "GB/s")
    plt.close("all")


def test_tables_show_every_row_and_column_within_the_page():
    import pandas as pd

    plots.use_course_style()
    kernel = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(" + "x" * 120 + ")"
    wide = pd.DataFrame([{f"column {i}": i for i in range(30)} | {"name": kernel}] * 100)
    lines = repr(wide).splitlines()
    assert "column 29" in repr(wide) and any(line.startswith("99 ") for line in lines)  # no column or row left out
    assert max(len(line) for line in lines) <= 120  # the columns wrap onto further blocks instead
    assert kernel not in repr(wide) and kernel[:50] in repr(wide)  # a cell past 60 characters ends in "..."


def test_smoke_note_names_the_reference_run_and_its_file():
    from helpers import results

    ref = results.reference("ceilings")
    line = plots.smoke_note("the copy", ref)
    assert line.startswith("smoke scale: these timings mean nothing (the copy)")
    assert ref.short() in line and "\n" not in line
    assert ref.provenance["gpu"] == "NVIDIA H100 80GB HBM3" and len(line) <= 120
