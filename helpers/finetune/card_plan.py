"""What notebooks 06 and 08 run on a card: each plan takes the card's limits (``helpers.card_fit``; None: no GPU,
the smoke scale) and returns the points that fit it and one printed line for each thing it changed or skipped.

The byte estimates that decide it: a training point's weights (:func:`weight_bytes`) must fit the memory it runs
under (:func:`room_bytes`: its cap, or 85% of the card); a point of a live part, whose running out of memory is not
the experiment, must also fit its peak as the committed sweep measured it (:func:`reference_peak_bytes`). A cap
a little above the card (a real A100 40GB reports ~39.4 GiB) runs as the whole card (``memory_caps.cap_on_card``).
Out of memory under a cap that fits its weights stays a result of the sweep, not a skip.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from ..card_fit import CardLimits, GiB
from ..llama.memory_caps import cap_line, cap_on_card
from ..llama.models import MODELS, nf4_bytes
from .point_spec import SEED_MAX_LEN, PointSpec, full_plan, plan

FIT_SHARE = 0.85  # the share of a whole card a plan fills (``CardLimits.fits``'s default)
SEED_CAPS = {40: "A100 40GB", 48: "RTX 6000 Ada 48GB"}  # the two cards notebook 06 emulates
SMOKE_CAP = 0.15  # GiB, the simulated cap of the smoke scale
LIVE_BATCHES = (1, 4)  # notebook 06's live part: 7B at these batch sizes under each cap that fits
LIVE_BUDGET_S = 75.0  # no live point starts after this many seconds
SEED = {"attn": "eager", "max_len": SEED_MAX_LEN}  # the seed's stack (notebook 06's main setting)
PACKAGES = ("bitsandbytes", "peft")  # what a GPU point needs to build and train its nf4 model


@dataclass(frozen=True)
class CardPlan:
    """The points a card runs, and a printed line for each thing the card changed or skipped."""

    points: list[PointSpec]
    lines: list[str]


def weight_bytes(model: str) -> int:
    """Bytes a QLoRA model holds before its first step: nf4 linears, and the rest (embeddings, lm_head, norms) in
    fp32, as peft's k-bit preparation casts them."""
    spec = MODELS[model]
    return nf4_bytes(spec) + 4 * (spec.params() - spec.linear_params())


def room_bytes(cap_gb: float | None, card: CardLimits) -> float | None:
    """The memory a point runs under on ``card``: its cap (``cap_on_card``), or ``FIT_SHARE`` of the whole card;
    None where the cap cannot be emulated on this card."""
    if cap_gb is None:
        return FIT_SHARE * card.memory_bytes
    runs = cap_on_card(cap_gb, card.memory_gib)
    return None if runs is None else runs * GiB


def reference_peak_bytes(model: str, batch: int, records: list[dict], attn: str = "eager",
                         max_len: int | None = SEED_MAX_LEN) -> float | None:
    """The peak memory (reserved) the committed sweep ``records`` measured for ``model`` at ``batch`` on the whole
    card, checkpointing on; None where it has no such point or it ran out of memory."""
    for r in records:
        if (r.get("kind") == "train" and r["model"] == model and r["batch_size"] == batch and r.get("cap_gb") is None
                and r.get("attn") == attn and f"/len={max_len}/" in r["point"] and r.get("status") == "ok"
                and not r["point"].endswith("/no-ckpt") and r.get("peak_reserved_gb") is not None):
            return r["peak_reserved_gb"] * GiB
    return None


def missing_packages() -> list[str]:
    """The packages of ``PACKAGES`` not installed here."""
    return [p for p in PACKAGES if importlib.util.find_spec(p) is None]


def _cap_lines(caps, card: CardLimits) -> list[str]:
    return [line for cap in caps if cap is not None and (line := cap_line(cap, card.name, card.memory_gib))]


def _weights_fit(points: list[PointSpec], card: CardLimits) -> tuple[list[PointSpec], list[str]]:
    """The points whose weights fit the memory they run under, and a line for each model and cap that does not."""
    kept, lines = [], []
    for p in points:
        room = room_bytes(p.cap_gb, card)
        if room is None:
            continue  # the cap's own line says why
        if weight_bytes(p.model) <= room:
            kept.append(p)
            continue
        where = "the whole card" if p.cap_gb is None else f"a {p.cap_gb:g} GiB cap"
        line = (f"skipped on {card.name}: {p.model} under {where} (its weights alone need "
                f"{weight_bytes(p.model) / GiB:.1f} GiB, more than the {room / GiB:.1f} GiB it runs under)")
        if line not in lines:
            lines.append(line)
    return kept, lines


def sweep_plan(card: CardLimits | None) -> CardPlan:
    """Notebook 06's own sweep on ``card``: the full plan (the tiny model under a simulated cap without a GPU), less
    the caps this card cannot emulate and the points whose weights do not fit."""
    if card is None:
        return CardPlan(plan(["tiny"], [1, 2, 4], [SMOKE_CAP], max_len=128, new_tokens=(4, 8)), [])
    kept, lines = _weights_fit(full_plan(), card)
    return CardPlan(kept, _cap_lines(SEED_CAPS, card) + lines)


def live_plan(card: CardLimits | None, reference: list[dict]) -> CardPlan:
    """Notebook 06's live part: 7B at ``LIVE_BATCHES`` on the whole card and under each seed cap this card holds, each
    point's peak (as the committed sweep ``reference`` measured it) within the memory it runs under; the tiny model
    on the CPU. Skipped with one line where a GPU lacks ``PACKAGES``."""
    if card is None:
        return CardPlan([PointSpec("train", "tiny", b, None, attn="sdpa", max_len=128) for b in (1, 2)], [])
    if missing := missing_packages():
        return CardPlan([], [f"the live part is skipped: it builds nf4 models with {', '.join(PACKAGES)}, and "
                             f"{', '.join(missing)} is not installed here"])
    points, lines = [], _cap_lines(SEED_CAPS, card)
    for cap in (None, *SEED_CAPS):
        room = room_bytes(cap, card)
        if room is None:
            continue
        for batch in LIVE_BATCHES:
            need = reference_peak_bytes("7b", batch, reference)
            if need is None:
                lines.append(f"live 7B batch {batch} is skipped: the committed sweep has no peak to size it by")
            elif need <= room:
                points.append(PointSpec("train", "7b", batch, cap, **SEED))
            else:
                where = "the whole card" if cap is None else f"the {cap:g} GiB cap"
                lines.append(f"skipped on {card.name}: live 7B batch {batch} under {where} peaks at about "
                             f"{need / GiB:.1f} GiB, more than the {room / GiB:.1f} GiB it runs under")
    return CardPlan(points, lines)


def one_gpu_plan(card: CardLimits | None, reference: list[dict]) -> CardPlan:
    """Notebook 08 on one GPU: 70B at batch 1 under the 40 GiB cap (one A100 40GB: its weights fit, its training runs
    out of memory, which is why it is sharded), 70B at batch 1 on the whole card where its measured peak fits, and
    7B at batch 4 (the one-GPU side of the scaling pair). Without a GPU: none (the CPU processes run the plan)."""
    if card is None:
        return CardPlan([], ["no GPU: the one-card runs need one; the CPU processes above ran the plan's code paths"])
    if missing := missing_packages():
        return CardPlan([], [f"the one-card runs are skipped: they need {', '.join(missing)}, not installed here"])
    seed = {**SEED, "warmup_steps": 2, "timed_steps": 10}
    wanted = [PointSpec("train", "70b", 1, 40, **seed)]
    lines = _cap_lines([40], card)
    for model, batch in (("70b", 1), ("7b", 4)):
        need, room = reference_peak_bytes(model, batch, reference), room_bytes(None, card)
        if need is not None and need <= room:
            wanted.append(PointSpec("train", model, batch, None, **seed))
        else:
            lines.append(f"skipped on {card.name}: {model} at batch {batch} on the whole card peaks at about "
                         + (f"{need / GiB:.1f} GiB" if need else "an unmeasured size")
                         + f", more than {room / GiB:.1f} GiB")
    kept, weight_lines = _weights_fit(wanted, card)
    return CardPlan(kept, lines + weight_lines)
