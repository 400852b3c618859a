"""FlashAttention's forward with Hopper's tile loads: the candidate next rung after ``flash_attention``.

The same algorithm as :mod:`helpers.kernels.flash_attention`'s forward (online softmax in base 2, the unmasked
loop then the masked tail, the row log-sum-exp saved for the backward), with two Hopper features Triton reaches:

- every tile of Q, K and V is loaded through a *tensor descriptor* made on the device
  (``tl.make_tensor_descriptor``), which Triton lowers to TMA copies on Hopper: one instruction a tile, no
  address arithmetic in the threads, rows past the end of a head filled with zeros;
- ``WARP_SPECIALIZE`` asks Triton to split the unmasked loop's warps into producers (the loads) and consumers
  (the products and the softmax), so that the next tiles load while the current ones are multiplied. Triton 3.6
  does so for Hopper only in a kernel with one loop and 4 warps: the wrapper asks for it only where there is no
  masked tail (not causal, S_k a multiple of the key tile); with 8 warps Triton leaves the loop as it is.
  On an H100 a warp-specialised launch did not return (the probe runs such configs in a child process with a
  time limit, and records whether they finish).

Forward only, no autograd: ``scripts/flash_attention_hopper_probe.py`` times it beside the course's forward and
cuDNN's (appendix 05a explains the gap it targets). Inputs as ``flash_attention``'s, made contiguous.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..flash_attention import LOG2E, _check_inputs


@dataclass(frozen=True)
class HopperConfig:
    """One launch: queries and keys a tile, warps a program, pipeline depth of the unmasked loop, and whether
    that loop is warp-specialised."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    stages: int = 3
    warp_specialize: bool = False


@triton.jit
def _softmax_step(s, m_i, l_i, acc):
    """Fold one tile of base-2 scores into the running max, sum and (rescaled) accumulator; returns p too."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None]


@triton.jit
def _hopper_fwd_kernel(Q, K, V, O, LSE, H, GROUP, SQ, SK, qk_scale,
                       CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       STAGES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, MASKED_TAIL: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    heads = tl.num_programs(1)  # B * H
    bh_kv = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    # (B*H, S, D) views: a tile never crosses into the next head, and rows past S load as zeros
    q_desc = tl.make_tensor_descriptor(Q, shape=[heads, SQ, HEAD_DIM], strides=[SQ * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K, shape=[heads // GROUP, SK, HEAD_DIM], strides=[SK * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V, shape=[heads // GROUP, SK, HEAD_DIM], strides=[SK * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_N, HEAD_DIM])
    q = q_desc.load([bh, start_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:  # bottom-right aligned, as flash_attention: query i sees keys j <= i + SK - SQ
        hi = tl.minimum(SK, (start_m + 1) * BLOCK_M + SK - SQ)
        full = tl.minimum(SK, start_m * BLOCK_M + SK - SQ + 1)
    else:
        hi = SK
        full = SK
    full = (full // BLOCK_N) * BLOCK_N
    for start_n in tl.range(0, full, BLOCK_N, num_stages=STAGES, warp_specialize=WARP_SPECIALIZE):
        k = k_desc.load([bh_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        p, m_i, l_i, acc = _softmax_step(tl.dot(q, k.T) * qk_scale, m_i, l_i, acc)
        v = v_desc.load([bh_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc)
    if MASKED_TAIL:  # the ragged end of K and the causal diagonal, left out when there are none (Triton 3.6
        # warp-specialises a kernel with one loop only)
        for start_n in range(full, hi, BLOCK_N):
            k = k_desc.load([bh_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
            cols = start_n + offs_n
            keep = cols[None, :] < SK
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + (SK - SQ))
            s = tl.where(keep, tl.dot(q, k.T) * qk_scale, float("-inf"))
            p, m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc)
            v = v_desc.load([bh_kv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
            acc = tl.dot(p.to(v.dtype), v, acc)
    acc = acc / l_i[:, None]
    rows = bh.to(tl.int64) * SQ + offs_m  # O is stored through pointers: Triton 3.6 does not warp-specialise a
    # kernel that stores a reshaped tile through a descriptor
    tl.store(LSE + rows, m_i + tl.math.log2(l_i), mask=offs_m < SQ)
    tl.store(O + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], acc.to(O.dtype.element_ty),
             mask=(offs_m < SQ)[:, None])


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory for the descriptors the kernel makes on the device (Triton asks for it at launch)."""
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous and 16-byte aligned, as a tile copy engine's base address must be (copied if not)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def flash_attention_forward_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                                   scale: float | None = None, config: HopperConfig = HopperConfig()
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)``: the attention output, as ``flash_attention``'s, and each row's base-2 log-sum-exp (fp32,
    (B, H, S_q)). Same inputs and checks as ``flash_attention``; on a GPU, Hopper or newer (tensor descriptors).
    ``config.warp_specialize`` applies where the kernel has no masked tail (see the module's docstring)."""
    _check_inputs(q, k, v, causal)
    if q.device.type == "cuda" and torch.cuda.get_device_capability(q.device)[0] < 9:
        raise RuntimeError(f"the Hopper forward needs compute capability 9.0 or newer (TMA); "
                           f"{torch.cuda.get_device_name(q.device)} has "
                           f"{'.'.join(map(str, torch.cuda.get_device_capability(q.device)))}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v = (_tma_ready(t) for t in (q, k, v))
    b, h, sq, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((b, h, sq), device=q.device, dtype=torch.float32)
    if o.numel():
        triton.set_allocator(_scratch)
        grid = (triton.cdiv(sq, config.block_m), b * h)
        _hopper_fwd_kernel[grid](q, k, v, o, lse, h, h // k.shape[1], sq, k.shape[2], scale * LOG2E,
                                 **launch_constants(config, bool(causal), k.shape[2], d))
    return o, lse


def launch_constants(config: HopperConfig, causal: bool, sk: int, head_dim: int) -> dict:
    """The kernel's compile-time arguments for ``config``: warp specialisation only without a masked tail (a
    causal diagonal, or keys past the last whole tile), which Triton 3.6 cannot specialise."""
    tail = causal or sk % config.block_n != 0
    return dict(CAUSAL=causal, HEAD_DIM=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                STAGES=config.stages, WARP_SPECIALIZE=config.warp_specialize and not tail, MASKED_TAIL=tail,
                num_warps=config.num_warps)
