"""The matrix products a piece of PyTorch code runs, counted by data type as they are dispatched.

    with GemmCount() as count:
        step(batch)
    count.flops   # {"bf16": ..., "fp32": ...}: 2 x M x N x K summed over every mm, addmm, bmm, baddbmm

The step model (``step_model.matmul_flops``) counts the same FLOPs from the model's shapes and the data type each
product runs in; this measures them on the model itself, so the two can be checked against each other.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_PRODUCTS = {_aten.mm: (0, 1), _aten.bmm: (0, 1), _aten.addmm: (1, 2), _aten.baddbmm: (1, 2)}  # op -> its A, B
_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


class GemmCount(TorchDispatchMode):
    """Inside ``with``: every matrix product's FLOPs (``flops``) and shapes (``products``), keyed by the data type
    of its first operand ("bf16", "fp32", ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter[str] = Counter()
        self.products: Counter[tuple[str, tuple[int, ...], tuple[int, ...]]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        operands = _PRODUCTS.get(func.overloadpacket)
        if operands is not None:
            a, b = (args[i] for i in operands)
            dtype = _NAMES.get(a.dtype, str(a.dtype).removeprefix("torch."))
            self.flops[dtype] += 2 * a.numel() * b.shape[-1]
            self.products[dtype, tuple(a.shape), tuple(b.shape)] += 1
        return out
