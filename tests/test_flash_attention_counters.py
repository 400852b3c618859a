"""scripts/flash_attention_counters.py: Nsight Compute's raw CSV split into cases and passes (ncu needs a GPU)."""
import importlib.util

import pytest

from helpers import results
from helpers.results import REPO_ROOT

spec = importlib.util.spec_from_file_location("flash_attention_counters",
                                              REPO_ROOT / "scripts" / "flash_attention_counters.py")
counters = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counters)

TENSOR = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
XU = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
STALLS = [f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"
          for r in ("barrier", "long_scoreboard", "math_pipe_throttle", "wait", "selected")]


def ncu_csv(kernels_per_segment: list[int], marker_first: bool = True) -> str:
    """ncu's raw layout: program output, a header, a units row, a row a launch. Segment s holds a marker and then
    ``kernels_per_segment[s]`` kernels named ``k<s>_<j>``, kernel value 10 s + j in every metric."""
    metrics = [*counters.METRICS.values(), *counters.SECTION_METRICS.values(), TENSOR, XU, *STALLS]
    head = ["ID", "Kernel Name", *metrics]
    lines = ["==PROF== Connected to process", "program output", ",".join(f'"{h}"' for h in head),
             ",".join('""' if i < 2 else '"x"' for i in range(len(head)))]

    def row(name: str, value: float) -> str:
        stalls = [value + 0.5 * i for i in range(len(STALLS))]
        cells = [name, *[f"{value:,}"] * (len(metrics) - len(STALLS)), *map(str, stalls)]
        return ",".join(f'"{c}"' for c in ["0", *cells])

    for s, n in enumerate(kernels_per_segment):
        if marker_first or s:
            lines.append(row("void at::native::spin_kernel(long)", 0))
        lines += [row(f"k{s}_{j}", 10 * s + j + 1000) for j in range(n)]
    return "\n".join(lines) + "\n"


def test_parse_labels_each_kernel_with_its_case_and_pass():
    counts = [1, 3, 1, 2, 1, 4, 1, 2]  # forward, backward for each of the four cases
    records = counters.parse(ncu_csv(counts))
    assert len(records) == sum(counts)
    expected = [(impl, causal, p, f"k{2 * c + i}_{j}") for c, (impl, causal) in enumerate(counters.CASES)
                for i, p in enumerate(counters.PASSES) for j in range(counts[2 * c + i])]
    assert [(r["impl"], r["causal"], r["pass"], r["kernel"]) for r in records] == expected
    r = records[1]  # the first case's first backward kernel: value 1010
    assert r["duration_us"] == pytest.approx(1.010)
    assert r["tensor_pipe_pct"] == 1010 and r["tensor_pipe_metric"] == TENSOR and r["xu_pipe_pct"] == 1010
    assert [r[f"stall_{i}"] for i in (1, 2, 3)] == ["wait", "math_pipe_throttle", "long_scoreboard"]  # most first
    assert r["stall_1_cycles"] == 1011.5
    results._check_records(records)  # flat, as results.save requires


def test_parse_refuses_missing_markers_or_empty_passes():
    with pytest.raises(RuntimeError, match="marker"):
        counters.parse(ncu_csv([1] * 7))
    with pytest.raises(RuntimeError, match="marker"):
        counters.parse(ncu_csv([1] * 8, marker_first=False))
    with pytest.raises(RuntimeError, match="no kernel"):
        counters.parse(ncu_csv([1, 1, 1, 0, 1, 1, 1, 1]))
