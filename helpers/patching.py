"""Put the course's kernels into a Hugging Face Llama model (the kernels themselves live in ``helpers.kernels``).

    use_course_kernels(model)   # FlashAttention (notebook 05) and the fused RMSNorm, in place

Attention goes through transformers' attention interface: the model's attention modules call the
function registered under ``ATTENTION_NAME``. It applies the causal mask only, which is exact for
causal language-model training with right padding: a real token never attends to a later position,
so the pads at the end of a row are never seen by it. A left-padded batch is refused.
"""
from __future__ import annotations

import torch
from torch import nn

ATTENTION_NAME = "course"  # a name with "flash" in it would send transformers looking for a hub kernel


def course_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature around ``flash_attention``: q (B, H, S, D), k and v
    (B, H_kv, S_k, D) in; (B, S, H, D) out, no attention weights."""
    from .kernels.flash_attention import flash_attention

    if dropout:
        raise ValueError(f"the course's attention has no dropout; got dropout={dropout} (set attention_dropout=0)")
    for name in ("softcap", "sliding_window", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"the course's attention does not support {name}")
    out = flash_attention(query, key, value, causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _refuse_left_padding(module: nn.Module, args: tuple, kwargs: dict) -> None:
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dim() == 2 and bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise ValueError("the course's attention applies the causal mask only, which is exact for right "
                         "padding; this batch has padding before real tokens (left padding)")


def use_course_attention(model: nn.Module) -> None:
    """Make every attention layer of ``model`` (a transformers model, peft-wrapped or not) call
    :func:`course_attention`, and refuse left-padded batches."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, course_attention)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(ATTENTION_NAME)
    base.register_forward_pre_hook(_refuse_left_padding, with_kwargs=True)


def use_course_rms_norm(model: nn.Module) -> int:
    """Replace every ``LlamaRMSNorm`` in ``model`` by the fused kernel's module (sharing its weight);
    returns how many were replaced."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from .kernels.rms_norm import FusedRMSNorm

    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, LlamaRMSNorm)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, FusedRMSNorm.from_llama(module))
    return len(targets)


def use_course_kernels(model: nn.Module, attention: bool = True, rms_norm: bool = True) -> dict:
    """Both swaps (each optional); what was changed."""
    done = {}
    if attention:
        use_course_attention(model)
        done["attention"] = ATTENTION_NAME
    if rms_norm:
        done["rms_norm_modules"] = use_course_rms_norm(model)
    return done
