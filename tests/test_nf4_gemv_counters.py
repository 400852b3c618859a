"""scripts/nf4_gemv_counters.py: reading Nsight Compute's raw CSV into records (ncu itself needs a GPU)."""
import importlib.util
import json

import pytest

from helpers.studies.decoding_ladder import LLAMA_7B_SHAPES
from helpers import results
from helpers.results import REPO_ROOT

spec = importlib.util.spec_from_file_location("nf4_gemv_counters", REPO_ROOT / "scripts" / "nf4_gemv_counters.py")
counters = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counters)


def ncu_csv(launches: int) -> str:
    """ncu's ``--csv --page raw`` layout: program output and ==PROF== lines, a header, a units row, a row a
    launch; launch i's metric j holds 1000 (i + 1) + j. Other kernels' rows (the plain kernel of rung 1, the
    partial sums' kernel) come first and last, and must be left out."""
    metrics = list(counters.METRICS.values())
    head = ["ID", "Kernel Name", *metrics]
    lines = ["==PROF== Connected to process", "some program output",
             ",".join(f'"{h}"' for h in head), ",".join('""' if i < 2 else '"%"' for i in range(len(head)))]
    names = ["_nf4_matvec_kernel", *["_nf4_matmul_row_kernel"] * launches, "_sum_splits_kernel"]
    for i, name in enumerate(names):
        values = [str(i), name, *[f"{1000 * i + j:,}" for j in range(len(metrics))]]
        lines.append(",".join(f'"{v}"' for v in values))
    return "\n".join(lines) + "\n"


def test_parse_keeps_each_shapes_last_launch():
    records = counters.parse(ncu_csv(counters.LAUNCHES * len(LLAMA_7B_SHAPES)))
    assert [r["shape"] for r in records] == list(LLAMA_7B_SHAPES)
    index = list(counters.METRICS).index("warp_instructions")
    for i, (r, (n, k)) in enumerate(zip(records, LLAMA_7B_SHAPES.values())):
        launch = counters.LAUNCHES * (i + 1)  # the shape's last launch, counted from 1
        assert r["duration_us"] == launch  # 1000 * launch ns
        assert r["warp_instructions"] == 1000 * launch + index
        assert r["instructions_per_weight"] == pytest.approx(32 * r["warp_instructions"] / (n * k))


def test_parse_refuses_a_missing_launch():
    with pytest.raises(RuntimeError, match="expected"):
        counters.parse(ncu_csv(counters.LAUNCHES * len(LLAMA_7B_SHAPES) - 1))


def test_parse_reads_the_committed_h200_run():
    """The committed raw ncu output parses to the committed records (real metric names, units, layout)."""
    path = REPO_ROOT / "results" / "h200" / "nf4_gemv_counters.json"
    saved = json.loads(path.read_text())["records"]
    parsed = counters.parse(results.read_beside(path, ".csv.gz"))
    for rec in saved:
        rec.pop("config", None)  # added after parsing, from the launch table
    assert parsed == saved


def test_parse_reads_the_stall_reasons_where_the_run_has_them():
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    text = ncu_csv(counters.LAUNCHES * len(LLAMA_7B_SHAPES))
    header, units, *rows = [line for line in text.splitlines() if line.startswith('"')]
    reasons = {"wait": "2.5", "math_pipe_throttle": "4.0", "selected": "9.0", "short_scoreboard": "1.0", "barrier": ""}
    lines = [header + "".join(f',"{stall.format(r)}"' for r in reasons), units + ',""' * len(reasons)]
    lines += [row + "".join(f',"{v}"' for v in reasons.values()) for row in rows]
    records = counters.parse("\n".join(lines) + "\n")
    assert [records[0][f"stall_{i}"] for i in (1, 2, 3)] == ["math_pipe_throttle", "wait", "short_scoreboard"]
    assert records[0]["stall_1_cycles"] == 4.0  # "selected" (an issuing warp) is not a stall; empty cells are skipped
    assert "stall_1" not in counters.parse(text)[0]  # a run without the stall section: none recorded
