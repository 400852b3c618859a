"""The course's kernel launches as the compiler sees them, for checking them against every target's shared
memory without a GPU (``fit.shared_bytes``; ``tests/test_cross_compile.py``, ``scripts/cross_compile_sweep.py``).

Each ``Launch`` is one kernel at one kind of call (dtype, head size, ...): its arguments (tensors on the
meta device stand for pointers), every config the code may launch it with, in the code's order, and
``picks``: those that decide whether it fits (the config the code picks on a card, and its smallest fallback).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import flash_attention as fa
from . import nf4_gemv
from .fit import LIMITS, TARGETS, jit_function, shared_bytes


@dataclass(frozen=True)
class Config:
    """One launch shape: the kernel's constexpr settings, warps and pipeline stages."""

    constants: dict
    num_warps: int = 4
    num_stages: int = 3

    def __str__(self) -> str:
        shape = " ".join(f"{k}={v}" for k, v in self.constants.items())
        return f"{shape} w{self.num_warps} s{self.num_stages}"


@dataclass(frozen=True)
class Launch:
    """A kernel at one kind of call: ``args`` (every parameter but the configs'), ``configs`` (every one the
    code may use), ``picks`` (indices into ``configs``: what decides fitting) and ``targets`` it must fit."""

    name: str
    kernel: object
    args: dict
    configs: tuple[Config, ...]
    picks: tuple[int, ...] = (0,)
    targets: tuple[str, ...] = TARGETS
    ci: bool = True  # among the launches the CI test compiles (the others: the sweep's)

    def arguments(self, config: Config) -> dict:
        return {**self.args, **config.constants}


def _t(dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device="meta")


def _from_triton(configs) -> tuple[Config, ...]:
    return tuple(Config(dict(c.kwargs), c.num_warps, c.num_stages) for c in configs)


def _args(kernel, values: dict, default) -> dict:
    """Every parameter of ``kernel``: from ``values`` by name, else ``default``."""
    return {p.name: values.get(p.name, default) for p in jit_function(kernel).params}


def _flash_attention(dtype: torch.dtype, d: int, causal: bool, ci: bool) -> list[Launch]:
    """FlashAttention's forward and backward at a Llama-like shape: every tuned config, then the fallbacks;
    the pick: the last, smallest fallback (a card uses the tuned configs that fit it, else the fallbacks that do)."""
    ints = dict(H=32, GROUP=4, HKV=8, SQ=4096, SK=4096, SQ_BUCKET=4096, SK_BUCKET=4096)
    strides = {f"stride_{t}{x}": s for t in "qkvodb" for x, s in zip("bhmnd", (2**20, 2**15, d, d, 1))}
    values = dict(**ints, **strides, qk_scale=0.1, sm_scale=0.1, CAUSAL=causal, HEAD_DIM=d,
                  LSE=_t(torch.float32), DELTA=_t(torch.float32))
    tag = f"{str(dtype).removeprefix('torch.')} D={d}{' causal' if causal else ''}"
    rows = []
    for kernel, tuned, fallbacks in ((fa._fwd_kernel, fa.FWD_CONFIGS, fa.FWD_FALLBACKS),
                                     (fa._bwd_dkdv_kernel, fa.BWD_CONFIGS, fa.BWD_FALLBACKS),
                                     (fa._bwd_dq_kernel, fa.BWD_CONFIGS, fa.BWD_FALLBACKS)):
        configs = _from_triton(tuned + fallbacks)
        rows.append(Launch(f"flash_attention.{jit_function(kernel).__name__} {tag}", kernel,
                           _args(kernel, values, _t(dtype)), configs, picks=(len(configs) - 1,), ci=ci))
    return rows


def _nf4(m: int, dtype: torch.dtype, arch: str, ci: bool) -> Launch:
    """The nf4 GEMV at M rows of ``dtype`` x against a nested-statistics weight of Llama-2-7B's MLP (N = 11008,
    K = 4096, blocksize 64) on ``arch``, as ``nf4_gemv`` launches it there (its table's config, cut to the
    target's shared memory; the PTX from sm_80 on)."""
    n, k, qb = 11008, 4096, 64
    cfg = nf4_gemv.config_for(m, n, k, qb, dtype, smem_per_block=LIMITS[arch])
    block_m = nf4_gemv._block_m(m, dtype)
    u8, f32, i32, x = _t(torch.uint8), _t(torch.float32), _t(torch.int32), _t(dtype)
    values = dict(W=i32, W_1=i32, W_2=i32, ABSMAX=u8, ABSMAX_1=u8, ABSMAX_2=u8, M=m, N=n, N_0=n, N_1=0, K=k,
                  stride_xm=k, chunks_per_split=k // cfg.block_k // cfg.split_k, QB=qb, NESTED_QB=256,
                  BLOCK_M=block_m, NESTED=True, HAS_BIAS=False, PARTIAL=cfg.split_k > 1, WEIGHTS=1,
                  ASM=arch >= "sm_80" and dtype != torch.float32, DOT_FP32=False,
                  PRECISION="ieee" if dtype == torch.float32 else "tf32", STAGES=cfg.num_stages,
                  PREFETCH=cfg.prefetch, SWIGLU=False, X=x, GATE=x, BIAS=x, OUT=f32 if cfg.split_k > 1 else x)
    kernel = nf4_gemv._nf4_matmul_row_kernel if block_m == 1 else nf4_gemv._nf4_matmul_tile_kernel
    config = Config({"BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k}, cfg.num_warps, cfg.num_stages)
    return Launch(f"nf4_gemv.{jit_function(kernel).__name__} {str(dtype).removeprefix('torch.')} M={m}",
                  kernel, _args(kernel, values, f32), (config,), targets=(arch,), ci=ci)


def planted() -> Launch:
    """A FlashAttention forward config that needs 120 KB at D = 128 on sm_86/sm_89 (99 KB): the check must fail it."""
    fwd = _flash_attention(torch.float16, 128, True, ci=False)[0]
    return Launch("planted: flash_attention forward 64 x 64, 4 stages, D=128", fwd.kernel, fwd.args,
                  (Config({"BLOCK_M": 64, "BLOCK_N": 64}, 4, 4),))


def launches() -> list[Launch]:
    """Every launch the course makes, as ``Launch`` rows. Those marked ``ci`` decide fitting: the largest tiles
    of each kernel (head size 128; fp32 x, whose tiles take 4 bytes an element, and bf16 x, without the PTX on
    sm_75), for fp16 and bf16 tiles take the same shared memory."""
    rows = []
    for d in fa.SUPPORTED_HEAD_DIMS:
        for dtype in (torch.float16, torch.bfloat16):
            rows += _flash_attention(dtype, d, causal=True, ci=dtype == torch.float16 and d == 128)
    for dtype in nf4_gemv.DTYPES:
        for m in (1, 2, 16, 32, 64):
            ci = dtype == torch.float32 and m in (1, 2, 32) or dtype == torch.bfloat16 and m == 2
            rows += [_nf4(m, dtype, arch, ci) for arch in TARGETS]
    return rows


def check(launch: Launch, target: str, picks_only: bool = True) -> list[dict]:
    """``launch``'s configs (its picks, or all) compiled for ``target``: one row each, with the shared memory
    one block needs, the target's limit and whether it fits (``fit.shared_bytes``)."""
    rows = []
    for i, config in enumerate(launch.configs):
        if picks_only and i not in launch.picks:
            continue
        need = shared_bytes(launch.kernel, launch.arguments(config), config.num_warps, config.num_stages, target)
        rows.append(dict(launch=launch.name, target=target, config=str(config), pick=i in launch.picks,
                         shared=need, limit=LIMITS[target], fits=need <= LIMITS[target]))
    return rows


def misfits(rows: list[dict]) -> list[str]:
    """A line for each (launch, target) of ``rows`` where none of the picks fits."""
    fitting = {}
    for row in rows:
        if row["pick"]:
            key = (row["launch"], row["target"])
            fitting[key] = fitting.get(key, False) or row["fits"]
    return [f"{name} on {target}: no config fits its {LIMITS[target] // 1024} KB a block"
            for (name, target), ok in fitting.items() if not ok]
