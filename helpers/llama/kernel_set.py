"""Which course kernel computes which part of a Llama: one definition, read by every path into the model.

    COURSE.norm                      # the fused RMSNorm, in the decoders and in training
    Decoder(model, 640, graph=True, **COURSE.decoder_hooks())
    PagedDecoder(model, 256, **COURSE.paged_hooks(max_rows=16))
    patching.use_course_kernels(model)  # training: reads COURSE when the model runs

``STOCK`` holds PyTorch's and bitsandbytes' own computation of the same parts (what a model does without the
course). The decoding ladder of notebook 07 climbs from ``STOCK`` to ``COURSE`` one part at a time; the paged
decoder of notebook 09 takes ``COURSE``; the training patch of notebooks 07 and 08 calls ``COURSE``'s
training kernels. A new fused kernel is wired in here, and every path picks it up.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from ..kernels.decode_attention import decode_attention
from ..kernels.flash_attention import flash_attention
from ..kernels.nf4_dequant import dequant_linear
from ..kernels.nf4_format import nf4_operands
from ..kernels.nf4_gemv import MAX_M, nf4_linear, nf4_linear_group
from ..kernels.paged_decode_attention import paged_decode_attention, paged_reference
from ..kernels.rms_norm import add_rms_norm, rms_norm
from ..kernels.rope_cache import rope_cache
from ..kernels.rotary import rotary
from ..kernels.swiglu import swiglu
from .decoding import (AddNorm, Attention, Linear, LinearGroup, Norm, Rope, SwigluLinear, module_linear,
                       torch_rms_norm, torch_rope_cache)

# (q (B, H, 1, D), k_pages, v_pages (num_pages, H_kv, page_tokens, D), block_table (B, W), lengths (B,)) -> (B, H, 1, D)
PagedAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def nf4_swiglu_linear(gate: torch.Tensor, up: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``down_proj(silu(gate) * up)`` with the product made as the nf4 kernel reads its input."""
    return nf4_linear(up, module, gate=gate)


def dequant_nf4_linear(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """x through a quantised ``Linear4bit``: its weight dequantised once (``nf4_dequant``), then one matmul;
    the path for more rows than the nf4 matrix-vector kernels take, where the product is compute-bound."""
    return dequant_linear(x, nf4_operands(module.weight), module.bias)


def triton_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                           lengths: torch.Tensor) -> torch.Tensor:
    """The Triton paged kernel, its host-side block-table check skipped (the decoder's pool keeps it in range)."""
    return paged_decode_attention(q, k_pages, v_pages, block_table, lengths, check=False)


def torch_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                          lengths: torch.Tensor) -> torch.Tensor:
    """The same attention in PyTorch (float64, ``paged_reference``), in q's dtype: the path to check against."""
    return paged_reference(q, k_pages, v_pages, block_table, lengths).to(q.dtype)


@dataclasses.dataclass(frozen=True)
class KernelSet:
    """One function for each part of a Llama that a kernel can take over. ``None``: the part is computed from
    the others (``linear`` for each projection of a group; ``norm`` after a plain addition) or, in training,
    left as the model computes it."""

    # decoding: a few rows a step, no autograd
    linear: Linear  # x @ a projection's weight, (x, module)
    linear_group: LinearGroup | None  # the projections that share x (q, k, v; gate, up) in one launch
    swiglu_linear: SwigluLinear | None  # down_proj(silu(gate) * up), the product made where it is read
    norm: Norm  # RMSNorm (x, weight, eps); differentiable, so training's norm too
    add_norm: AddNorm | None  # the residual addition and the RMSNorm after it, in one pass
    rope: Rope  # the batch-1 decoder's rotary embedding and cache write
    attention: Attention | None  # the batch-1 decoder's attention over the live cache (None: SDPA, masked)
    paged_attention: PagedAttention  # the paged decoder's attention
    wide_linear: Linear  # a projection of more rows than ``linear`` takes
    # training: autograd through every kernel
    flash_attention: Callable | None  # (q, k, v, causal=, scale=) -> o, (B, H, S, D)
    rotary: Callable | None  # (q, k, cos, sin) -> rotated q, k
    swiglu: Callable | None  # (gate, up) -> silu(gate) * up
    nf4_linear: Callable | None  # (x, NF4Operands, bias) -> x @ W^T + bias, the weight dequantised once

    def decoder_hooks(self) -> dict[str, Callable | None]:
        """The keyword arguments of :class:`~helpers.llama.decoding.Decoder` (its kernels)."""
        return {"linear": self.linear, "linear_group": self.linear_group, "swiglu_linear": self.swiglu_linear,
                "norm": self.norm, "add_norm": self.add_norm, "rope": self.rope, "attention": self.attention}

    def paged_hooks(self, max_rows: int | None = None) -> dict[str, Callable | int | None]:
        """The keyword arguments of :class:`~helpers.llama.paged_decoding.PagedDecoder`; ``linear`` takes up to
        ``max_rows`` rows (at most ``nf4_gemv.MAX_M``; None: every row), ``wide_linear`` the rest."""
        if max_rows is not None and not 1 <= max_rows <= MAX_M:
            raise ValueError(f"max_rows must be 1 ... {MAX_M} (the nf4 kernels' rows), got {max_rows}")
        return {"linear": self.linear, "linear_group": self.linear_group, "swiglu_linear": self.swiglu_linear,
                "norm": self.norm, "add_norm": self.add_norm, "attention": self.paged_attention,
                "max_rows": max_rows, "wide_linear": self.wide_linear}


STOCK = KernelSet(linear=module_linear, linear_group=None, swiglu_linear=None, norm=torch_rms_norm, add_norm=None,
                  rope=torch_rope_cache, attention=None, paged_attention=torch_paged_attention,
                  wide_linear=module_linear, flash_attention=None, rotary=None, swiglu=None, nf4_linear=None)

COURSE = KernelSet(linear=nf4_linear, linear_group=nf4_linear_group, swiglu_linear=nf4_swiglu_linear, norm=rms_norm,
                   add_norm=add_rms_norm, rope=rope_cache, attention=decode_attention,
                   paged_attention=triton_paged_attention, wide_linear=dequant_nf4_linear,
                   flash_attention=flash_attention, rotary=rotary, swiglu=swiglu, nf4_linear=dequant_linear)
