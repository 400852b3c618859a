"""scripts/step_part_bytes.py and step_model.measured_bytes: Nsight Compute's DRAM bytes of a QLoRA step, per part
(ncu itself needs a GPU)."""
import importlib.util

import pytest

from helpers.finetune import step_model
from helpers.results import REPO_ROOT

spec = importlib.util.spec_from_file_location("step_part_bytes", REPO_ROOT / "scripts" / "step_part_bytes.py")
step_bytes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_bytes)

# per point: (kernel name, duration ns, bytes read, bytes written), in launch order after the marker
STEP = [("kgemm_4bit_inference_dequantize", 2000, 3000, 1000),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 5000, 800, 200),
        ("vectorized_elementwise_kernel", 1000, 1500, 500),
        ("kgemm_4bit_inference_dequantize", 2000, 3000, 1000),
        ("softmax_warp_forward", 500, 400, 400),
        ("multi_tensor_apply_kernel", 100, 60, 40)]


def ncu_csv(points: int, marker_first: bool = True) -> str:
    """ncu's ``--csv --page raw`` layout: program output, a header, a units row, a row a launch."""
    metrics = list(step_bytes.METRICS.values())
    head = ["ID", "Kernel Name", *metrics]
    lines = ["==PROF== Connected to process", "batch 1: padded to 512 tokens",
             ",".join(f'"{h}"' for h in head), ",".join('""' if i < 2 else '"byte"' for i in range(len(head)))]
    rows = []
    for p in range(points):
        rows += [("void at::native::spin_kernel(long)", 10, 0, 0)] + [(n, (p + 1) * t, (p + 1) * r, (p + 1) * w)
                                                                       for n, t, r, w in STEP]
    if not marker_first:
        rows = rows[1:] + rows[:1]
    for i, (name, ns, read, written) in enumerate(rows):
        lines.append(",".join(f'"{v}"' for v in (i, name, f"{ns:,}", f"{read:,}", f"{written:,}")))
    return "\n".join(lines) + "\n"


def test_parse_sums_each_kernel_name_per_point_and_puts_it_in_its_part():
    records = step_bytes.parse(ncu_csv(len(step_bytes.POINTS)))
    assert [r["batch_size"] for r in records] == [b for b in step_bytes.POINTS for _ in range(5)]  # 5 kernel names
    dequant = [r for r in records if r["part"] == "nf4 dequantise"]
    assert [r["calls"] for r in dequant] == [2] * len(step_bytes.POINTS)
    assert dequant[1]["dram_read"] == 2 * 2 * 3000 and dequant[1]["duration_ns"] == 2 * 2 * 2000  # point 2: x2
    parts = {r["kernel"]: r["part"] for r in records}
    assert parts["sm90_xmma_gemm_bf16bf16_bf16f32"] == "matmul"
    assert parts["vectorized_elementwise_kernel"] == "element-wise"
    assert parts["softmax_warp_forward"] == "softmax" and parts["multi_tensor_apply_kernel"] == "optimizer"


def test_measured_bytes_per_part_against_hand_sums():
    records = step_bytes.parse(ncu_csv(len(step_bytes.POINTS)))
    first = step_model.measured_bytes([r for r in records if r["batch_size"] == step_bytes.POINTS[0]])
    assert first["nf4 dequantise"] == {"calls": 2, "bytes": 8000.0, "ms": 4000 / 1e6, "gbps": 2.0}
    assert first["element-wise"]["bytes"] == 2000 and first["element-wise"]["gbps"] == pytest.approx(2.0)
    assert first["matmul"]["gbps"] == pytest.approx(1000 / 5000)
    assert "host" not in first


def test_measured_bytes_refuses_two_points():
    with pytest.raises(ValueError, match="more than one point"):
        step_model.measured_bytes(step_bytes.parse(ncu_csv(len(step_bytes.POINTS))))


def test_parse_needs_a_marker_before_each_point():
    with pytest.raises(RuntimeError, match="marker kernels"):
        step_bytes.parse(ncu_csv(len(step_bytes.POINTS) - 1))
    with pytest.raises(RuntimeError, match="marker kernels"):
        step_bytes.parse(ncu_csv(len(step_bytes.POINTS), marker_first=False))


def test_ncu_refuses_an_unknown_cache_control():
    from helpers import ncu

    with pytest.raises(ValueError, match="cache_control"):
        ncu.profile(["true"], cache_control="some")
