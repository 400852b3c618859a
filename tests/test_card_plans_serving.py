"""Notebook 09's plan on every stand-in card: each kernel timing, decode batch, pool and cap fits the card by the
byte estimates the plan uses (``kv_cache``), or is left out with a printed line; and the bandwidth a decode step's
roofline uses on a GPU without a datasheet row."""
import pytest
import torch

import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)
from helpers import bench, datasheets
from helpers.card_fit import CARDS, CardLimits, GiB
from helpers.llama.memory_caps import cap_on_card
from helpers.llama.models import MODELS
from helpers.studies import kv_cache
from helpers.studies.kv_cache import ServingPlan

# notebook 09's full-scale sizes (cells of sections 3 and 4)
KERNEL_POINTS = [(b, c, 32, 32) for c in (512, 4096) for b in (1, 16, 64)] + [(16, 4096, 64, 8)]
CONTEXTS, BATCHES, STEPS, HEAD_DIM = [512, 2048], [1, 2, 4, 8, 16, 32, 64, 128, 256], 16, 128
SPEC = MODELS["7b"]


def plan_for(card: CardLimits | None) -> ServingPlan:
    return kv_cache.serving_plan(card, KERNEL_POINTS, HEAD_DIM, torch.bfloat16, CONTEXTS, BATCHES, STEPS)


def overfull(plan: ServingPlan, card: CardLimits) -> list[str]:
    """What ``plan`` puts on ``card`` beyond what it holds."""
    bad = [f"kernel point {p}" for p in plan.kernel_points
           if kv_cache.kernel_point_bytes(p[0], p[1], p[3], HEAD_DIM, torch.bfloat16) > 0.85 * card.memory_bytes]
    room = kv_cache.cache_room_bytes(card, SPEC)
    bad += [f"batch {b} at {c}" for c, bs in plan.batches.items() for b in bs
            if kv_cache.sweep_cache_bytes(SPEC, b, c, STEPS) > room]
    if plan.pool_pages * kv_cache.PAGE_TOKENS * SPEC.kv_bytes_per_token() > room:
        bad.append(f"pool of {plan.pool_pages} pages")
    bad += [f"cap {c}" for c, runs in plan.caps.items() if runs > card.memory_gib]
    return bad


def test_the_check_fails_on_a_plan_that_overfills_a_card():
    t4 = CARDS["Tesla T4"]
    planted = ServingPlan([(64, 4096, 32, 32)], {512: [256]}, 4659, {48: 48.0}, [])
    assert len(overfull(planted, t4)) == 4


@pytest.mark.parametrize("card", list(CARDS.values()), ids=lambda c: c.name)
def test_each_card_gets_what_it_holds_and_a_line_for_the_rest(card):
    plan = plan_for(card)
    assert overfull(plan, card) == []
    assert plan.kernel_points[0] == KERNEL_POINTS[0]  # the smallest point always runs: section 3's plot needs it
    for point in set(KERNEL_POINTS) - set(plan.kernel_points):
        assert any(f"timing {point[0]} requests of {point[1]:,} tokens" in line for line in plan.lines)
    for context in CONTEXTS:
        assert plan.batches[context][:2] == [1, 2]  # batch 1 and 2 fit every card: the curve has a start
        left_out = [b for b in BATCHES if b not in plan.batches[context]]
        assert not left_out or any(f"context {context:,} at batches {left_out}" in line for line in plan.lines)
    full_pool = kv_cache.cache_tokens_under_cap(SPEC, kv_cache.CAPS_GIB[0]) // kv_cache.PAGE_TOKENS
    assert 0 < plan.pool_pages <= full_pool
    assert plan.pool_pages == full_pool or any("the pool gets those" in line for line in plan.lines)
    for cap in kv_cache.CAPS_GIB:
        runs = cap_on_card(cap, card.memory_gib)
        assert plan.caps.get(cap) == runs
        assert runs == cap or any(f"{cap:g} GiB cap" in line for line in plan.lines)


def test_the_reference_h100_runs_what_the_committed_run_ran():
    plan = plan_for(CARDS["NVIDIA H100 80GB HBM3"])
    assert plan.kernel_points == KERNEL_POINTS
    assert plan.batches == {512: [1, 2, 4, 8, 16, 32, 64, 128], 2048: [1, 2, 4, 8, 16, 32]}
    assert plan.pool_pages == kv_cache.cache_tokens_under_cap(SPEC, 40) // 16 and plan.caps == {40: 40, 48: 48}


def test_a_24_gb_card_measures_no_cap_and_a_40_gb_a100_its_own():
    assert plan_for(CARDS["NVIDIA L4"]).caps == {}
    a100 = CARDS["NVIDIA A100-SXM4-40GB"]
    assert plan_for(a100).caps == {40: a100.memory_gib}


def test_without_a_gpu_nothing_is_left_out():
    plan = plan_for(None)
    assert plan.kernel_points == KERNEL_POINTS and plan.caps == {} and plan.lines == []
    assert plan.batches == {c: BATCHES for c in CONTEXTS}


def test_the_step_bandwidth_of_a_gpu_with_and_without_a_datasheet_row(monkeypatch):
    gbps, source = kv_cache.step_bandwidth("NVIDIA H100 80GB HBM3")
    assert gbps == datasheets.lookup("NVIDIA H100 80GB HBM3").bandwidth_gbps and "datasheet" in source
    monkeypatch.setattr(datasheets, "lookup", lambda name: None)  # as if the H100 had no row: notebook 00's copy
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: pytest.fail("measured although notebook 00 saved one"))
    gbps, source = kv_cache.step_bandwidth("NVIDIA H100 80GB HBM3")
    saved = helpers.results.load("ceilings", gpu="h100-80gb-hbm3").records
    assert gbps == next(r["gbps"] for r in saved if r["what"] == "copy") and "notebook 00" in source
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: {"gbps": 123.0})  # no row and no saved ceilings: measured
    assert kv_cache.step_bandwidth("NVIDIA Unknown Card 12GB") == (
        123.0, "no datasheet row for NVIDIA Unknown Card 12GB: the copy bandwidth measured here")


def test_a_pool_is_never_larger_than_the_card_holds():
    tiny = CardLimits("tiny", int(6 * GiB), (8, 0), 163 * 1024, 10)  # 6 GiB: no room beside 7B's weights
    plan = plan_for(tiny)
    assert plan.pool_pages == 0 and all(bs == [] for bs in plan.batches.values())
