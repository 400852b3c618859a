"""Notebooks 05 and 07 size their work to the card: every plan, run for each stand-in card of ``card_fit.CARDS``,
puts on the card only what its byte estimate says fits, and skips the rest with a printed line."""
import dataclasses

import pytest
import torch

from helpers import results
from helpers.card_fit import CARDS, GiB
from helpers.finetune import kernels_step
from helpers.llama.models import spec_for
from helpers.studies import attention_designs as ad
from helpers.studies import decoding_ladder

# notebook 05's full-scale grids: the memory sweep, the claim's sweep and the race
MEM = [(impl, "fwd+bwd", 1, 32, s, 128, False) for impl in ("naive", "triton")
       for s in (1024, 2048, 4096, 8192, 16384, 32768, 65536)]
CLAIM = [(impl, p, 1, 32, s, 128, False) for s in (1024, 2048, 4096, 8192, 16384) for impl in ("naive", "triton")
         for p in ("fwd", "fwd+bwd")]
RACE = [(impl, p, 16384 // s, 32, s, d, c) for s in (512, 1024, 2048, 4096, 8192, 16384) for d in (64, 128)
        for c in (False, True) for p in ("fwd", "fwd+bwd") for impl in ad.IMPLS]
BATCHES, MAX_LEN = {1: 6, 4: 50, 16: 6}, 1024  # notebook 07's full-scale training runs
SMALL = dataclasses.replace(CARDS["NVIDIA L4"], name="a 4 GiB card", memory_bytes=4 * GiB)


@pytest.mark.parametrize("card", CARDS.values(), ids=list(CARDS))
@pytest.mark.parametrize("grid", [MEM, CLAIM, RACE], ids=["memory sweep", "claim", "race"])
def test_attention_plan_keeps_what_fits_and_names_what_it_skips(card, grid):
    dtype = ad.timing_dtype(card)
    keep, lines = ad.plan_points(card, grid, dtype)
    size = torch.empty((), dtype=dtype).element_size()
    for impl, pass_, b, h, s, d, _ in keep:
        assert card.fits(ad.attention_bytes(impl, b, h, s, d, size, pass_)), (impl, pass_, b, s)
    for impl, pass_, b, h, s, d, causal in set(grid) - set(keep):
        need = ad.attention_bytes(impl, b, h, s, d, size, pass_)
        left_out_by_note = not card.triton_tensor_cores and (s > ad.SLOW_CARD_MAX_S or impl in ad.SM80_IMPLS)
        assert left_out_by_note or (not card.fits(need) and any(f"{impl} attention at B = {b}, S = {s:,}" in line
                                                                for line in lines)), (impl, pass_, b, s)
    assert len(lines) == len(set(lines)) and all(line.startswith(f"skipped on {card.name}") for line in lines)
    assert any(p[0] == "triton" for p in keep)  # every card measures the course's kernel


def test_standard_attention_at_65536_fits_no_card_and_the_h100_keeps_the_rest():
    for card in CARDS.values():
        keep, _ = ad.plan_points(card, MEM, ad.timing_dtype(card))
        assert ("naive", "fwd+bwd", 1, 32, 65536, 128, False) not in keep
    keep, lines = ad.plan_points(CARDS["NVIDIA H100 80GB HBM3"], MEM + CLAIM + RACE, torch.bfloat16)
    assert set(MEM + CLAIM + RACE) - set(keep) == {("naive", "fwd+bwd", 1, 32, s, 128, False) for s in (32768, 65536)}
    assert len(lines) == 2


def test_a_card_without_triton_tensor_cores_says_why_and_times_fp16():
    t4 = CARDS["Tesla T4"]
    assert ad.timing_dtype(t4) == torch.float16 and ad.timing_dtype(CARDS["NVIDIA L4"]) == torch.bfloat16
    assert ad.timing_dtype(None) == torch.float16  # the CPU interpreter gets bf16 wrong
    assert "no tensor cores" in ad.card_notes(t4)[0] and ad.card_notes(CARDS["NVIDIA A10"]) == []
    keep, _ = ad.plan_points(t4, RACE, torch.float16)
    assert max(p[4] for p in keep) == ad.SLOW_CARD_MAX_S and not {p[0] for p in keep} & set(ad.SM80_IMPLS)
    assert "bf16 is emulated" in decoding_ladder.ladder_plan(t4, ["7b"], 32000, 144)[1][0]
    assert "bf16 is emulated" in kernels_step.training_plan(t4, "7b", BATCHES, MAX_LEN).lines[0]


def test_a_plan_fails_a_card_too_small_for_it():
    keep, lines = ad.plan_points(SMALL, RACE, torch.bfloat16)
    assert not [p for p in keep if p[0] == "naive" and p[4] >= 2048] and lines
    assert decoding_ladder.ladder_plan(SMALL, ["7b"], 32000, 144)[0] == []


def test_attention_bytes_bound_the_measured_peaks():
    """The estimate (less the inputs, which the measurement leaves out) is at least every peak measured on the
    H200, and standard attention's at most 1.2x it: the plan neither crowds a card nor skips what fits."""
    for r in results.load("flash_attention", gpu="h200").records:
        if r["peak_mem_bytes"]:
            inputs = 4 * r["B"] * r["H"] * r["S"] * r["D"] * 2
            estimate = ad.attention_bytes(r["impl"], r["B"], r["H"], r["S"], r["D"], 2, r["pass"]) - inputs
            assert estimate >= r["peak_mem_bytes"], r
            if r["impl"] == "naive" and r["S"] >= 1024:
                assert estimate <= 1.2 * r["peak_mem_bytes"], r


@pytest.mark.parametrize("card", CARDS.values(), ids=list(CARDS))
def test_decoding_ladder_plan(card):
    names, lines = decoding_ladder.ladder_plan(card, ["7b", "13b", "70b"], 32000, 144)
    for name in names:
        assert card.fits(decoding_ladder.ladder_bytes(spec_for(name, 32000), 144))
    for name in {"7b", "13b", "70b"} - set(names):
        assert not card.fits(decoding_ladder.ladder_bytes(spec_for(name, 32000), 144))
        assert any(f"the {name} decoding ladder" in line for line in lines)
    assert "7b" in names  # 16 GB and up holds the 7B ladder


@pytest.mark.parametrize("card", CARDS.values(), ids=list(CARDS))
def test_training_plan_runs_only_what_fits(card):
    spec = spec_for("7b")
    plan = kernels_step.training_plan(card, "7b", BATCHES, MAX_LEN)
    model = kernels_step.variant_model_bytes(spec)
    for i, variant in enumerate(plan.variants):
        for b in plan.runs(variant):
            held = i * model if plan.hold else 0
            assert card.fits(held + kernels_step.step_bytes(spec, variant, b, MAX_LEN)), (variant, b)
    for b in set(BATCHES) - set(plan.batches):
        assert any(f"QLoRA step at batch {b}" in line for line in plan.lines)
    if kernels_step.GRAPHED in plan.variants:
        assert plan.curve_batch in plan.graphed_batches
    for b in set(plan.batches) - set(plan.graphed_batches):
        assert any(f"graphed 7b step at batch {b}" in line or "left out" in line for line in plan.lines)
    for b, paced in plan.paced.items():
        assert {"stock", "course"} <= set(paced) and card.fits(kernels_step.pacing_bytes(spec, paced, b, MAX_LEN))
    assert plan.paced and plan.curve_batch == 4


def test_the_graphed_step_at_batch_16_is_skipped_on_24_gb_cards_and_kept_on_the_h100():
    for name in ("NVIDIA A10", "NVIDIA L4", "NVIDIA GeForce RTX 4090", "Tesla T4"):
        plan = kernels_step.training_plan(CARDS[name], "7b", BATCHES, MAX_LEN)
        assert 16 not in plan.graphed_batches and 16 not in plan.batches
    h100 = kernels_step.training_plan(CARDS["NVIDIA H100 80GB HBM3"], "7b", BATCHES, MAX_LEN)
    assert h100.batches == BATCHES and h100.graphed_batches == (1, 4, 16) and h100.hold and not h100.lines
    assert h100.paced == {1: kernels_step.VARIANTS, 4: kernels_step.VARIANTS}
    with pytest.raises(ValueError, match="no batch size"):
        kernels_step.training_plan(SMALL, "7b", BATCHES, MAX_LEN)


def test_step_bytes_bound_the_measured_peaks():
    """Each variant's estimate is at least the peak measured on the H200 at each batch size, at most 1.3x it."""
    spec = spec_for("7b")
    for r in results.load("finetune_kernels", gpu="h200").records:
        estimate = kernels_step.step_bytes(spec, r["variant"], r["batch_size"], r["max_len"]) / GiB
        assert r["peak_alloc_gb"] <= estimate <= 1.3 * r["peak_alloc_gb"], r


def test_without_a_gpu_every_eager_variant_runs_and_nothing_is_skipped():
    plan = kernels_step.training_plan(None, "tiny", {2: 2}, 32)
    assert plan.variants == ("stock", "sdpa bf16", "course") and plan.batches == {2: 2} and not plan.lines
    assert decoding_ladder.ladder_plan(None, ["tiny"], 128, 8) == (["tiny"], [])
    assert ad.plan_points(None, MEM, torch.float16) == (MEM, [])
