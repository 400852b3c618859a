"""LoRA adapters through peft, prepared as QLoRA recipes do, with gradient checkpointing verified.

peft's ``prepare_model_for_kbit_training`` freezes the base model, casts every bf16 parameter that
is not 4-bit (embeddings, norms, lm_head) to fp32 and turns gradient checkpointing on, but the
last step only for a model that says it was loaded in 4 or 8 bit (``is_loaded_in_4bit``).
``models.build_random`` sets that flag; ``check_checkpointing`` proves the recomputation happens
rather than trusting the flag: with checkpointing a decoder layer's attention runs twice per step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class LoraSettings:
    """The adapter: rank 16 on the attention's q and v projections by default (the seed's set-up)."""

    r: int = 16
    alpha: int = 16
    dropout: float = 0.1
    target_modules: tuple[str, ...] = field(default=("q_proj", "v_proj"))

    def __post_init__(self) -> None:
        if not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"LoRA rank r must be an integer >= 1, got {self.r!r}")
        if self.alpha <= 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("target_modules must name at least one module")


def attach_lora(model: nn.Module, settings: LoraSettings = LoraSettings(), *,
                gradient_checkpointing: bool = True) -> nn.Module:
    """The peft model with LoRA adapters, prepared for k-bit training (checkpointing on by default)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    missing = [m for m in settings.target_modules if not any(n.endswith("." + m) for n, _ in model.named_modules())]
    if missing:
        raise ValueError(f"target modules not in the model: {missing}")
    if gradient_checkpointing and not (getattr(model, "is_loaded_in_4bit", False)
                                       or getattr(model, "is_loaded_in_8bit", False)):
        raise ValueError("the model does not say it is loaded in 4/8 bit: peft would silently skip gradient "
                         "checkpointing (set model.is_loaded_in_4bit = True for a hand-quantised model)")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                            gradient_checkpointing_kwargs={"use_reentrant": False})
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules), bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    peft_model.config.use_cache = False
    return peft_model


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts; nf4 weights count as the numbers they stand for."""
    trainable = total = 0
    for p in model.parameters():
        # two nf4 weights a byte, whatever dtype the packed bytes are stored as
        n = p.numel() * p.element_size() * 2 if p.__class__.__name__ == "Params4bit" else p.numel()
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a (peft-wrapped) Llama model."""
    # FSDP2's fully_shard gives a sharded layer a subclass of its own (FSDPLlamaDecoderLayer)
    layers = [m for m in model.modules() if any(c.__name__ == "LlamaDecoderLayer" for c in type(m).__mro__)]
    if not layers:
        raise ValueError("no LlamaDecoderLayer in this model")
    return layers


def count_layer_forwards(model: nn.Module, run_step) -> int:
    """How many times the first decoder layer's attention runs during ``run_step()`` (forward + backward).

    The attention (where the adapters sit), not the layer itself: depending on the transformers release,
    checkpointing wraps the layer's ``forward`` or its ``__call__``, and only a submodule's hook sees the
    recomputation in both.
    """
    calls = []
    handle = decoder_layers(model)[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
    try:
        run_step()
    finally:
        handle.remove()
    return len(calls)


def check_checkpointing(model: nn.Module, input_ids: torch.Tensor) -> bool:
    """True when gradient checkpointing really recomputes: a layer's attention runs twice in one training step."""
    model.train()

    def step() -> None:
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()

    forwards = count_layer_forwards(model, step)
    model.zero_grad(set_to_none=True)
    return forwards == 2
