"""scripts/nf4_gemv_counters.py: reading Nsight Compute's raw CSV into records (ncu itself needs a GPU)."""
import importlib.util

import pytest

from helpers.results import REPO_ROOT
from helpers.decode_bench import LLAMA_7B_SHAPES

spec = importlib.util.spec_from_file_location("nf4_gemv_counters", REPO_ROOT / "scripts" / "nf4_gemv_counters.py")
counters = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counters)


def ncu_csv(launches: int) -> str:
    """ncu's ``--csv --page raw`` layout: program output and ==PROF== lines, a header, a units row, a row a launch."""
    metrics = list(counters.METRICS.values())
    head = ["ID", "Kernel Name", *metrics]
    lines = ["==PROF== Connected to process", "some program output",
             ",".join(f'"{h}"' for h in head), ",".join('""' if i < 2 else '"%"' for i in range(len(head)))]
    for i in range(launches):
        values = [str(i), "_nf4_matmul_kernel", *[f"{1000 * (i + 1) + j:,}" for j in range(len(metrics))]]
        lines.append(",".join(f'"{v}"' for v in values))
    return "\n".join(lines) + "\n"


def test_parse_keeps_each_shapes_last_launch():
    records = counters.parse(ncu_csv(counters.LAUNCHES * len(LLAMA_7B_SHAPES)))
    assert [r["shape"] for r in records] == list(LLAMA_7B_SHAPES)
    first, (n, k) = records[0], next(iter(LLAMA_7B_SHAPES.values()))
    index = list(counters.METRICS).index("warp_instructions")
    assert first["duration_us"] == counters.LAUNCHES  # launch LAUNCHES - 1 (from 0): 1000 * LAUNCHES ns
    assert first["warp_instructions"] == 1000 * counters.LAUNCHES + index
    assert first["instructions_per_weight"] == pytest.approx(32 * first["warp_instructions"] / (n * k))


def test_parse_refuses_a_missing_launch():
    with pytest.raises(RuntimeError, match="expected"):
        counters.parse(ncu_csv(counters.LAUNCHES * len(LLAMA_7B_SHAPES) - 1))
