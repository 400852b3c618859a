"""Whether a kernel's launch fits a card's shared memory, known before the launch.

A block may use at most a card's opt-in shared memory (``CardLimits.smem_per_block_bytes``: 64 KB on a T4,
99 KB on sm_86/sm_89, 163 KB on an A100, 227 KB on an H100). Triton decides how much a kernel needs when it
compiles it, and a launch over the limit fails deep inside Triton ("out of resource: shared memory").
Here the need is read from Triton's own compiler, for any target and without a GPU: ``shared_bytes``
compiles a launch ahead of time up to the step that fixes its shared memory (the allocation, before LLVM
and ptxas, the slow steps), and ``fitting`` keeps the configs that fit a limit or raises
``DoesNotFit`` naming the kernel, the card and the limit.

Compiling needs the kernel as Triton's compiler sees it: in a process where ``TRITON_INTERPRET`` was 0
when the kernels were defined (on a CPU: set it to 0 before importing ``helpers``).
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ..card_fit import CARDS, this_card

C = TypeVar("C")

# The opt-in shared memory a block may use, per Triton target, from the stand-in cards.
LIMITS: dict[str, int] = {card.arch: card.smem_per_block_bytes for card in CARDS.values()}
TARGETS: tuple[str, ...] = tuple(sorted(LIMITS))  # sm_75 ... sm_90: the targets the course supports

_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
          torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
          torch.bool: "i1"}


class DoesNotFit(ValueError):
    """No launch configuration of a kernel fits this card's shared memory."""


def jit_function(kernel) -> triton.runtime.jit.JITFunction:
    """The ``JITFunction`` under an autotuned or heuristics-wrapped kernel; TypeError for an interpreted one."""
    fn = kernel
    while not isinstance(fn, triton.runtime.jit.JITFunction) and hasattr(fn, "fn"):
        fn = fn.fn
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise TypeError(f"{kernel!r} is not compiled by Triton here (TRITON_INTERPRET=1 when it was defined?); "
                        "set TRITON_INTERPRET=0 before importing helpers to compile ahead of time")
    return fn


def _stand_in(value, constexpr: bool):
    """What of a launch argument decides the compiled kernel, as Triton's launcher specialises it: a
    tensor's dtype (a pointer), an int's range and whether it is 1 (then a constant) or divisible by 16."""
    if constexpr or isinstance(value, bool):
        return value
    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[value.dtype]
    if isinstance(value, int):
        wide = not -2**31 <= value < 2**31
        return 1 if value == 1 else ("i64" if wide else "i32", value % 16 == 0)
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot stand {value!r} for a kernel argument")


def _signature(fn, args: tuple) -> tuple[dict, dict, dict]:
    """ASTSource's signature, constants and attributes from ``_stand_in`` values, one per parameter."""
    signature, constants, attrs = {}, {}, {}
    for i, (p, value) in enumerate(zip(fn.params, args)):
        if p.is_constexpr or value == 1 and not isinstance(value, bool):
            signature[p.name], constants[p.name] = "constexpr", value
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, tuple):
            signature[p.name] = value[0]
            if value[1]:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[p.name] = value
            if value.startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]  # torch's allocations are 256-byte aligned
    return signature, constants, attrs


class _Allocated(Exception):
    """Raised inside the compiler once the shared memory is known, to skip LLVM and ptxas."""


@contextlib.contextmanager
def _stop_after_allocation():
    """Make the NVIDIA backend raise ``_Allocated(bytes)`` where it hands its module to LLVM (the shared
    memory is allocated by then). Where that does not apply (another Triton), compiling runs to the end."""
    try:
        from triton.backends.nvidia import compiler as nvidia
        real = nvidia.llvm
    except (ImportError, AttributeError):
        yield
        return

    class _Llvm:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def to_module(module, context):
            shared = module.get_int_attr("ttg.shared")
            if shared is None:  # a Triton that names it otherwise: compile on, to the metadata
                return real.to_module(module, context)
            raise _Allocated(shared)

    nvidia.llvm = _Llvm()
    try:
        yield
    finally:
        nvidia.llvm = real


def shared_bytes(kernel, args: dict, num_warps: int = 4, num_stages: int = 3, arch: str = "sm_90",
                 full: bool = False) -> int:
    """The shared memory one block of ``kernel`` needs on ``arch`` ("sm_75" ...), launched with ``args``
    (every parameter by name, constexprs included; tensors may be on the meta device), ``num_warps`` and
    ``num_stages``; compiled ahead of time, no GPU needed. ``full``: run every step to the binary (ptxas
    too) rather than stop once the memory is allocated."""
    fn = jit_function(kernel)
    missing = [p.name for p in fn.params if p.name not in args]
    if missing:
        raise ValueError(f"{fn.__name__}: no value for {missing}")
    stand_ins = tuple(_stand_in(args[p.name], p.is_constexpr) for p in fn.params)
    return _shared_bytes(fn, stand_ins, num_warps, num_stages, arch, full)


@functools.lru_cache(maxsize=None)
def _shared_bytes(fn, args: tuple, num_warps: int, num_stages: int, arch: str, full: bool) -> int:
    signature, constants, attrs = _signature(fn, args)
    target = GPUTarget("cuda", int(arch.removeprefix("sm_")), 32)
    source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    with contextlib.nullcontext() if full else _stop_after_allocation():
        try:
            return int(triton.compile(source, target=target, options=options).metadata.shared)
        except _Allocated as allocated:
            return int(allocated.args[0])


def fitting(kernel: str, configs: Sequence[C], need: Callable[[C], int], limit: int, card: str,
            fallbacks: Sequence[C] = ()) -> list[C]:
    """The configs whose ``need`` (bytes of shared memory) is at most ``limit``, in order; where none is, the
    ``fallbacks`` that are (smaller configs, kept for the cards with less shared memory); ``DoesNotFit``
    naming ``kernel``, ``card`` and the limit if none of either is."""
    needs = {}
    for group in (configs, fallbacks):
        needs.update((id(config), need(config)) for config in group)
        kept = [config for config in group if needs[id(config)] <= limit]
        if kept:
            return kept
    raise DoesNotFit(f"{kernel}: none of its {len(needs)} launch configs fits {card}'s {limit / 1024:g} KB of "
                     f"shared memory a block (the smallest needs {min(needs.values()) / 1024:g} KB)")


def this_arch() -> tuple[str, int, str]:
    """This GPU's Triton target, its shared memory a block and its name."""
    card = this_card()
    if card is None:
        raise RuntimeError("no GPU here: name a target (fit.LIMITS) instead")
    return card.arch, card.smem_per_block_bytes, card.name


def prune_to_fit(autotuned, kernel: str, fallbacks: Sequence = ()) -> None:
    """Make ``autotuned`` (a ``triton.autotune`` kernel) try only its configs that fit this GPU's shared
    memory, else the ``fallbacks`` that do (``fitting``; each config compiled for this GPU by
    ``shared_bytes``), and raise ``DoesNotFit`` before any launch where none does. A no-op in the interpreter."""
    if not isinstance(getattr(autotuned, "fn", None), triton.runtime.jit.JITFunction):
        return

    def prune(configs, named_args, **kwargs):
        arch, limit, name = this_arch()
        args = {**named_args, **kwargs}
        return fitting(kernel, configs, lambda c: shared_bytes(
            autotuned, {**args, **c.kwargs}, c.num_warps, c.num_stages, arch), limit, name, fallbacks)

    autotuned.early_config_prune = prune
