"""The fused nf4 matrix-vector kernel against bitsandbytes' own dequantisation, in float64.

On the CPU the kernel runs in the Triton interpreter, whose fp32 -> bf16 conversion truncates
instead of rounding to nearest: the bf16 tolerance allows for it.
"""
import math
import struct

import pytest
import torch

import helpers  # first: sets TRITON_INTERPRET before bitsandbytes imports Triton
import bitsandbytes as bnb
import bitsandbytes.functional as BF
import triton
import triton.language as tl
from helpers.kernels import nf4_gemv as K
from helpers.kernels import nf4_ptx as P
from numerics import rel_err

DEV = helpers.DEVICE
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# relative error (norm) of a result stored in the dtype, against float64 (fp32: about 10x the largest measured, 6.2e-7)
TOL = {torch.float32: 6e-6, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def quantize(n, k, nested=True, storage=torch.uint8, blocksize=64, quant_type="nf4", seed=0):
    """An (n, k) fp32 weight quantised by bitsandbytes: (packed, quant_state)."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).to(DEV)
    return BF.quantize_4bit(w, blocksize=blocksize, quant_type=quant_type, compress_statistics=nested,
                            quant_storage=storage)


def reference(x, packed, state, bias=None):
    """x @ W^T (+ bias) in float64, W from bitsandbytes' dequantize_4bit."""
    w = BF.dequantize_4bit(packed, state).to("cpu", torch.float64)
    y = x.to("cpu", torch.float64) @ w.T
    return y if bias is None else y + bias.to("cpu", torch.float64)


def randn(*shape, dtype=torch.float32, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEV, dtype)


# ------------------------------------------------------------------------------ against float64
SHAPES = [  # (leading dims of x, N, K): N off every block size, K not a power of two, M = 1 ... 40
    ((1,), 1, 64),
    ((3,), 37, 192),
    ((16,), 130, 320),
    ((2, 3), 37, 320),
    ((40,), 37, 64),
]
STORAGE = [(True, torch.uint8), (False, torch.uint8), (True, torch.bfloat16), (False, torch.bfloat16)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nested,storage", STORAGE)
@pytest.mark.parametrize("lead,n,k", SHAPES)
def test_matches_float64(lead, n, k, nested, storage, dtype, poisoned):
    packed, state = quantize(n, k, nested, storage)
    x = randn(*lead, k, dtype=dtype)
    y = K.nf4_matmul(x, (packed, state))
    assert y.shape == (*lead, n) and y.dtype == dtype
    assert rel_err(y, reference(x, packed, state)) < TOL[dtype]


CONFIGS = [  # several chunks per program, split K (even and uneven), wide and narrow tiles
    K.Config(16, 64, 4),
    K.Config(64, 128, 4, split_k=2),
    K.Config(16, 64, 2, split_k=3),
    K.Config(32, 512, 4, split_k=4),
    K.Config(16, 64, 4, split_k=3, prefetch=True),  # loads one chunk ahead, over uneven slices
    K.Config(32, 64, 2, prefetch=True),
    K.Config(4, 128, 2, prefetch=True),  # narrow tiles: one row of x only (m = 5 must refuse them)
    K.Config(32, 128, 4, prefetch=True, max_registers=64),  # capped registers: spills on a GPU, same sums
]


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_configs_and_bias(cfg, m, poisoned):
    packed, state = quantize(70, 448)
    x, bias = randn(m, 448), randn(70, seed=2)
    if m > 1 and cfg.block_n < 16:
        with pytest.raises(ValueError, match="block_n must be >= 16"):
            K.nf4_matmul(x, (packed, state), bias, config=cfg)
        return
    y = K.nf4_matmul(x, (packed, state), bias, config=cfg)
    assert rel_err(y, reference(x, packed, state, bias)) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n,k", [((1,), 37, 320), ((5,), 37, 192)])
def test_gate_takes_silu_gate_times_x(lead, n, k, dtype, poisoned):
    packed, state = quantize(n, k)
    up, gate = randn(*lead, k, dtype=dtype), randn(*lead, k, dtype=dtype, seed=2)
    x = torch.nn.functional.silu(gate) * up  # what the fused read replaces, rounded as PyTorch rounds it
    fused = K.nf4_matmul(up, (packed, state), gate=gate)
    assert rel_err(fused, reference(x, packed, state)) < TOL[dtype]
    assert rel_err(fused, K.nf4_matmul(x, (packed, state)).double().cpu()) < TOL[torch.float32]
    with pytest.raises(ValueError, match="gate"):
        K.nf4_matmul(up, (packed, state), gate=gate[..., :-2])


def test_split_k_is_deterministic():
    packed, state = quantize(33, 1024)
    x = randn(1, 1024)
    cfg = K.Config(16, 64, 4, split_k=5)
    assert torch.equal(K.nf4_matmul(x, (packed, state), config=cfg), K.nf4_matmul(x, (packed, state), config=cfg))


@pytest.mark.parametrize("blocksize", [32, 128, 256])
def test_other_blocksizes(blocksize):
    packed, state = quantize(19, 512, blocksize=blocksize)
    x = randn(2, 512)
    assert rel_err(K.nf4_matmul(x, (packed, state)), reference(x, packed, state)) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bias_in_another_dtype(dtype):
    packed, state = quantize(37, 128)
    x, bias = randn(1, 128, dtype=dtype), randn(37, dtype=torch.float16, seed=3)
    assert rel_err(K.nf4_matmul(x, (packed, state), bias), reference(x, packed, state, bias)) < TOL[dtype]


def test_strided_x():
    packed, state = quantize(37, 128)
    wide = randn(3, 256)
    for x in (wide[:, :128], wide[:, ::2], randn(128, 3).t()):
        assert not x.is_contiguous()
        assert rel_err(K.nf4_matmul(x, (packed, state)), reference(x, packed, state)) < TOL[torch.float32]


# ------------------------------------------------------------------------------- bitsandbytes modules
@pytest.mark.parametrize("storage", [torch.uint8, torch.bfloat16])
def test_matches_linear4bit(storage):
    k, n = 192, 64
    linear = torch.nn.Linear(k, n)
    module = bnb.nn.Linear4bit(k, n, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4",
                               quant_storage=storage)
    module.load_state_dict(linear.state_dict())
    module = module.to(DEV)  # quantises
    x = randn(3, k, dtype=torch.bfloat16)
    ours = K.nf4_linear(x, module)  # before module(x): bitsandbytes' forward may change the bias' dtype
    theirs = module(x)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    assert rel_err(ours, theirs.double().cpu()) < TOL[torch.bfloat16]
    assert rel_err(ours, reference(x, module.weight, module.weight.quant_state, linear.bias)) < TOL[torch.bfloat16]


def test_params4bit_and_operands_are_reusable():
    param = bnb.nn.Params4bit(randn(40, 256), quant_type="nf4", blocksize=64).to(DEV)
    x = randn(2, 256)
    ops = K.nf4_operands(param)
    ref = reference(x, param, param.quant_state)
    assert rel_err(K.nf4_matmul(x, param), ref) < TOL[torch.float32]
    assert torch.equal(K.nf4_matmul(x, ops), K.nf4_matmul(x, param))


def test_refuses_weight_repacked_for_the_cpu_kernel():
    module = bnb.nn.Linear4bit(128, 64, quant_type="nf4").to(DEV).eval()
    with torch.no_grad():
        module(torch.randn(1, 128, device=DEV))
    if not getattr(module.weight.quant_state, "packing_format_for_cpu", False):
        pytest.skip("bitsandbytes did not repack the weight here (not a CPU with AVX512-BF16)")
    with pytest.raises(ValueError, match="repacked"):
        K.nf4_linear(torch.randn(1, 128, device=DEV), module)


# ------------------------------------------------------------------------- several weights at once
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(1,), (2, 3)])
@pytest.mark.parametrize("ns", [(37, 130), (64, 16, 16), (70, 70, 70)])
@pytest.mark.parametrize("cfg", [None, K.Config(16, 64, 2, split_k=3)])
def test_group_matches_each_weight(ns, lead, dtype, cfg, poisoned):
    weights = [quantize(n, 320, seed=i) for i, n in enumerate(ns)]
    x = randn(*lead, 320, dtype=dtype)
    outs = K.nf4_matmul_group(x, weights, config=cfg)
    for out, (packed, state), n in zip(outs, weights, ns):
        assert out.shape == (*lead, n) and out.dtype == dtype and out.is_contiguous()
        assert rel_err(out, reference(x, packed, state)) < TOL[dtype]
    single = [K.nf4_matmul(x, w, config=cfg) for w in weights]
    assert all(torch.equal(a, b) for a, b in zip(outs, single))  # the same sums as one launch per weight


def test_group_refuses_what_it_cannot_take():
    x = randn(1, 64)
    with pytest.raises(ValueError, match="1 to 3"):
        K.nf4_matmul_group(x, [quantize(8, 64)] * 4)
    with pytest.raises(ValueError, match="share K"):
        K.nf4_matmul_group(x, [quantize(8, 64), quantize(8, 64, nested=False)])
    with pytest.raises(ValueError, match="share K"):
        K.nf4_matmul_group(x, [quantize(8, 64), quantize(8, 128)])
    module = bnb.nn.Linear4bit(64, 8, bias=True, quant_type="nf4").to(DEV)
    with pytest.raises(ValueError, match="without bias"):
        K.nf4_linear_group(x, [module])
    with pytest.raises(TypeError, match="Linear4bit"):
        K.nf4_linear_group(x, [torch.nn.Linear(64, 8)])


# ------------------------------------------------------------------ the GPU's table lookup (PTX)
def _row_bits(value: float) -> int:
    """The fp32 pattern the one-row PTX holds for table value ``value``: its top 16 bits free, its low 16
    bits the sign replicated (0 or 0xffff), and within half a bf16 step of the value: the nearest such."""
    sign, top = (0xFFFF if value < 0 else 0), _bits32(value) >> 16
    return min(((t << 16) | sign for t in range(max(top - 2, 0), top + 3)), key=lambda c: abs(_f32(c) - value))


def _bits16(dtype):
    """The 16 nf4 values of bitsandbytes as the PTX tables hold them: rounded to ``dtype`` (bf16, fp16),
    or for fp32 the top 16 bits of the one-row table (``_row_bits``)."""
    code = BF.get_4bit_type("nf4", device="cpu").float()
    if dtype == torch.float32:
        return [_row_bits(v) >> 16 for v in code.tolist()]
    return (code.to(dtype).view(torch.int16).int() & 0xFFFF).tolist()


def byte_planes(dtype):
    """What ``_plane`` should build: low bytes of entries 0-3, 4-7, 8-11, 12-15, then the high bytes."""
    bits = _bits16(dtype)
    return [sum(((bits[4 * i + j] >> shift) & 0xFF) << (8 * j) for j in range(4)) for shift in (0, 8) for i in range(4)]


@triton.jit
def _planes_kernel(CODE, OUT, DTYPE: tl.constexpr):
    for i in tl.static_range(4):
        tl.store(OUT + i, P._plane(CODE, 4 * i, 0, DTYPE))
        tl.store(OUT + 4 + i, P._plane(CODE, 4 * i, 1, DTYPE))


@pytest.mark.parametrize("dtype,tl_dtype", [(torch.bfloat16, tl.bfloat16), (torch.float16, tl.float16),
                                            (torch.float32, tl.float32)])
def test_kernel_builds_the_byte_planes(dtype, tl_dtype):
    code = BF.get_4bit_type("nf4", device=DEV).float()
    out = torch.zeros(8, dtype=torch.int32, device=DEV)
    _planes_kernel[(1,)](code, out, DTYPE=tl_dtype)
    assert [v & 0xFFFFFFFF for v in out.tolist()] == byte_planes(dtype)


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32`` (default mode): byte i of the result is byte (nibble i of sel) of {b, a}."""
    source = (b << 32) | a
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = (source >> (8 * (nib & 7))) & 0xFF
        if nib & 8:  # sign mode: the selected byte's top bit, replicated
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _bits32(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def run_ptx(ptx: str, inputs: dict[str, int]) -> dict[str, int]:
    """Execute ``_dequant_ptx`` / ``_dot_ptx`` on 32-bit register values (``inputs``: operand -> bits).
    The multiplies by the scale are skipped (a scale of 1); fp32 arithmetic in float64, then rounded."""
    reg = dict(inputs)

    def val(x: str) -> int:
        return reg[x] if x in reg else _bits32(0.0) if x == "0f00000000" else int(x, 0)

    for line in ptx.splitlines():
        op, _, args = line.strip().rstrip(";").partition(" ")
        a = [t.strip() for t in args.replace("{", "").replace("}", "").split(",")]
        if op == "and.b32":
            reg[a[0]] = val(a[1]) & val(a[2])
        elif op == "shr.b32":
            reg[a[0]] = val(a[1]) >> val(a[2])
        elif op == "shl.b32":
            reg[a[0]] = (val(a[1]) << val(a[2])) & 0xFFFFFFFF
        elif op == "prmt.b32":
            reg[a[0]] = _prmt(val(a[1]), val(a[2]), val(a[3]))
        elif op == "lop3.b32":
            assert a[4] == "0xd8"  # (a & ~c) | (b & c)
            reg[a[0]] = (val(a[1]) & ~val(a[3]) | val(a[2]) & val(a[3])) & 0xFFFFFFFF
        elif op == "mov.b32" and len(a) == 3:  # split a register into two 16-bit halves
            reg[a[0]], reg[a[1]] = val(a[2]) & 0xFFFF, val(a[2]) >> 16
        elif op == "mov.f32":
            reg[a[0]] = val(a[1])
        elif op == "fma.rn.f32":
            reg[a[0]] = _bits32(_f32(val(a[1])) * _f32(val(a[2])) + _f32(val(a[3])))
        elif op == "mul.rn.f32":  # the product of two fp32 is exact in float64: one rounding, to fp32
            reg[a[0]] = _bits32(_f32(val(a[1])) * _f32(val(a[2])))
        elif op == "cvt.f32.f16":
            reg[a[0]] = _bits32(float(torch.tensor([val(a[1])], dtype=torch.int32).to(torch.int16)
                                      .view(torch.float16)))
        elif op == "cvt.rn.bf16x2.f32" and a[1] != a[2]:  # a pair: the first source to the upper half
            hi, lo = (int(torch.tensor([_f32(val(x))]).to(torch.bfloat16).view(torch.int16)) & 0xFFFF
                      for x in a[1:])
            reg[a[0]] = (hi << 16) | lo
        elif op not in SKIPPED and not op.startswith((".reg", "{", "}")) and op:
            raise AssertionError(f"the emulator does not know {op!r}")
    return reg


# the fp16 path's scale conversion and multiply (its test feeds a scale of 1)
SKIPPED = {"cvt.rn.f16x2.f32", "mul.rn.f16x2"}


def _storage_codes(word: int) -> list[int]:
    codes = []
    for byte in word.to_bytes(4, "little"):
        codes += [byte >> 4, byte & 15]  # element 2j: the high nibble of byte j
    return codes


WORDS = torch.randint(0, 2**32, (300,), generator=torch.Generator().manual_seed(0)).tolist()
WORDS += [0x76543210, 0xFEDCBA98, 0, 0xFFFFFFFF]  # every code in every position


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequant_ptx_looks_up_every_code_in_storage_order(dtype):
    """The table in fp16; for bf16 each value times the fp32 scale in fp32, rounded once to bf16."""
    ptx = P._dequant_ptx(dtype)
    planes = {f"${10 + i}": p for i, p in enumerate(byte_planes(torch.float16))}
    table = BF.get_4bit_type("nf4", device="cpu").to(torch.float16).float()
    for scale in (1.0, 0.0371, 3.3e-3) if dtype == torch.bfloat16 else (1.0,):
        scale = _f32(_bits32(scale))
        bits = (_bits16(torch.float16) if dtype == torch.float16 else
                ((table * scale).to(torch.bfloat16).view(torch.int16).int() & 0xFFFF).tolist())
        for word in WORDS:
            out = run_ptx(ptx, {"$8": word, "$9": _bits32(scale), **planes})
            assert [out[f"${i}"] for i in range(8)] == [bits[c] for c in _storage_codes(word)]


def test_row_table_is_within_half_a_bf16_step():
    for value, bits in zip(BF.get_4bit_type("nf4", device="cpu").float().tolist(), _bits16(torch.float32)):
        row = _row_bits(value)
        assert row >> 16 == bits and row & 0xFFFF == (0xFFFF if value < 0 else 0)
        step = 2.0 ** (math.floor(math.log2(abs(value))) - 7) if value else 0.0
        assert abs(_f32(row) - value) <= step / 2


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_dot_ptx_sums_the_products_of_a_word(x_dtype):
    table = [_f32(_row_bits(v)) for v in BF.get_4bit_type("nf4", device="cpu").float().tolist()]
    planes = {f"${10 + i}": p for i, p in enumerate(byte_planes(torch.float32))}
    ptx = P._dot_ptx()
    gen = torch.Generator().manual_seed(1)
    for word in WORDS[:100]:
        x = torch.randn(8, generator=gen).to(x_dtype).double()
        xin = {f"${2 + j}": _bits32(v) for j, v in enumerate(x.tolist())}
        out = _f32(run_ptx(ptx, {"$1": word, **xin, **planes})["$0"])
        expect = sum(table[c] * v for c, v in zip(_storage_codes(word), x.tolist()))
        assert out == pytest.approx(expect, rel=1e-5, abs=1e-6)


# ------------------------------------------------------------------------ what the kernel reads
@pytest.mark.parametrize("storage", [torch.uint8, torch.bfloat16])
def test_operands_are_the_packed_bytes_and_the_uint8_absmax(storage):
    packed, state = quantize(37, 192, nested=True, storage=storage)
    ops = K.nf4_operands((packed, state))
    assert ops.packed.dtype == torch.uint8 and ops.packed.numel() == 37 * 192 // 2
    assert ops.packed.data_ptr() == packed.data_ptr()  # a view of the 4-bit storage, not a copy
    assert ops.absmax.dtype == torch.uint8 and ops.absmax.data_ptr() == state.absmax.data_ptr()
    assert ops.nested_absmax.numel() == math.ceil(37 * 192 / 64 / 256)


def test_never_calls_bitsandbytes_dequantisation(monkeypatch):
    packed, state = quantize(37, 192)
    x = randn(1, 192)
    ref = reference(x, packed, state)

    def refuse(*a, **k):
        raise AssertionError("the weight was dequantised")

    for name in ("dequantize_4bit", "dequantize_nf4", "dequantize_blockwise"):
        monkeypatch.setattr(BF, name, refuse)
    assert rel_err(K.nf4_matmul(x, (packed, state)), ref) < TOL[torch.float32]


def test_config_for():
    for m, n, k in [(1, 4096, 4096), (1, 4096, 11008), (16, 12288, 4096), (64, 32000, 4096), (3, 37, 320)]:
        cfg = K.config_for(m, n, k)
        assert cfg.block_k % 64 == 0 and cfg.split_k >= 1
        assert math.ceil(k / cfg.block_k) >= 2 * cfg.split_k or cfg.split_k == 1
    assert K.config_for(1, 64, 32768).split_k > 1  # few outputs, long rows: K is split
    assert K.config_for(1, 4096, 11008).split_k == 1  # one row with enough programs: no partial sums to add
    assert K.config_for(1, 64, 4096, blocksize=1024).block_k >= 1024
    with pytest.raises(ValueError, match="power of two"):
        K.Config(48, 64, 4)
    with pytest.raises(ValueError, match="split_k"):
        K.Config(16, 64, 4, split_k=0)
    with pytest.raises(ValueError, match="max_registers must be None or 24 ... 255"):
        K.Config(16, 64, 4, max_registers=16)


# --------------------------------------------------------------------------------- empty and bad
def test_empty_input_returns_empty():
    packed, state = quantize(37, 64)
    assert K.nf4_matmul(randn(0, 64), (packed, state)).shape == (0, 37)
    assert K.nf4_matmul(randn(2, 0, 64), (packed, state)).shape == (2, 0, 37)


def test_bad_input_is_a_clear_error():
    packed, state = quantize(37, 64)
    w = (packed, state)
    x = randn(1, 64)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        K.nf4_matmul(x.tolist(), w)
    with pytest.raises(TypeError, match="x must be one of"):
        K.nf4_matmul(x.double(), w)
    with pytest.raises(TypeError, match="x must be one of"):
        K.nf4_matmul(x.int(), w)
    with pytest.raises(ValueError, match=r"K = 64"):
        K.nf4_matmul(randn(1, 128), w)
    with pytest.raises(ValueError, match="one device"):
        K.nf4_matmul(x.to("meta"), w)
    with pytest.raises(ValueError, match=rf"M <= {K.MAX_M}.*dequantize_4bit"):
        K.nf4_matmul(randn(K.MAX_M + 1, 64), w)
    with pytest.raises(ValueError, match=r"bias must be a float tensor of shape \(37,\)"):
        K.nf4_matmul(x, w, randn(36))
    with pytest.raises(ValueError, match="bias is on"):
        K.nf4_matmul(x, w, randn(37).to("meta"))
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        K.nf4_matmul(x, w, 1.0)
    with pytest.raises(TypeError, match="Params4bit"):
        K.nf4_matmul(x, packed)
    with pytest.raises(TypeError, match="Linear4bit"):
        K.nf4_linear(x, torch.nn.Linear(64, 37))
    with pytest.raises(ValueError, match="only nf4"):
        K.nf4_matmul(x, quantize(37, 64, quant_type="fp4"))
    with pytest.raises(ValueError, match="K = 33 is odd"):
        K.nf4_matmul(randn(1, 33), quantize(64, 33))
    with pytest.raises(ValueError, match="blocksize = 64 must be a power of two >= 32 that divides K = 96"):
        K.nf4_matmul(randn(1, 96), quantize(4, 96))
    with pytest.raises(ValueError, match="multiple of the weight's blocksize"):
        K.nf4_matmul(x, w, config=K.Config(16, 32, 4))
    with pytest.raises(ValueError, match="block_n must be >= 16 for 5 row"):
        K.nf4_matmul(randn(5, 64), w, config=K.Config(8, 64, 4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", [None, K.Config(16, 128, 4, prefetch=False)])
def test_table_in_memory_matches_float64(cfg, dtype, poisoned):
    """``asm=False`` (the ladder's rungs 4 and 5): each code looked up in memory, on a GPU too."""
    packed, state = quantize(37, 320)
    x = randn(1, 320, dtype=dtype)
    y = K.nf4_matmul(x, (packed, state), config=cfg, asm=False)
    assert y.dtype == dtype and rel_err(y, reference(x, packed, state)) < TOL[dtype]


def test_compiled_variants_report_the_registers_of_what_ran():
    from helpers.kernels import compiled_variants
    from helpers.kernels.nf4_matvec import _nf4_matmul_row_kernel

    packed, state = quantize(37, 320)
    K.nf4_matmul(randn(1, 320, dtype=torch.bfloat16), (packed, state))
    variants = compiled_variants(_nf4_matmul_row_kernel)  # one row of bf16 x: the one-row kernel
    if helpers.device.INTERPRET:  # nothing is compiled in the interpreter
        assert variants == []
    else:
        assert variants and all(0 < v["registers"] <= 255 and v["num_warps"] >= 1 for v in variants)


class _Launches:
    """Stands in for a kernel: records its name at each launch, then launches it."""

    def __init__(self, kernel, name, launched):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return self.kernel[grid]


@pytest.mark.parametrize("m,dtype,kernel", [(1, torch.bfloat16, "row"), (1, torch.float32, "row"),
                                             (1, torch.float16, "tile"), (2, torch.bfloat16, "tile"),
                                             (3, torch.float32, "tile")])
def test_one_row_of_bf16_or_fp32_x_takes_the_one_row_kernel(m, dtype, kernel, monkeypatch):
    """One row of bf16 or fp32 x: the CUDA-core kernel; fp16 x or more rows: the tensor-core kernel."""
    launched = []
    for name in ("row", "tile"):
        attr = f"_nf4_matmul_{name}_kernel"
        monkeypatch.setattr(K, attr, _Launches(getattr(K, attr), name, launched))
    packed, state = quantize(37, 64)
    x = randn(m, 64, dtype=dtype)
    assert rel_err(K.nf4_matmul(x, (packed, state)), reference(x, packed, state)) < TOL[dtype]
    assert launched == [kernel]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 16, 17, 64])
def test_on_a_gpu_as_close_as_bitsandbytes_own_matmul(m, dtype):
    """The PTX paths (the interpreter runs none of them) at a Llama shape, one row to MAX_M rows, against
    float64 of bitsandbytes' weights: correct, and in bf16 (the decoders' dtype) within 1.15x the error of
    bitsandbytes' own dequantise + matmul (each weight rounded once, as ``dequantize_4bit`` rounds it; fp16
    rounds the scale too)."""
    packed, state = quantize(4096, 4096)
    x = randn(m, 4096, dtype=dtype)
    reference_y = reference(x, packed, state)
    ours = rel_err(K.nf4_matmul(x, (packed, state)), reference_y)
    theirs = rel_err(x @ BF.dequantize_4bit(packed, state).to(dtype).T, reference_y)
    assert ours < TOL[dtype], f"{m} rows: {ours:.3e}"
    assert dtype != torch.bfloat16 or ours <= 1.15 * theirs, f"{m} rows: {ours:.3e} against bitsandbytes' {theirs:.3e}"
