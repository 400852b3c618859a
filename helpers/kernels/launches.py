"""The course's kernel launches as the compiler sees them, for checking them against every target's shared
memory without a GPU (``fit.shared_bytes``; ``tests/test_cross_compile.py``, ``scripts/cross_compile_sweep.py``).

Each ``Launch`` is one kernel at one kind of call (dtype, head size, ...): its arguments (tensors on the
meta device stand for pointers), every config the code may launch it with, in the code's order, and
``picks``: those that decide whether it fits (the config the code picks on a card, and its smallest fallback).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import decode_attention, fused_bias_gelu_layernorm, nf4_dequant, nf4_gemv, paged_decode_attention, rms_norm
from . import flash_attention as fa
from .candidates import flash_attention_hopper as hopper
from .gelu import FAST_ASM, gelu_mode
from .probes import intensity_dial, pointer_chase, stream, vector_add
from .rotary import _rotary_kernel
from .rope_cache import _rope_cache_kernel
from .rowwise import sum_partials_kernel
from .swiglu import BLOCK as SWIGLU_BLOCK
from .swiglu import _swiglu_bwd_kernel, _swiglu_fwd_kernel
from .teaching import fused_ladder, nf4_gemv_simple
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
    ci: tuple[str, ...] = TARGETS  # the targets the CI test compiles it for (every target: the sweep)

    def arguments(self, config: Config) -> dict:
        return {**self.args, **config.constants}


def _t(dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device="meta")


def _from_triton(configs) -> tuple[Config, ...]:
    return tuple(Config(dict(c.kwargs), c.num_warps, c.num_stages) for c in configs)


def _args(kernel, values: dict, default) -> dict:
    """Every parameter of ``kernel``: from ``values`` by name, else ``default``."""
    return {p.name: values.get(p.name, default) for p in jit_function(kernel).params}


def _name(kernel) -> str:
    """A kernel's module (under ``helpers.kernels``) and name, e.g. "flash_attention._fwd_kernel"."""
    fn = jit_function(kernel)
    return f"{fn.fn.__module__.removeprefix('helpers.kernels.')}.{fn.__name__}"


def _flash_attention(dtype: torch.dtype, d: int, causal: bool, ci: tuple[str, ...]) -> list[Launch]:
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
        rows.append(Launch(f"{_name(kernel)} {tag}", kernel,
                           _args(kernel, values, _t(dtype)), configs, picks=(len(configs) - 1,), ci=ci))
    rows.append(_one(fa._bwd_delta_kernel, values, _t(dtype), dict(BLOCK_M=64), tag=tag, ci=ci))
    return rows


def _nf4(m: int, dtype: torch.dtype, arch: str, ci: tuple[str, ...]) -> Launch:
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
    return Launch(f"{_name(kernel)} {str(dtype).removeprefix('torch.')} M={m}",
                  kernel, _args(kernel, values, f32), (config,), targets=(arch,), ci=ci)


def _one(kernel, values: dict, default, constants: dict, num_warps: int = 4, num_stages: int = 3, tag: str = "",
         ci: tuple[str, ...] = TARGETS, targets: tuple[str, ...] = TARGETS) -> Launch:
    """A kernel launched with one config: ``constants`` (its constexprs), ``num_warps``, ``num_stages``."""
    name = f"{_name(kernel)} {tag}".strip()
    return Launch(name, kernel, _args(kernel, values, default), (Config(constants, num_warps, num_stages),),
                  targets=targets, ci=ci)


def _rowwise(module, n: int, dtype: torch.dtype, ci: tuple[str, ...]) -> list[Launch]:
    """A row-wise kernel's forward and backward at rows of ``n`` elements of ``dtype``, as its tables pick them."""
    f32, m = _t(torch.float32), 8192
    tag = f"{str(dtype).removeprefix('torch.')} N={n}"
    fwd, bwd = module.forward_config(n, dtype), module.backward_config(n, dtype)
    values = dict(M=m, N=n, eps=1e-5, stride_x=n, stride_r=n, MEAN=f32, RSTD=f32, PART=f32, FAST=FAST_ASM,
                  GELU=gelu_mode("auto", dtype), SINGLE=True, EVEN_N=True, LAYERNORM=True, HAS_W=True, HAS_LB=True,
                  HAS_RES=True, HAS_DW=True)
    kernels = ((module._forward_kernel, module._backward_kernel) if module is fused_bias_gelu_layernorm
               else (module._rms_norm_fwd_kernel, module._rms_norm_bwd_kernel))
    return [_one(kernels[0], values, _t(dtype), dict(BLOCK_N=fwd.block_n, ROWS=fwd.rows, PREFETCH=fwd.prefetch,
                                                   STAGES=fwd.stages), fwd.num_warps, tag=tag, ci=ci),
            _one(kernels[1], values, _t(dtype), dict(BLOCK_N=bwd.block_n, ROWS=bwd.rows, PREFETCH=bwd.prefetch),
                 bwd.num_warps, tag=tag, ci=ci)]


def _decode(dtype: torch.dtype, d: int, ci: tuple[str, ...]) -> list[Launch]:
    """Decode attention, contiguous and paged, at Llama-2-7B's shape (32 heads, grouped 4 to a key/value head)."""
    f32, i32, tag = _t(torch.float32), _t(torch.int32), f"{str(dtype).removeprefix('torch.')} D={d}"
    values = dict(POS=i32, LENS=i32, TABLE=i32, TICKETS=i32, PART_O=f32, PART_ML=f32, HKV=8, MAX_LEN=4096,
                  TABLE_WIDTH=256, SLICE=1024, scale=0.1, GROUP=4, ROWS=16, HEAD_DIM=d, PAGE=16, SPLITS=4,
                  FP32_DOT=False)
    return [_one(decode_attention._decode_attention_kernel, values, _t(dtype),
                 dict(BLOCK_T=decode_attention.BLOCK_T), tag=tag, ci=ci),
            _one(paged_decode_attention._paged_decode_attention_kernel, values, _t(dtype),
                 dict(BLOCK_T=decode_attention.BLOCK_T), tag=tag, ci=ci)]


def _small(ci: tuple[str, ...]) -> list[Launch]:
    """The element-wise and teaching kernels, each at the launch its host function makes by default."""
    bf16, f32, i32, u8 = _t(torch.bfloat16), _t(torch.float32), _t(torch.int32), _t(torch.uint8)
    n = 2**24
    return [
        _one(_swiglu_fwd_kernel, dict(n=n), bf16, dict(BLOCK=SWIGLU_BLOCK), ci=ci),
        _one(_swiglu_bwd_kernel, dict(n=n), bf16, dict(BLOCK=SWIGLU_BLOCK), ci=ci),
        _one(_rotary_kernel, dict(H=32, S=4096, stride_xb=2**22, stride_xh=128, stride_xs=4096, stride_yb=2**22,
                                  stride_yh=128, stride_ys=4096, stride_cb=2**19, stride_cs=64, COS=f32, SIN=f32),
             bf16, dict(HALF=64, BLOCK_H=32, BACKWARD=False), ci=ci),
        _one(_rope_cache_kernel, dict(H=32, HKV=8, MAX_LEN=4096, COS=f32, SIN=f32, POS=i32), bf16,
             dict(HEAD_DIM=128, HALF=64), ci=ci),
        _one(sum_partials_kernel, dict(P=132, N=4096), f32, dict(BLOCK_P=32, BLOCK_C=256), ci=ci),
        _one(nf4_gemv._sum_splits_kernel, dict(MN=11008, N=11008, SPLIT_K=4), f32, dict(HAS_BIAS=True, BLOCK=1024),
             ci=ci),
        _one(nf4_dequant._nf4_dequantize_kernel, dict(PACKED=u8, ABSMAX=u8, n_bytes=n, OUT=bf16), f32,
             dict(QB=64, NESTED_QB=256, NESTED=True, BLOCK=nf4_dequant.BLOCK_BYTES, ROUND_BF16=False), ci=ci),
        _one(nf4_gemv_simple._nf4_matvec_kernel, dict(X=bf16, PACKED=u8, OUT=bf16, N=11008, K=4096,
                                                      stride_xm=4096), f32,
             dict(QB=64, BLOCK_N=nf4_gemv_simple.BLOCK_N, BLOCK_K=nf4_gemv_simple.BLOCK_K, NESTED=False,
                  NESTED_QB=256), ci=ci),
        _one(fused_ladder.simple_kernel, dict(N=4096, eps=1e-5), bf16, dict(BLOCK_N=4096, GELU=1), ci=ci),
        _one(fused_ladder.rows_kernel, dict(M=8192, N=4096, eps=1e-5), bf16, dict(BLOCK_N=4096, ROWS=2, GELU=1),
             ci=ci),
        _one(intensity_dial.intensity_dial_kernel, dict(n_elements=n, k=8, a=1.0, b=0.5), f32,
             dict(BLOCK=2048, UNROLL=8), ci=ci),
        _one(pointer_chase.pointer_chase_kernel, dict(steps=4096), _t(torch.int64), dict(TRACE=False), num_warps=1,
             ci=ci),
        _one(stream.stream_sum_kernel, dict(n_elements=n, chunk=2**16, n_chunks=256, passes=4), f32,
             dict(BLOCK=4096), num_warps=8, ci=ci),
        _one(vector_add.add_kernel, dict(n=n), f32, dict(BLOCK=1024), ci=ci),
    ]


def _hopper(d: int, ci: tuple[str, ...]) -> Launch:
    """The Hopper-only candidate forward (tensor descriptors, TMA): sm_90 only, by design."""
    cfg = hopper.HopperConfig()
    constants = hopper.launch_constants(cfg, True, 4096, d)
    warps = constants.pop("num_warps")
    return _one(hopper._hopper_fwd_kernel, dict(H=32, GROUP=4, SQ=4096, SK=4096, qk_scale=0.1, LSE=_t(torch.float32)),
                _t(torch.bfloat16), constants, warps, cfg.stages, tag=f"bfloat16 D={d} causal", ci=ci,
                targets=("sm_90",))


def planted() -> Launch:
    """A FlashAttention forward config that needs 120 KB at D = 128 on sm_86/sm_89 (99 KB): the check must fail it."""
    fwd = _flash_attention(torch.float16, 128, True, ci=())[0]
    return Launch("planted: flash_attention forward 64 x 64, 4 stages, D=128", fwd.kernel, fwd.args,
                  (Config({"BLOCK_M": 64, "BLOCK_N": 64}, 4, 4),))


def launches() -> list[Launch]:
    """Every launch the course makes, as ``Launch`` rows, with the targets CI compiles each for (``ci``): the
    largest tiles of each kernel decide fitting (head size 128; fp32 x, 4 bytes an element, and bf16 x, without
    the PTX on sm_75; the widest rows of the row-wise kernels; fp16 and bf16 tiles take the same memory), on every
    target; the element-wise and teaching kernels (no tiles in shared memory but a reduction's) on sm_75, the
    smallest limit, and sm_80, where pipelined loads start to take shared memory."""
    rows = []
    for d in fa.SUPPORTED_HEAD_DIMS:
        for dtype in (torch.float16, torch.bfloat16):
            rows += _flash_attention(dtype, d, True, TARGETS if dtype == torch.float16 and d == 128 else ())
            rows += _decode(dtype, d, TARGETS if dtype == torch.bfloat16 and d == 128 else ())
        rows.append(_hopper(d, ("sm_90",) if d == 128 else ()))
    for dtype in nf4_gemv.DTYPES:
        for m in (1, 2, 16, 32, 64):
            ci = dtype == torch.float32 and m in (1, 2, 32) or dtype == torch.bfloat16 and m == 2
            rows += [_nf4(m, dtype, arch, (arch,) if ci else ()) for arch in TARGETS]
    for module in (fused_bias_gelu_layernorm, rms_norm):
        for dtype in (torch.bfloat16, torch.float32):
            for n in (1024, 2048, 4096, 8192):
                rows += _rowwise(module, n, dtype, TARGETS if dtype == torch.float32 and n == 8192 else ())
    return rows + _small(("sm_75", "sm_80"))


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
