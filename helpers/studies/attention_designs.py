"""Attention implementations side by side: FLOP counts, timings and peak memory.

FLOPs follow the FlashAttention papers' convention: forward 4·B·H·S_q·S_k·D (two matrix products),
halved when causal; backward 2.5 times the forward (five products, one of them the recomputation).
"""
from __future__ import annotations

import contextlib
import functools
import textwrap
from typing import Callable

import torch
import torch.nn.functional as F

from ..bench import peak_memory_bytes, time_fn
from ..card_fit import CardLimits
from ..device import HAS_CUDA
from ..kernels.flash_attention import attention_reference, flash_attention

IMPLS = ("triton", "naive", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
SM80_IMPLS = ("sdpa_flash", "sdpa_cudnn")  # SDPA's FlashAttention-2 and cuDNN backends need sm_80 or newer
SLOW_CARD_MAX_S = 8192  # without Triton tensor cores (sm_75) a forward + backward at S = 16,384 takes seconds a call
Point = tuple[str, str, int, int, int, int, bool]  # impl, pass, B, H, S, D, causal


def attention_flops(B: int, H: int, S_q: int, S_k: int, D: int, causal: bool, pass_: str = "fwd") -> float:
    """FLOPs of one attention call by the FlashAttention papers' convention."""
    if pass_ not in ("fwd", "bwd", "fwd+bwd"):
        raise ValueError(f"pass_ must be 'fwd', 'bwd' or 'fwd+bwd', got {pass_!r}")
    fwd = 4.0 * B * H * S_q * S_k * D * (0.5 if causal else 1.0)
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd+bwd": 3.5 * fwd}[pass_]


FORWARD_PRODUCTS = ("S = Q Kᵀ", "O = P V")
# The S_q x S_k x D matrix products of one attention backward, by design. Standard attention keeps P from the
# forward; FlashAttention-2 recomputes S once, in the kernel that makes dK and dV (dQ by atomic adds); this
# course's kernels (helpers/kernels/flash_attention.py) recompute what each needs: the dK/dV kernel S and dP, the
# dQ kernel S and dP again, so that each program owns its outputs (no atomics).
BACKWARD_PRODUCTS = {
    "standard": ("dV = Pᵀ dO", "dP = dO Vᵀ", "dQ = dS K", "dK = dSᵀ Q"),
    "FlashAttention-2": ("S = Q Kᵀ (recomputed)", "dV = Pᵀ dO", "dP = dO Vᵀ", "dQ = dS K", "dK = dSᵀ Q"),
    "this course's kernels": ("dK/dV kernel: S = Q Kᵀ (recomputed)", "dK/dV kernel: dV = Pᵀ dO",
                              "dK/dV kernel: dP = dO Vᵀ", "dK/dV kernel: dK = dSᵀ Q",
                              "dQ kernel: S = Q Kᵀ (recomputed)", "dQ kernel: dP = dO Vᵀ (recomputed)",
                              "dQ kernel: dQ = dS K"),
}


def design_matmul_flops(design: str, B: int, H: int, S_q: int, S_k: int, D: int, pass_: str = "bwd") -> float:
    """Matrix-product FLOPs of one attention pass in one backward ``design`` (a key of
    :data:`BACKWARD_PRODUCTS`), every product dense (2·S_q·S_k·D a head: no tiles skipped under a causal mask)."""
    if design not in BACKWARD_PRODUCTS:
        raise ValueError(f"unknown backward design {design!r}; known: {list(BACKWARD_PRODUCTS)}")
    if pass_ not in ("bwd", "fwd+bwd"):
        raise ValueError(f"pass_ must be 'bwd' or 'fwd+bwd', got {pass_!r}")
    products = len(BACKWARD_PRODUCTS[design]) + (len(FORWARD_PRODUCTS) if pass_ == "fwd+bwd" else 0)
    return products * 2.0 * B * H * S_q * S_k * D


def backward_designs() -> list[dict]:
    """One row per backward design: its products, and its matrix-product FLOPs over standard attention's, for
    the backward alone and for forward + backward."""
    def ratio(design: str, pass_: str) -> float:
        return design_matmul_flops(design, 1, 1, 1, 1, 1, pass_) / design_matmul_flops("standard", 1, 1, 1, 1, 1,
                                                                                        pass_)
    return [{"design": d, "backward products": len(p), "bwd FLOPs / standard's": ratio(d, "bwd"),
             "fwd+bwd FLOPs / standard's": ratio(d, "fwd+bwd"), "products": "; ".join(p)}
            for d, p in BACKWARD_PRODUCTS.items()]


def timing_dtype(card: CardLimits | None) -> torch.dtype:
    """The 16-bit dtype to time in: bf16 where the card computes it natively (sm_80 and up), fp16 where it
    emulates bf16 (a T4) and without a GPU (the CPU interpreter gets bf16 arithmetic wrong)."""
    return torch.bfloat16 if card is not None and card.native_bf16 else torch.float16


def card_notes(card: CardLimits | None) -> list[str]:
    """What this card changes in notebook 05's plan, one note each, wrapped to 116 characters a line (nothing on
    sm_80 and up, or on a CPU)."""
    if card is None or card.triton_tensor_cores:
        return []
    slow = (f"{card.slow_triton_reason()}: these kernels run slower than on an sm_80 or newer card, so timings use "
            f"fp16 and sequences stop at S = {SLOW_CARD_MAX_S:,}")
    return [textwrap.fill(slow, 116, subsequent_indent="  "),
            f"{card.name}: {' and '.join(SM80_IMPLS)} left out (SDPA has those backends from sm_80 on)"]


def attention_bytes(impl: str, B: int, H: int, S: int, D: int, dtype_bytes: int, pass_: str) -> float:
    """Device bytes one measurement needs: the inputs (q, k, v, dO) and the peak above them. Standard attention
    ("naive") holds S x S matrices: two in the forward (the scores, the probabilities), four with the backward
    (and S x S bools for a causal mask); every other implementation holds its output, the gradients, one fp32 per
    row and its own buffers (SDPA's flash backward about five inputs' worth), nothing of size S x S. An upper
    bound of what ``peak_memory_bytes`` measured on the H200 (results/h200/flash_attention.json; a test holds it
    there)."""
    if pass_ not in ("fwd", "fwd+bwd"):
        raise ValueError(f"pass_ must be 'fwd' or 'fwd+bwd', got {pass_!r}")
    io = B * H * S * D * dtype_bytes  # one of q, k, v, dO, O
    if impl == "naive":
        squares = (2 if pass_ == "fwd" else 4) * B * H * S * S * dtype_bytes + 2 * S * S
        extra = squares + (1 if pass_ == "fwd" else 4) * io
    else:
        extra = (2 if pass_ == "fwd" else 6) * io + B * H * S * 4
    return 4 * io + extra


def plan_points(card: CardLimits | None, points: list[Point], dtype: torch.dtype) -> tuple[list[Point], list[str]]:
    """The points (impl, pass, B, H, S, D, causal) this card measures, and one line for each (impl, B, S) it
    skips because its memory (:func:`attention_bytes`) is more than the card holds. Points that
    :func:`card_notes` leaves out (on sm_75: S over ``SLOW_CARD_MAX_S``, the sm_80 backends) go without a line
    of their own. Without a GPU (card None) every point runs: the CPU has no memory plan to keep."""
    if card is None:
        return list(points), []
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    keep, too_big = [], {}
    for point in points:
        impl, pass_, B, H, S, D, _ = point
        if not card.triton_tensor_cores and (S > SLOW_CARD_MAX_S or impl in SM80_IMPLS):
            continue
        need = attention_bytes(impl, B, H, S, D, dtype_bytes, pass_)
        if card.fits(need):
            keep.append(point)
        else:
            key = (impl, B, S)
            too_big[key] = max(too_big.get(key, 0.0), need)
    lines = [card.skip_line(f"{impl} attention at B = {B}, S = {S:,}", need) for (impl, B, S), need in too_big.items()]
    return keep, lines


def _sdpa(backend_name: str) -> Callable:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[backend_name]

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])

    return run


def implementation(name: str) -> Callable:
    """``f(q, k, v, causal) -> out`` for one of :data:`IMPLS`."""
    if name == "triton":
        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)
    if name == "naive":
        return lambda q, k, v, causal: attention_reference(q, k, v, causal=causal)
    if name in IMPLS:
        return _sdpa(name)
    raise ValueError(f"unknown attention implementation {name!r}; known: {IMPLS}")


def make_inputs(B: int, H: int, S: int, D: int, dtype: torch.dtype, H_kv: int | None = None,
                device: str | None = None, requires_grad: bool = True) -> tuple[torch.Tensor, ...]:
    """Random q, k, v (B, H[_kv], S, D) and an output gradient dO."""
    device = device or ("cuda" if HAS_CUDA else "cpu")
    if torch.device(device).type == "cuda":
        index = torch.device(device).index
        _bind_context_in_autograd_thread(torch.cuda.current_device() if index is None else index)
    H_kv = H_kv or H
    q = torch.randn(B, H, S, D, device=device, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(B, H_kv, S, D, device=device, dtype=dtype, requires_grad=requires_grad)
    v = torch.randn(B, H_kv, S, D, device=device, dtype=dtype, requires_grad=requires_grad)
    do = torch.randn(B, H, S, D, device=device, dtype=dtype)
    return q, k, v, do


@functools.cache
def _bind_context_in_autograd_thread(device_index: int) -> None:
    """Make the CUDA context current in autograd's worker thread for GPU ``device_index``, once.

    Autograd runs the backward of CUDA tensors in a thread of its own. When the first CUDA call in that thread
    is cuBLAS's (standard attention's backward starts with matrix products), cuBLAS finds no current context,
    sets the primary one itself and warns "Attempting to run cuBLAS, but there was no current CUDA context!".
    One element-wise backward first (its multiply is a kernel launched from that thread) binds the context
    there, as any CUDA runtime call does, so cuBLAS finds it."""
    x = torch.ones(1, device=f"cuda:{device_index}", requires_grad=True)
    (x * 2).sum().backward()


def _step(fn: Callable, q, k, v, do, causal: bool, pass_: str) -> Callable[[], object]:
    if pass_ == "fwd":
        def run():
            with torch.no_grad():
                return fn(q, k, v, causal)
    else:
        def run():
            q.grad = k.grad = v.grad = None
            fn(q, k, v, causal).backward(do)
    return run


def measure(impl: str, B: int, H: int, S: int, D: int, causal: bool, dtype: torch.dtype, pass_: str,
            H_kv: int | None = None, **time_kwargs) -> dict:
    """One results record: time (the median, and ms_p20 / ms_p80, its 20th and 80th percentiles), TFLOP/s and
    peak extra memory of one implementation on one shape.

    An implementation that runs out of memory or has no kernel for the shape is a result too: its
    record has ``status`` "oom" or "unsupported" and no time.
    """
    if pass_ not in ("fwd", "fwd+bwd"):
        raise ValueError(f"pass_ must be 'fwd' or 'fwd+bwd' (a timed step always runs the forward), got {pass_!r}")
    fn = implementation(impl)
    q, k, v, do = make_inputs(B, H, S, D, dtype, H_kv)
    record = {"impl": impl, "pass": pass_, "B": B, "H": H, "H_kv": H_kv or H, "S": S, "D": D, "causal": causal,
              "dtype": str(dtype).removeprefix("torch."), "status": "ok", "ms": None, "tflops": None,
              "peak_mem_bytes": None, "ms_p20": None, "ms_p80": None}
    run = _step(fn, q, k, v, do, causal, pass_)
    try:
        with (torch.cuda.device(q.device) if HAS_CUDA else contextlib.nullcontext()):
            record["peak_mem_bytes"] = peak_memory_bytes(run, warmup=True)  # warm-up: autotuning stays out
            timing = time_fn(run, **time_kwargs)
    except torch.cuda.OutOfMemoryError:
        record["status"] = "oom"
    except RuntimeError as error:  # SDPA: "No available kernel" for a forced backend
        if "No available kernel" not in str(error) and "not supported" not in str(error).lower():
            raise
        record["status"] = "unsupported"
    else:
        record["ms"], record["ms_p20"], record["ms_p80"] = timing.ms, timing.ms_p20, timing.ms_p80
        record["tflops"] = timing.tflops(attention_flops(B, H, S, S, D, causal, pass_))
    finally:
        del q, k, v, do, run
        if HAS_CUDA:
            torch.cuda.empty_cache()
    return record
