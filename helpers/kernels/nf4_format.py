"""bitsandbytes' nf4 storage format, as the course's nf4 kernels read it (``nf4_gemv``, ``nf4_dequant``).

Storage (bitsandbytes' ``quantize_4bit``, checked against ``dequantize_4bit``):

* ``W`` of shape (N, K) is flattened row-major and cut into blocks of ``blocksize`` (64) elements;
  element ``i`` of the flat array is ``code[q_i] * absmax[i // blocksize]`` (fp32 product).
* Two 4-bit indices share a byte: the HIGH nibble is element ``2j``, the LOW nibble element ``2j + 1``.
  The bytes may sit in a tensor of another dtype (``quant_storage=torch.bfloat16``); they are read as uint8.
* ``quant_state.code``: the 16 nf4 values (fp32, sorted, from -1 to 1).
* ``absmax``: one fp32 per block, or, with ``compress_statistics=True`` ("nested"), one uint8 index per
  block into ``state2.code`` (bitsandbytes' 256-entry dynamic map), scaled by an fp32 ``state2.absmax``
  per ``state2.blocksize`` (256) blocks, plus one fp32 ``offset``:
  ``absmax[b] = state2.code[qabsmax[b]] * state2.absmax[b // 256] + offset``.

Bytes per weight: 0.5 for the codes, plus the scales. Nested scales decoded inside a kernel cost one uint8
per 64 weights plus 4 bytes per 16384 weights: 0.5 + 1/64 + 4/16384 = 0.516 byte per weight. Flattening
them first into one fp32 per block would cost 4/64 byte, 0.5625 byte per weight (9% more traffic, and a
second copy of the scales to keep). A non-nested weight has fp32 scales and is read as it is (0.5625 byte
per weight).

:func:`nf4_operands` checks a weight once and returns :class:`NF4Operands`, views of bitsandbytes' tensors
that the kernels take.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class NF4Operands(NamedTuple):
    """What the kernels read for one weight: views of bitsandbytes' tensors (no copies). ``absmax``
    is one fp32 per block, or, for nested statistics, one uint8 per block (then ``nested_absmax``,
    ``nested_code`` and ``offset`` are set, else None)."""

    packed: torch.Tensor           # uint8, N * K / 2 bytes, row-major, high nibble first
    absmax: torch.Tensor
    nested_absmax: torch.Tensor | None  # fp32, one per ``nested_blocksize`` blocks
    nested_code: torch.Tensor | None    # fp32, 256 entries
    offset: torch.Tensor | None         # fp32, one element
    code: torch.Tensor             # fp32, the 16 nf4 values
    n: int
    k: int
    blocksize: int
    nested_blocksize: int


def _weight_parts(weight) -> tuple[torch.Tensor, object]:
    """(packed storage, quant state) from a ``Params4bit`` or a ``(packed, quant_state)`` pair."""
    if isinstance(weight, tuple) and len(weight) == 2:
        packed, state = weight
    else:
        packed, state = weight, getattr(weight, "quant_state", None)
    if not isinstance(packed, torch.Tensor) or state is None or not hasattr(state, "absmax"):
        raise TypeError("weight must be a bitsandbytes Params4bit (with a quant_state) or a (packed, quant_state) "
                        f"pair, got {type(weight).__name__}")
    return packed.data, state


def nf4_operands(weight) -> NF4Operands:
    """Check a bitsandbytes nf4 weight (``Params4bit`` or ``(packed, quant_state)``) and return the
    tensors the kernels read. Raises ValueError/TypeError naming what the kernel cannot take.
    :func:`nf4_gemv.nf4_matmul` accepts the result: prepare each weight once (the checks cost host time)."""
    packed, qs = _weight_parts(weight)
    if qs.quant_type != "nf4":
        raise ValueError(f"only nf4 weights are supported, got quant_type={qs.quant_type!r}")
    if getattr(qs, "packing_format_for_cpu", False):
        raise ValueError("the weight was repacked for bitsandbytes' CPU kernel (Linear4bit.forward in eval mode "
                         "on a CPU with AVX512-BF16); this kernel reads bitsandbytes' standard layout")
    if qs.shape is None or len(qs.shape) != 2:
        raise ValueError(f"the weight must be 2-D (N, K), got shape {qs.shape}")
    n, k = qs.shape
    bs = qs.blocksize
    if k % 2:
        raise ValueError(f"K = {k} is odd: two 4-bit codes share a byte along K, so K must be even")
    if bs < 32 or bs & (bs - 1) or k % bs:
        raise ValueError(f"blocksize = {bs} must be a power of two >= 32 that divides K = {k}")
    if not packed.is_contiguous():
        raise ValueError("the packed weight must be contiguous")
    packed = packed.view(torch.uint8).reshape(-1)
    if packed.numel() != n * k // 2:
        raise ValueError(f"the packed weight has {packed.numel()} bytes, expected N * K / 2 = {n * k // 2}")
    if packed.data_ptr() % 4:
        raise ValueError("the packed weight must start at a 4-byte boundary (the kernel reads 32-bit words)")
    code = qs.code
    if code.numel() != 16 or not code.is_floating_point():
        raise ValueError(f"quant_state.code must hold the 16 nf4 values, got {tuple(code.shape)} {code.dtype}")
    groups = n * k // bs
    if groups >= 2**31:
        raise ValueError(f"N * K / blocksize = {groups} blocks: the kernel indexes blocks with 32-bit integers")
    absmax = qs.absmax.reshape(-1)
    if absmax.numel() != groups:
        raise ValueError(f"quant_state.absmax has {absmax.numel()} entries, expected N * K / blocksize = {groups}")
    parts = [packed, absmax, code]
    if qs.nested:
        s2 = qs.state2
        if absmax.dtype != torch.uint8 or s2.code.numel() != 256 or s2.absmax.dtype != torch.float32:
            raise ValueError("a nested quant_state must hold uint8 absmax codes, a 256-entry state2.code and fp32 "
                             f"state2.absmax; got {absmax.dtype}, {s2.code.numel()} entries, {s2.absmax.dtype}")
        offset = torch.as_tensor(qs.offset, dtype=torch.float32, device=absmax.device).reshape(1)
        nested = (s2.absmax.reshape(-1), s2.code.to(torch.float32), offset)
        nested_bs = s2.blocksize
        parts += list(nested)
    else:
        if not absmax.is_floating_point():
            raise ValueError(f"quant_state.absmax must be floating point, got {absmax.dtype}")
        nested, nested_bs = (None, None, None), 1
    devices = {t.device for t in parts}
    if len(devices) > 1:
        raise ValueError(f"the weight's tensors are on several devices: {sorted(map(str, devices))}")
    return NF4Operands(packed, absmax, *nested, code.to(torch.float32).contiguous(), n, k, bs, nested_bs)
