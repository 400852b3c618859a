"""helpers.studies.memory_hierarchy: sizes, level windows, Little's law, the card's levels and the two probes'
records."""
import math

import pytest

from stand_ins import fixed_timer
from helpers.studies import memory_hierarchy


def test_sizes_are_geometric_multiples():
    s = memory_hierarchy.sizes(2**16, 2**20, per_octave=2)
    assert s[0] == 2**16 and s[-1] == 2**20 and len(s) == 9
    assert all(v % 4096 == 0 for v in s) and s == sorted(set(s))
    ratios = [b / a for a, b in zip(s, s[1:])]
    assert all(1.3 < r < 1.55 for r in ratios)
    with pytest.raises(ValueError):
        memory_hierarchy.sizes(2**20, 2**16)


def test_level_windows_and_values():
    l2 = 60 * 2**20
    w = memory_hierarchy.level_windows(l2)
    assert w["L2"] == (2**20, l2 / 2) and w["HBM"][0] == 4 * l2
    recs = [{"working_set_bytes": s, "gbps": float(i)} for i, s in enumerate([2**14, 2**21, 2**22, 2**23, 2**29])]
    assert memory_hierarchy.level_value(recs, "gbps", w["L1"]) == 0.0
    assert memory_hierarchy.level_value(recs, "gbps", w["L2"]) == 2.0  # median of 1, 2, 3
    assert memory_hierarchy.level_value(recs, "gbps", w["HBM"]) == 4.0
    assert math.isnan(memory_hierarchy.level_value(recs, "gbps", (1, 2)))
    assert memory_hierarchy.level_windows(2**15, l1_max=4096, l2_min=8192)["L2"] == (8192, 2**14)
    with pytest.raises(ValueError):
        memory_hierarchy.level_windows(2**20, l2_min=2**20)


def test_littles_law():
    out = memory_hierarchy.littles_law(4000.0, 500.0, sms=100, threads_per_sm=2000)
    assert out["bytes_in_flight"] == pytest.approx(2e6)  # 4e12 B/s * 5e-7 s
    assert out["per_sm"] == pytest.approx(2e4) and out["per_thread"] == pytest.approx(10.0)
    with pytest.raises(ValueError):
        memory_hierarchy.littles_law(0, 1, 1)


def test_card_and_rows():
    c = memory_hierarchy.card()
    assert c.sms > 0 and c.l2_bytes > 2**20 and c.hbm_bytes > c.l2_bytes > c.smem_per_sm_bytes
    rows = memory_hierarchy.hierarchy_rows(c)
    assert [r["level"] for r in rows] == ["registers", "shared memory / L1", "L2 cache", "HBM"]


def test_bandwidth_sweep_records(monkeypatch):
    recs = memory_hierarchy.bandwidth_sweep([4096, 8192 + 4], programs=3, block=256, num_warps=2, target_bytes=2**15,
                                  progress=False)
    assert [r["working_set_bytes"] for r in recs] == [4096, 8196]
    for r in recs:
        assert r["probe"] == "bandwidth" and r["gbps"] > 0 and r["passes"] >= 1
    monkeypatch.setattr(memory_hierarchy.bench, "time_fn", fixed_timer(1.0))
    for r in memory_hierarchy.bandwidth_sweep([4096, 8192 + 4], programs=3, block=256, num_warps=2, target_bytes=2**15,
                                    progress=False):
        launch = r["gbps"] * 1e6  # bytes a launch reads: 1 ms at gbps
        per_pass = launch / r["passes"]
        assert per_pass >= r["working_set_bytes"]  # every pass reads the whole working set (or more)
        assert 2**15 - per_pass < launch <= 2**15  # as many passes as fit in target_bytes
    with pytest.raises(ValueError, match="multiples of 4"):
        memory_hierarchy.bandwidth_sweep([6])


def test_latency_ladder_records():
    recs = memory_hierarchy.latency_ladder([128, 2560, 4096, 8192], min_steps=8, full_cycle_nodes=32, progress=False)
    # 1 node: min_steps; 20 and 32 nodes: one full lap; 64 nodes (> 32): part-way, two times min_steps
    assert [r["steps"] for r in recs] == [8, 20, 32, 16]
    assert all(r["probe"] == "latency" and math.isfinite(r["ns_per_load"]) for r in recs)
    with pytest.raises(ValueError, match="multiples of 128"):
        memory_hierarchy.latency_ladder([100])


def test_plots_accept_nan_levels():
    import matplotlib

    matplotlib.use("Agg")
    recs = [{"working_set_bytes": 2**k, "gbps": 10.0 + k, "ns_per_load": 5.0 + k} for k in range(12, 20)]
    ax = memory_hierarchy.plot_bandwidth(recs, 2**16, 4800.0, 20.0, math.nan)
    assert ax.get_xscale() == "log"
    ax = memory_hierarchy.plot_latency(recs, 2**16, {"L1": 5.0, "L2": math.nan})
    assert ax.get_yscale() == "log"


def test_levels_of_a_run_and_the_reference_run():
    recs = ([{"probe": "bandwidth", "working_set_bytes": s, "gbps": g} for s, g in
             ((2**20, 900.0), (2**21, 1000.0), (2**26, 400.0), (2**27, 300.0))]
            + [{"probe": "latency", "working_set_bytes": s, "ns_per_load": ns} for s, ns in
               ((2**27, 500.0), (4096, 20.0), (2**20, 150.0))])
    levels = memory_hierarchy.levels_of(recs, 8 * 2**20)
    assert levels.gbps == {"L2": 950.0, "HBM": 350.0} and levels.ns == {"L1": 20.0, "L2": 150.0, "HBM": 500.0}
    assert [r["working_set_bytes"] for r in levels.latency] == [4096, 2**20, 2**27]
    ref, run = memory_hierarchy.reference_levels()
    assert run.path.parent.name == "h100-80gb-hbm3" and ref.l2_bytes == 50 * 2**20
    assert ref.gbps["L2"] > ref.gbps["HBM"] > 0 and ref.ns["HBM"] > ref.ns["L2"] > ref.ns["L1"] > 0
