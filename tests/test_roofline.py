"""helpers.studies.roofline: the model, the operations' intensities, the dial sweep and its knee."""
import math

import pytest

from stand_ins import fixed_timer
from helpers.studies import roofline
from helpers import datasheets


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


def test_card_spec_names_its_source():
    spec, note = roofline.card_spec()
    assert isinstance(spec, datasheets.GpuSpec) and spec.name in note


def test_generations_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    rows = roofline.generations(["V100 SXM2", "H200"])
    assert rows[0]["tensor FLOP per byte"] == pytest.approx(125e3 / 900)
    ax = roofline.plot_roofline([roofline.Roof("toy", 1000.0, 100.0)])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert not math.isnan(rows[1]["fp32 FLOP per byte"])
