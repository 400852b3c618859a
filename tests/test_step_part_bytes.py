"""scripts/step_part_bytes.py and step_model.layer_bytes: Nsight Compute's DRAM bytes of one decoder layer of a
QLoRA step, per part (ncu itself needs a GPU)."""
import importlib.util

import pytest

from helpers.finetune import step_model
from helpers.results import REPO_ROOT

spec = importlib.util.spec_from_file_location("step_part_bytes", REPO_ROOT / "scripts" / "step_part_bytes.py")
step_bytes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_bytes)

# (kernel name, duration ns, bytes read, bytes written): the kernels outside the layers, then one layer's
HEAD = [("embedding_kernel", 700, 900, 100), ("cross_entropy_loss_kernel", 300, 500, 0),
        ("multi_tensor_apply_kernel", 100, 60, 40)]
LAYER = [("kDequantizeBlockwise", 2000, 3000, 1000),
         ("sm90_xmma_gemm_bf16bf16_bf16f32", 5000, 800, 200),
         ("vectorized_elementwise_kernel", 1000, 1500, 500),
         ("kDequantizeBlockwise", 2000, 3000, 1000),
         ("softmax_warp_forward", 500, 400, 400),
         ("multi_tensor_apply_kernel", 50, 30, 20)]


def ncu_csv(steps: list[tuple[int, int]], marker_first: bool = True) -> str:
    """ncu's ``--csv --page raw`` layout for ``steps`` ((layers, batch) each): program output, a header, a units row,
    a row a launch. A step at batch b scales every kernel's time and bytes by b."""
    metrics = list(step_bytes.METRICS.values())
    head = ["ID", "Kernel Name", *metrics]
    lines = ["==PROF== Connected to process", "some program output",
             ",".join(f'"{h}"' for h in head), ",".join('""' if i < 2 else '"byte"' for i in range(len(head)))]
    rows = []
    for layers, batch in steps:
        kernels = HEAD[:1] + LAYER * layers + HEAD[1:]
        rows += [("void at::native::spin_kernel(long)", 10, 0, 0)] + [(n, batch * t, batch * r, batch * w)
                                                                       for n, t, r, w in kernels]
    if not marker_first:
        rows = rows[1:] + rows[:1]
    for i, (name, ns, read, written) in enumerate(rows):
        lines.append(",".join(f'"{v}"' for v in (i, name, f"{ns:,}", f"{read:,}", f"{written:,}")))
    return "\n".join(lines) + "\n"


def test_parse_sums_each_kernel_name_per_step_and_puts_it_in_its_part():
    records = step_bytes.parse(ncu_csv(step_bytes.STEPS))
    assert [(r["layers"], r["batch_size"]) for r in records] == [s for s in step_bytes.STEPS for _ in range(7)]
    dequant = [r for r in records if r["part"] == "nf4 dequantise"]
    assert [r["calls"] for r in dequant] == [2 * layers for layers, _ in step_bytes.STEPS]
    parts = {r["kernel"]: r["part"] for r in records}
    assert parts["sm90_xmma_gemm_bf16bf16_bf16f32"] == "matmul" and parts["embedding_kernel"] == "element-wise"
    assert parts["softmax_warp_forward"] == "softmax" and parts["multi_tensor_apply_kernel"] == "optimizer"


def test_layer_bytes_is_the_two_models_difference_against_hand_sums():
    records = step_bytes.parse(ncu_csv(step_bytes.STEPS))
    batch = step_bytes.POINTS[1]
    layer = step_model.layer_bytes([r for r in records if r["batch_size"] == batch])
    assert layer["nf4 dequantise"] == {"calls": 2, "bytes": batch * 8000.0, "ms": batch * 4000 / 1e6, "gbps": 2.0}
    assert layer["element-wise"]["bytes"] == batch * 2000  # the embedding and the loss cancel
    assert layer["optimizer"] == {"calls": 1, "bytes": batch * 50.0, "ms": batch * 50 / 1e6, "gbps": 1.0}
    assert layer["matmul"]["gbps"] == pytest.approx(1000 / 5000)
    assert "host" not in layer


def test_layer_bytes_refuses_mixed_or_missing_steps():
    records = step_bytes.parse(ncu_csv(step_bytes.STEPS))
    with pytest.raises(ValueError, match="one model and batch size"):
        step_model.layer_bytes(records)
    with pytest.raises(ValueError, match="one model and batch size"):
        step_model.layer_bytes([r for r in records if r["batch_size"] == 1 and r["layers"] == 2])


def test_parse_needs_a_marker_before_each_step():
    with pytest.raises(RuntimeError, match="marker kernels"):
        step_bytes.parse(ncu_csv(step_bytes.STEPS[:-1]))
    with pytest.raises(RuntimeError, match="marker kernels"):
        step_bytes.parse(ncu_csv(step_bytes.STEPS, marker_first=False))


def test_ncu_refuses_an_unknown_cache_control():
    from helpers import ncu

    with pytest.raises(ValueError, match="cache_control"):
        ncu.profile(["true"], cache_control="some")
