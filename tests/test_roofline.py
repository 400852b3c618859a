"""helpers.studies.roofline: the model, the operations' intensities, the dial sweep and its knee."""
import json
import math
from types import SimpleNamespace

import pytest

from stand_ins import fixed_timer
from helpers import datasheets, monitor, results
from helpers.studies import roofline


def test_roof_model():
    r = roofline.Roof("toy", peak_gflops=1000.0, bandwidth_gbps=100.0)
    assert r.ridge == 10.0
    assert r.attainable(1.0) == 100.0 and r.attainable(10.0) == 1000.0 and r.attainable(1e4) == 1000.0
    with pytest.raises(ValueError):
        r.attainable(-1)
    with pytest.raises(ValueError):
        roofline.Roof("bad", 0.0, 1.0)


@pytest.mark.parametrize("name,ridge", [("A100 40GB SXM", 200), ("RTX 6000 Ada", 380), ("H200", 206)])
def test_spec_ridges_match_the_issue(name, ridge):
    roof = roofline.spec_roof(datasheets.by_name(name))
    assert roof.ridge == pytest.approx(ridge, rel=0.01)
    assert roofline.spec_roof(datasheets.by_name(name), "fp32").ridge < roof.ridge
    with pytest.raises(ValueError):
        roofline.spec_roof(datasheets.by_name(name), "int8")


def test_operations_intensities():
    ops = {o["operation"].split(" (")[0]: o for o in roofline.operations(tokens=64, hidden=32, seq=256, head_dim=16,
                                                                         square=128)}
    assert ops["vector add"]["flops_per_byte"] == pytest.approx(1 / 6)
    assert ops["naive chain 2: GELU"]["flops_per_byte"] == pytest.approx(roofline.GELU_FLOPS / 4)
    assert ops["matmul square 128^3"]["flops_per_byte"] == pytest.approx(128 / 3)
    gemv = ops["decode GEMV 1x32 @ 32x32"]
    assert gemv["flops"] == 2 * 32 * 32 and gemv["bytes"] == 2 * (32 + 32 * 32 + 32)
    naive, flash = ops["attention naive"], ops["attention flash"]
    assert naive["flops"] == flash["flops"]  # same arithmetic
    assert flash["bytes"] == 2 * 4 * 256 * 16 and naive["bytes"] > 4 * flash["bytes"]  # N x N round trips
    fused = ops["fused bias+GELU+LayerNorm"]
    chain = [o for k, o in ops.items() if k.startswith("naive chain")]
    assert fused["flops"] == sum(o["flops"] for o in chain)  # same FLOPs ...
    assert sum(o["bytes"] for o in chain) / fused["bytes"] == pytest.approx(3, rel=0.05)  # ... a third of the bytes
    with pytest.raises(ValueError):
        roofline.operations(tokens=0)


def test_dial_sweep_records_and_knee(monkeypatch):
    recs = roofline.dial_sweep([0, 3], n_elements=1000, block=256, progress=False)
    assert [r["k"] for r in recs] == [0, 3]
    assert recs[1]["flops_per_byte"] == pytest.approx(0.75)
    assert all(r["probe"] == "dial" and r["dtype"] == "fp32" and r["gbps"] > 0 for r in recs)
    monkeypatch.setattr(roofline.bench, "time_fn", fixed_timer(2.0))
    recs = roofline.dial_sweep([0, 3], n_elements=1000, block=256, progress=False)
    # 1000 fp32 values read and written (8000 bytes) in 2 ms; k = 3: 2 FLOP (a multiply-add) 3 times an element
    assert [r["gbps"] for r in recs] == pytest.approx([8000 / 2e-3 / 1e9] * 2)
    assert [r["gflops"] for r in recs] == pytest.approx([0.0, 6000 / 2e-3 / 1e9])
    with pytest.raises(ValueError):
        roofline.dial_sweep([-1])


def test_knee_on_a_synthetic_roofline():
    roof = roofline.Roof("toy", 1000.0, 100.0)
    recs = [{"flops_per_byte": i, "gflops": roof.attainable(i), "gbps": roof.attainable(i) / i if i else 100.0}
            for i in (0.0, 1.0, 4.0, 16.0, 64.0)]
    k = roofline.knee(recs)
    assert k["asymptotes"] == pytest.approx(10.0)
    assert k["bandwidth_drops"] == 16.0  # 1000/16 = 62.5 GB/s < 90
    with pytest.raises(ValueError):
        roofline.knee(recs[:1])


def test_card_spec_without_a_gpu_is_the_reference_h100s_row(monkeypatch):
    monkeypatch.setattr(roofline, "HAS_CUDA", False)
    spec, note = roofline.card_spec()
    assert spec == datasheets.by_name("H100 SXM") and "reference H100" in note


FAKE_PROPS = SimpleNamespace(name="NVIDIA Unlisted 24GB", major=8, minor=6, total_memory=24 * 10**9,
                             L2_cache_size=6 * 2**20, multi_processor_count=72,
                             shared_memory_per_multiprocessor=100 * 1024)
FAKE_CEILINGS = [{"what": "copy", "gbps": 540.0}, {"what": "matmul", "dtype": "bf16", "tflops": 95.0},
                 {"what": "matmul", "dtype": "tf32", "tflops": 48.0},
                 {"what": "matmul", "dtype": "fp32", "tflops": 26.0}]


def test_a_gpu_without_a_datasheet_row_gets_one_from_its_properties_and_measured_ceilings(monkeypatch):
    monkeypatch.setattr(monitor, "card_limits", lambda index=None: (1695, 150))
    spec = roofline.measured_spec(FAKE_CEILINGS, FAKE_PROPS)
    assert (spec.name, spec.architecture, spec.sms, spec.l2_mb, spec.smem_per_sm_kb) == \
        ("NVIDIA Unlisted 24GB", "Ampere", 72, 6, 100)
    assert (spec.bandwidth_gbps, spec.tensor_tflops, spec.tf32_tflops, spec.fp32_tflops) == (540.0, 95.0, 48.0, 26.0)
    assert (spec.boost_mhz, spec.tdp_w, spec.year) == (1695, 150, None) and "measured" in spec.source
    assert roofline.spec_roof(spec).ridge == pytest.approx(95e3 / 540)
    with pytest.raises(ValueError, match="missing \\['fp32'\\]"):
        roofline.measured_spec(FAKE_CEILINGS[:3], FAKE_PROPS)


def test_card_spec_of_an_unlisted_gpu_reads_the_ceilings_notebook_00_saved(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    (tmp_path / "unlisted-24gb").mkdir()
    saved = {"provenance": {}, "records": FAKE_CEILINGS}
    (tmp_path / "unlisted-24gb" / "ceilings.json").write_text(json.dumps(saved))
    monkeypatch.setattr(roofline, "HAS_CUDA", True)
    monkeypatch.setattr(roofline, "gpu_name", lambda: FAKE_PROPS.name)
    monkeypatch.setattr(results, "gpu_slug", lambda name=None, count=1: "unlisted-24gb")
    monkeypatch.setattr(roofline.torch.cuda, "get_device_properties", lambda device=None: FAKE_PROPS)
    monkeypatch.setattr(monitor, "card_limits", lambda index=None: (None, None))
    spec, note = roofline.card_spec()
    assert spec.bandwidth_gbps == 540.0 and "no datasheet row for NVIDIA Unlisted 24GB" in note


def test_generations_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    rows = roofline.generations(["V100 SXM2", "H200"])
    assert rows[0]["tensor FLOP per byte"] == pytest.approx(125e3 / 900)
    ax = roofline.plot_roofline([roofline.Roof("toy", 1000.0, 100.0)])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert not math.isnan(rows[1]["fp32 FLOP per byte"])


def test_support_line_names_the_cards_below_sm_80():
    from helpers.card_fit import CARDS, CardLimits

    assert roofline.support_line(None) is None and roofline.support_line(CARDS["NVIDIA H100 80GB HBM3"]) is None
    t4 = roofline.support_line(CARDS["Tesla T4"])
    assert "sm_75" in t4 and "tensor cores" in t4 and "bf16 is emulated" in t4 and "not supported" not in t4
    v100 = roofline.support_line(CardLimits("Tesla V100-SXM2-16GB", 16 * 2**30, (7, 0), 96 * 1024, 80))
    assert "sm_70" in v100 and "not supported" in v100 and "\n" not in v100


def test_reference_ceilings_are_the_reference_runs_records():
    values, ref = roofline.reference_ceilings()
    assert ref.path.parent.name == results.REFERENCE_GPU and set(values) == {"copy", "bf16", "tf32", "fp32"}
    assert values["copy"] == next(r["gbps"] for r in ref.records if r["what"] == "copy")
    assert values["bf16"] == next(r["tflops"] for r in ref.records if r.get("dtype") == "bf16")
    assert roofline.ceiling_values(FAKE_CEILINGS) == {"copy": 540.0, "bf16": 95.0, "tf32": 48.0, "fp32": 26.0}


def test_saved_roofline_reads_back_what_notebook_02_saves():
    ref = results.reference("roofline")
    dial, copy_gbps, matmuls = roofline.saved_roofline(ref.records)
    assert dial and all(r["probe"] == "dial" for r in dial) and [r["k"] for r in dial][0] == 0
    assert copy_gbps == next(r["gbps"] for r in ref.records if r.get("what") == "copy")
    assert set(matmuls) == {"bf16", "fp32"} and matmuls["bf16"]["n"] == 8192
    assert matmuls["bf16"]["tflops"] > matmuls["fp32"]["tflops"] > 0
