"""What one point of the sweep measures (:class:`PointSpec`), the fields every record of a point carries, and the
sweep's plans (:func:`plan`, :func:`full_plan`), which the sweep and its re-timing both run."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable

import torch

from .. import results
from ..datasheets import CAPS
from ..llama.lora import LoraSettings
from ..llama.memory_caps import cap_on_card
from ..llama.models import MODELS

KINDS = ("train", "generate")
ATTN = ("sdpa", "eager")
BATCH_SIZES = (1, 2, 4, 8, 16, 20, 25, 32)
NEW_TOKENS = (64, 128, 256, 512)
SEED_MAX_LEN = 1024


@dataclass(frozen=True)
class PointSpec:
    """What one point measures. ``cap_gb``: the emulated card's memory in GiB (None: the whole card)."""

    kind: str
    model: str
    batch_size: int = 1
    cap_gb: float | None = None
    lora_r: int = 16
    attn: str = "sdpa"  # attention kernel: "sdpa" (today's default) or "eager" (the seed's transformers 4.31)
    grad_ckpt: bool = True  # gradient checkpointing (QLoRA recipes turn it on)
    max_len: int | None = None  # truncate texts to this many tokens (None: the data's full lengths)
    warmup_steps: int = 2  # the first holds the longest texts: the epoch's peak memory
    timed_steps: int = 3
    new_tokens: tuple[int, ...] = field(default=NEW_TOKENS)

    def key(self) -> str:
        """A stable name: two specs with the same key measure the same thing (cap 40 and 40.0 alike)."""
        cap = "none" if self.cap_gb is None else f"{self.cap_gb:g}"
        if self.kind == "generate":
            return (f"generate/{self.model}/cap={cap}/r={self.lora_r}/{self.attn}"
                    f"/new={','.join(map(str, self.new_tokens))}")
        return (f"train/{self.model}/b={self.batch_size}/cap={cap}/r={self.lora_r}/{self.attn}/len={self.max_len}"
                f"/steps={self.warmup_steps}+{self.timed_steps}" + ("" if self.grad_ckpt else "/no-ckpt"))

    def validate(self, card_gb: float | None) -> None:
        """Raise ValueError naming the problem; ``card_gb``: this GPU's memory in GiB (None: no GPU). A cap a little
        above the card (a real A100 40GB reports ~39.4 GiB) runs as the whole card (``memory_caps.cap_on_card``)."""
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch size must be an integer >= 1, got {self.batch_size!r}")
        LoraSettings(r=self.lora_r)
        if self.attn not in ATTN:
            raise ValueError(f"attn must be one of {ATTN}, got {self.attn!r}")
        if self.cap_gb is not None:
            if self.cap_gb <= 0:
                raise ValueError(f"memory cap must be > 0 GiB, got {self.cap_gb}")
            if card_gb is not None and cap_on_card(self.cap_gb, card_gb) is None:
                raise ValueError(f"memory cap {self.cap_gb} GiB is larger than this card ({card_gb:.1f} GiB)")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 or None, got {self.max_len}")
        if self.warmup_steps < 1 or self.timed_steps < 1:
            raise ValueError("need at least one warm-up and one timed step")
        if self.kind == "generate" and (not self.new_tokens or min(self.new_tokens) < 1):
            raise ValueError(f"new_tokens must be positive counts, got {self.new_tokens}")

    @classmethod
    def from_json(cls, text: str) -> "PointSpec":
        fields = json.loads(text)
        if "new_tokens" in fields:
            fields["new_tokens"] = tuple(fields["new_tokens"])
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def base_record(spec: PointSpec, device: torch.device) -> dict:
    """The fields every record of a point carries, including the commit and time of the run that measured
    it: a sweep resumed over several sessions keeps each point's own provenance."""
    run = results.provenance()
    return {"point": spec.key(), "model": spec.model, "lora_r": spec.lora_r, "cap_gb": spec.cap_gb,
            "attn": spec.attn, "device": device.type, "git_commit": run["git_commit"], "measured_at": run["timestamp"]}


def full_plan() -> list[PointSpec]:
    """The notebook's sweep at full scale, in the order that answers the seed's claims first.

    The seed's stack: eager attention (transformers 4.31 had no fused attention for Llama) and texts
    cut at 1,024 tokens (trl's SFTTrainer default when ``max_seq_length`` is not given, as in the
    seed's script). First the two emulated cards for every model, then 70B at LoRA ranks 8 and 2
    under the 40 GB cap (the seed's A100 attempts), then the whole card, one 7B point without
    gradient checkpointing, and 7B with today's fused attention (sdpa).
    """
    seed = {"attn": "eager", "max_len": SEED_MAX_LEN}
    models = ("7b", "13b", "70b")
    return (plan(models, caps=(40, 48), **seed)
            + [PointSpec("train", "70b", 1, 40, lora_r=r, **seed) for r in (8, 2)]
            + plan(models, caps=(None,), **seed)
            + [PointSpec("train", "7b", 4, None, grad_ckpt=False, **seed)]
            + plan(("7b",), caps=(None,), attn="sdpa", max_len=SEED_MAX_LEN))


def plan(models: Iterable[str] = ("7b", "13b", "70b"), batch_sizes: Iterable[int] = BATCH_SIZES,
         caps: Iterable[float | None] = tuple(CAPS), *, generate: bool = True, **spec_fields) -> list[PointSpec]:
    """The points of a sweep, in the order they run: per model, per cap, batch sizes growing, then generation."""
    points = []
    for model in models:
        for cap in caps:
            points += [PointSpec("train", model, batch, cap, **spec_fields) for batch in batch_sizes]
            if generate:
                gen_fields = {k: v for k, v in spec_fields.items() if k in ("lora_r", "attn", "new_tokens")}
                points.append(PointSpec("generate", model, 1, cap, **{"new_tokens": NEW_TOKENS, **gen_fields}))
    return points
