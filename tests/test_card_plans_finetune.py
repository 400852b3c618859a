"""Notebooks 06 and 08's plans on every stand-in card: each point fits the memory it runs under, by the byte
estimates the plans use, or is left out with a printed line naming it."""
import pytest

from helpers import results
from helpers.card_fit import CARDS, GiB, CardLimits
from helpers.finetune import card_plan
from helpers.finetune.card_plan import CardPlan, reference_peak_bytes, room_bytes, weight_bytes
from helpers.finetune.point_spec import PointSpec, full_plan
from helpers.llama.memory_caps import cap_line, cap_on_card

REFERENCE = results.reference("finetune").records
ALL_CARDS = list(CARDS.values())


@pytest.fixture(autouse=True)
def packages_present(monkeypatch):
    """The plans as they are on a GPU machine with bitsandbytes and peft, whatever this machine has."""
    monkeypatch.setattr(card_plan, "missing_packages", lambda: [])


def overfull(plan: CardPlan, card: CardLimits, peaks: bool) -> list[str]:
    """The points of ``plan`` that ``card`` cannot hold: a cap it cannot emulate, weights over the memory the point
    runs under, or (``peaks``) a peak measured in the committed sweep over it."""
    bad = []
    for p in plan.points:
        room = room_bytes(p.cap_gb, card)
        if room is None or weight_bytes(p.model) > room:
            bad.append(p.key())
        elif peaks:
            need = reference_peak_bytes(p.model, p.batch_size, REFERENCE)
            if need is None or need > room:
                bad.append(p.key())
    return bad


def said(plan: CardPlan, *words: str) -> bool:
    return any(all(w in line for w in words) for line in plan.lines)


def test_the_check_fails_on_a_plan_that_overfills_a_card():
    t4 = CARDS["Tesla T4"]
    planted = CardPlan([PointSpec("train", "70b", 1, None), PointSpec("train", "7b", 1, 40)], [])
    assert overfull(planted, t4, peaks=False) == [p.key() for p in planted.points]
    big_batch = CardPlan([PointSpec("train", "7b", 32, None, attn="eager", max_len=1024)], [])
    assert overfull(big_batch, t4, peaks=True)  # 7B at batch 32 peaks at ~44 GiB in the committed sweep


@pytest.mark.parametrize("card", ALL_CARDS, ids=lambda c: c.name)
def test_the_sweep_plan_fits_each_card_or_says_what_it_skips(card):
    plan = card_plan.sweep_plan(card)
    assert overfull(plan, card, peaks=False) == []
    kept = {p.key() for p in plan.points}
    for p in full_plan():
        if p.key() in kept:
            continue
        if p.cap_gb is not None and cap_on_card(p.cap_gb, card.memory_gib) is None:
            assert said(plan, f"a {p.cap_gb:g} GiB cap", "skipped")
        else:
            assert said(plan, "skipped", p.model, "weights alone")
    for p in plan.points:
        p.validate(card.memory_gib)  # what the sweep checks before any point runs: none is refused


@pytest.mark.parametrize("card", ALL_CARDS, ids=lambda c: c.name)
def test_the_live_part_fits_each_card_by_the_committed_peaks(card):
    plan = card_plan.live_plan(card, REFERENCE)
    assert overfull(plan, card, peaks=True) == []
    assert {p.model for p in plan.points} <= {"7b"}
    assert len(plan.points) <= len(card_plan.LIVE_BATCHES) * (1 + len(card_plan.SEED_CAPS))
    for cap in (None, *card_plan.SEED_CAPS):
        ran = {p.batch_size for p in plan.points if p.cap_gb == cap}
        if cap is not None and cap_on_card(cap, card.memory_gib) is None:
            assert not ran and said(plan, f"a {cap:g} GiB cap", "skipped")
            continue
        for batch in set(card_plan.LIVE_BATCHES) - ran:
            assert said(plan, f"batch {batch}", "skipped")


@pytest.mark.parametrize("card", ALL_CARDS, ids=lambda c: c.name)
def test_notebook_08_on_one_card(card):
    plan = card_plan.one_gpu_plan(card, REFERENCE)
    assert overfull(plan, card, peaks=False) == []
    for p in plan.points:
        if p.cap_gb is None:
            assert reference_peak_bytes(p.model, p.batch_size, REFERENCE) <= room_bytes(None, card)
    capped = [p for p in plan.points if p.cap_gb == 40]
    emulates_40 = cap_on_card(40, card.memory_gib) is not None
    assert bool(capped) == emulates_40  # the one-card 70B under 40 GiB runs wherever a 40 GiB card can be emulated
    assert emulates_40 or said(plan, "a 40 GiB cap", "skipped")
    keys = {(p.model, p.cap_gb) for p in plan.points}
    for model in ("70b", "7b"):
        assert (model, None) in keys or said(plan, "skipped", model, "whole card")


def test_the_reference_cards_run_everything_and_the_small_ones_skip_with_a_line():
    h100, a10 = CARDS["NVIDIA H100 80GB HBM3"], CARDS["NVIDIA A10"]
    assert len(card_plan.sweep_plan(h100).points) == len(full_plan()) and not card_plan.sweep_plan(h100).lines
    assert len(card_plan.live_plan(h100, REFERENCE).points) == 6
    assert {(p.model, p.cap_gb) for p in card_plan.one_gpu_plan(h100, REFERENCE).points} == {
        ("70b", 40), ("70b", None), ("7b", None)}
    small = card_plan.sweep_plan(a10)
    assert all(p.cap_gb is None and p.model != "70b" for p in small.points if p.kind == "train")


@pytest.mark.parametrize("name,cap", [("NVIDIA A100-SXM4-40GB", 40), ("NVIDIA RTX 6000 Ada Generation", 48)])
def test_the_seed_cards_run_their_cap_as_the_whole_card(name, cap):
    """A real A100 40GB reports ~39.4 GiB and an RTX 6000 Ada ~47.5: the cap they stand for runs as the whole card,
    with a printed line, instead of being refused."""
    card = CARDS[name]
    assert cap_on_card(cap, card.memory_gib) == card.memory_gib
    assert "runs as the whole" in cap_line(cap, card.name, card.memory_gib)
    plan = card_plan.sweep_plan(card)
    assert any(p.cap_gb == cap for p in plan.points) and said(plan, f"the {cap:g} GiB cap runs as the whole")
    PointSpec("train", "7b", 1, cap).validate(card.memory_gib)


def test_a_cap_well_above_the_card_is_still_refused():
    assert cap_on_card(48, 39.4) is None and cap_on_card(40, 40.0) == 40 and cap_on_card(20, 39.4) == 20
    with pytest.raises(ValueError, match="larger than this card"):
        PointSpec("train", "7b", 1, 48).validate(39.4)


def test_without_a_gpu_the_plans_are_the_smoke_scale():
    assert {p.model for p in card_plan.sweep_plan(None).points} == {"tiny"}
    assert {p.model for p in card_plan.live_plan(None, REFERENCE).points} == {"tiny"}
    one = card_plan.one_gpu_plan(None, REFERENCE)
    assert one.points == [] and len(one.lines) == 1


def test_a_gpu_without_the_nf4_packages_skips_the_live_parts_with_one_line(monkeypatch):
    monkeypatch.setattr(card_plan, "missing_packages", lambda: ["bitsandbytes"])
    for plan in (card_plan.live_plan(CARDS["NVIDIA H100 80GB HBM3"], REFERENCE),
                 card_plan.one_gpu_plan(CARDS["NVIDIA H100 80GB HBM3"], REFERENCE)):
        assert plan.points == [] and len(plan.lines) == 1 and "bitsandbytes" in plan.lines[0]


def test_a_reference_peak_is_the_committed_whole_card_point():
    seven = next(r for r in REFERENCE if r["point"] == "train/7b/b=4/cap=none/r=16/eager/len=1024/steps=2+3")
    assert reference_peak_bytes("7b", 4, REFERENCE) == seven["peak_reserved_gb"] * GiB
    assert reference_peak_bytes("70b", 32, REFERENCE) is None  # out of memory: no peak to size by


def test_the_sweeps_command_line_runs_this_cards_plan(monkeypatch, capsys):
    from helpers.finetune import sweep

    ran = []
    monkeypatch.setattr(sweep, "run_sweep", lambda points, **kw: ran.append(points) or [])
    monkeypatch.setattr(sweep, "pending", lambda points: [])
    monkeypatch.setattr(sweep, "pick", lambda full, smoke: full)  # as on a GPU
    monkeypatch.setattr(sweep, "this_card", lambda: CARDS["NVIDIA A100-SXM4-40GB"])
    sweep.main(["--full-plan"])
    assert ran[0] == card_plan.sweep_plan(CARDS["NVIDIA A100-SXM4-40GB"]).points
    assert {p.cap_gb for p in ran[0]} == {None, 40}  # no 48 GiB point for the validation to refuse
    assert "the 40 GiB cap runs as the whole" in capsys.readouterr().out
