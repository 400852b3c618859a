"""Put the course's kernels into a Hugging Face Llama model for training (which kernel takes which part:
``kernel_set.COURSE``, read each time the patched model runs).

    use_course_kernels(model)   # FlashAttention (notebook 05), the fused RMSNorm, rotary, SwiGLU and nf4 layers

Attention goes through transformers' attention interface: the model's attention modules call the
function registered under a name. Both functions here apply the causal mask only, which is exact for
causal language-model training with right padding: a real token never attends to a later position,
so the pads at the end of a row are never seen by it. A left-padded batch is refused.

After peft's k-bit preparation (fp32 norms, embeddings and lm_head) q, k and v reach attention in
fp32, and transformers' SDPA then runs fp32 attention. Both functions here compute in bf16 instead,
as fused attention kernels do in QLoRA recipes, and hand back the caller's dtype: ``sdpa_bf16`` is
PyTorch's own fused attention that way (the strongest baseline), ``course`` the course's kernel.
"""
from __future__ import annotations

import contextvars
import functools
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.rms_norm import FusedRMSNorm
from . import kernel_set

COURSE, SDPA_BF16 = "course", "sdpa_bf16"  # a name with "flash" in it would send transformers to the hub


def _attention_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float, kwargs: dict):
    if dropout:
        raise ValueError(f"causal-only attention here has no dropout; got dropout={dropout} (set attention_dropout=0)")
    for name in ("softcap", "sliding_window", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"this attention does not support {name}")
    dtype = query.dtype
    if dtype == torch.float32 and query.is_cuda:
        query, key, value = (t.to(torch.bfloat16) for t in (query, key, value))
    return query, key, value, dtype


def course_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature around the kernel set's ``flash_attention``: q (B, H, S, D),
    k and v (B, H_kv, S_k, D) in; (B, S, H, D) out, no attention weights."""
    query, key, value, dtype = _attention_inputs(query, key, value, dropout, kwargs)
    out = kernel_set.COURSE.flash_attention(query, key, value, causal=True, scale=scaling)
    return out.to(dtype).transpose(1, 2).contiguous(), None


def sdpa_bf16_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """The same contract through PyTorch's ``scaled_dot_product_attention`` (its flash kernel in bf16)."""
    query, key, value, dtype = _attention_inputs(query, key, value, dropout, kwargs)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                         enable_gqa=key.shape[1] != query.shape[1])
    return out.to(dtype).transpose(1, 2).contiguous(), None


ATTENTION = {COURSE: course_attention, SDPA_BF16: sdpa_bf16_attention}


def refuse_left_padding(mask: torch.Tensor) -> None:
    """Raise ValueError if a (B, S) attention mask has padding before real tokens: the causal mask alone,
    which the functions here apply, is exact for right padding only."""
    if mask.dim() == 2 and bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise ValueError("this attention applies the causal mask only, which is exact for right padding; "
                         "this batch has padding before real tokens (left padding)")


def _refuse_left_padding(module: nn.Module, args: tuple, kwargs: dict) -> None:
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return  # a CUDA graph cannot wait for the device; finetune.graphed_step checks each batch on the host
    if kwargs.get("attention_mask") is not None:
        refuse_left_padding(kwargs["attention_mask"])


def use_attention(model: nn.Module, name: str = COURSE) -> None:
    """Make every attention layer of ``model`` (a transformers model, peft-wrapped or not) call the
    function ``name`` of ``ATTENTION``, and refuse left-padded batches."""
    from transformers import AttentionInterface

    if name not in ATTENTION:
        raise ValueError(f"attention must be one of {list(ATTENTION)}, got {name!r}")
    AttentionInterface.register(name, ATTENTION[name])
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(name)
    base.register_forward_pre_hook(_refuse_left_padding, with_kwargs=True)


class CourseRMSNorm(FusedRMSNorm):
    """The fused kernel's drop-in for ``LlamaRMSNorm``, computed by the kernel set's ``norm``."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return kernel_set.COURSE.norm(hidden_states, self.weight, self.variance_epsilon)


def use_course_rms_norm(model: nn.Module) -> int:
    """Replace every ``LlamaRMSNorm`` in ``model`` by the kernel set's norm (a module sharing its weight);
    returns how many were replaced."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, LlamaRMSNorm)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, CourseRMSNorm.from_llama(module))
    return len(targets)


_ROTARY_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("course_rotary", default=False)


def _install_rotary_dispatch() -> None:
    """Once per process: transformers' Llama module-global ``apply_rotary_pos_emb`` becomes a dispatcher
    that calls the course's kernel while a patched attention module runs (a flag of the running thread's
    context) and transformers' own function otherwise, so other models are untouched."""
    from transformers.models.llama import modeling_llama

    if getattr(modeling_llama.apply_rotary_pos_emb, "course_dispatch", False):
        return
    stock = modeling_llama.apply_rotary_pos_emb

    def dispatch(*args, **kwargs):
        return (course_rotary_pos_emb if _ROTARY_ON.get() else stock)(*args, **kwargs)

    dispatch.course_dispatch = True
    modeling_llama.apply_rotary_pos_emb = dispatch


def _with_course_rotary(forward):
    """``forward`` (a Llama attention module's) with the course's rotary kernel switched on for the call."""
    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        token = _ROTARY_ON.set(True)
        try:
            return forward(*args, **kwargs)
        finally:
            _ROTARY_ON.reset(token)
    return wrapped


def course_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb`` signature around the kernel set's ``rotary``."""
    if unsqueeze_dim != 1:
        raise ValueError(f"the course's rotary kernel takes q and k as (B, H, S, D) (unsqueeze_dim=1), "
                         f"got unsqueeze_dim={unsqueeze_dim}")
    return kernel_set.COURSE.rotary(q, k, cos, sin)


def use_course_rotary(model: nn.Module) -> int:
    """Make every ``LlamaAttention`` of ``model`` rotate q and k with the course's kernel (its current
    forward kept, wrapped); returns how many."""
    from transformers.models.llama.modeling_llama import LlamaAttention

    _install_rotary_dispatch()
    targets = [m for m in model.modules() if isinstance(m, LlamaAttention)]
    for module in targets:
        module.forward = _with_course_rotary(module.forward)
    return len(targets)


def _course_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(kernel_set.COURSE.swiglu(self.gate_proj(x), self.up_proj(x)))


def use_course_swiglu(model: nn.Module) -> int:
    """Make every ``LlamaMLP`` of ``model`` compute ``silu(gate) * up`` with the course's kernel (the
    projections unchanged); returns how many. Refuses, changing nothing, if any MLP's activation is not SiLU."""
    from transformers import activations
    from transformers.models.llama.modeling_llama import LlamaMLP

    silu = tuple(t for t in (nn.SiLU, getattr(activations, "SiLUActivation", None)) if t is not None)
    targets = [m for m in model.modules() if isinstance(m, LlamaMLP)]
    for module in targets:
        if not isinstance(module.act_fn, silu):
            raise ValueError("the course's SwiGLU kernel computes silu(gate) * up; this MLP's activation is "
                             f"{type(module.act_fn).__name__} ({module.config.hidden_act})")
    for module in targets:
        module.forward = types.MethodType(_course_mlp_forward, module)
    return len(targets)


def _course_nf4_forward(self, x: torch.Tensor) -> torch.Tensor:
    """``Linear4bit.forward``'s contract (x cast to the compute dtype, the result back to x's) through the
    course's one-launch dequantisation and one autograd function (the kernel set's ``nf4_linear``)."""
    dtype = self.compute_dtype or x.dtype
    bias = None if self.bias is None else self.bias.to(dtype)
    return kernel_set.COURSE.nf4_linear(x.to(dtype), self.course_nf4, bias).to(x.dtype)


def use_course_nf4(model: nn.Module) -> int:
    """Make every bitsandbytes ``Linear4bit`` (nf4) of ``model`` compute through
    the kernel set's ``nf4_linear`` (its weight checked once here); returns how many. Refuses,
    changing nothing, if any weight is not one the kernel reads."""
    import bitsandbytes as bnb

    from ..kernels.nf4_format import nf4_operands

    targets = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    operands = [nf4_operands(m.weight) for m in targets]
    for module, ops in zip(targets, operands):
        module.course_nf4 = ops
        module.forward = types.MethodType(_course_nf4_forward, module)
    return len(targets)


def use_course_kernels(model: nn.Module, attention: bool = True, rms_norm: bool = True, rotary: bool = True,
                       swiglu: bool = True, nf4: bool = True) -> dict:
    """Each swap (each optional); what was changed."""
    done = {}
    if attention:
        use_attention(model, COURSE)
        done["attention"] = COURSE
    if rms_norm:
        done["rms_norm_modules"] = use_course_rms_norm(model)
    if rotary:
        done["rotary_modules"] = use_course_rotary(model)
    if swiglu:
        done["swiglu_modules"] = use_course_swiglu(model)
    if nf4:
        done["nf4_modules"] = use_course_nf4(model)
    return done
