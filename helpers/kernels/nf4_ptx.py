"""The PTX that decodes nf4 codes in registers, for the kernels of ``nf4_matvec`` and ``nf4_matmul_tile``.

A table lookup through memory costs several instructions per weight (extract the nibble, form a 64-bit
address, load), and the instructions, not the bytes, would set the pace. So on the GPU the codes are
decoded in registers by a few lines of PTX (``_lookup_ptx``): ``prmt`` selects bytes by 4-bit indices,
which makes it a table lookup for four codes at once, 19 instructions for the eight weights of a 32-bit
word (the 16-entry table rides along in eight registers as byte planes, built by ``_plane``). Then:

* ``_dot_ptx`` (one row of x, CUDA cores): the eight weights times x in fp32 multiply-adds, one fp32 sum
  per word. A weight becomes an fp32 in one more ``prmt``: its 16 looked-up bits on top and the sign byte
  replicated below (``_row_value``: the table to within half a bf16 step, the precision of a bf16 result).
* ``_dequant_ptx`` (several rows, tensor cores): the eight weights times their block's scale, in x's
  dtype (fp16 or bf16), for ``tl.dot``; the table held in fp16 (within 2^-12 of each nf4 value).

The strings are generated here and passed to ``tl.inline_asm_elementwise`` (``PTX_BF16``, ``PTX_FP16``,
``PTX_DOT``); the tests run them through a small PTX emulator.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (first: sets TRITON_INTERPRET before the helpers are defined)
from .rounding import round_to_bf16


def _lookup_ptx(word: str, planes: list[str], use) -> str:
    """PTX that looks up the table values of the eight 4-bit codes of register ``word``, four at a time:
    for each half (0: the low 16 bits), the values as 16-bit patterns split in two registers, ``lo``
    (their low bytes) and ``hi`` (their high bytes), followed by the PTX ``use(half)``. Byte j of ``lo``
    and ``hi`` holds the value of nibble j of the half: elements ``_NIBBLE_ELEMENT`` (+ 4 for half 1).

    ``prmt`` picks one byte of 8 by each nibble's low 3 bits (``s``), so the bytes of entries 0-7 and of
    entries 8-15 are looked up separately and merged by each nibble's bit 3 (``t``; a byte mask ``m``
    made by one more ``prmt``; ``lop3`` 0xd8 is ``(a & ~m) | (b & m)``). ``prmt`` reads the low 16 bits
    of its selector, so the second half is the first shifted. ``planes``: the table as eight byte
    planes (see ``_plane``). Registers: s, t, m, a, b, lo, hi."""
    body = f"""
 and.b32 s, {word}, 0x77777777;
 shr.b32 t, {word}, 1;
 and.b32 t, t, 0x44444444;"""
    for half in range(2):
        if half:
            body += "\n shr.b32 s, s, 16;\n shr.b32 t, t, 16;"
        body += f"""
 prmt.b32 m, 0, 0xffffffff, t;
 prmt.b32 a, {planes[0]}, {planes[1]}, s;
 prmt.b32 b, {planes[2]}, {planes[3]}, s;
 lop3.b32 lo, a, b, m, 0xd8;
 prmt.b32 a, {planes[4]}, {planes[5]}, s;
 prmt.b32 b, {planes[6]}, {planes[7]}, s;
 lop3.b32 hi, a, b, m, 0xd8;""" + use(half)
    return body


_NIBBLE_ELEMENT = (1, 0, 3, 2)  # nibble j of a little-endian 16-bit half holds element _NIBBLE_ELEMENT[j]
# prmt selectors that pair the looked-up bytes into two 16-bit values in storage order
_PAIRS = ("0x4051", "0x6273")  # elements (0, 1) and (2, 3) of the four
# prmt selectors that make an fp32 of looked-up value j: its 16 bits on top, the low 16 bits the sign of
# the value replicated (0 for a value >= 0, 0xffff below; ``_row_value`` makes the table for that)
_F32 = ("0x40cc", "0x51dd", "0x62ee", "0x73ff")


def _dequant_ptx(dtype: torch.dtype) -> str:
    """PTX for one 32-bit word of packed codes (``$8``) and its block's scale (``$9``, fp32): its eight
    weights in ``dtype`` (fp16 or bf16), ``$0`` ... ``$7`` in storage order (element 2j is the high nibble
    of byte j); ``$10`` ... ``$17``: the table in fp16 (byte planes). fp16: one packed multiply by the
    scale (rounded to fp16) per pair of weights. bf16: each table value widened to fp32, times the fp32
    scale, the pair rounded once to bf16 (``dequantize_4bit``'s rounding; a bf16 table and scale
    multiplied in bf16 would round each weight three times)."""
    # p: two fp16 table values (low half: the first in storage order), made two weights in place
    if dtype == torch.float16:
        head, scaled = "\n cvt.rn.f16x2.f32 sc, $9, $9;", " mul.rn.f16x2 p, p, sc;"
    else:
        head, scaled = "", (" mov.b32 {h0, h1}, p;\n cvt.f32.f16 f0, h0;\n cvt.f32.f16 f1, h1;\n mul.rn.f32 f0, f0, $9;"
                            "\n mul.rn.f32 f1, f1, $9;\n cvt.rn.bf16x2.f32 p, f1, f0;")

    def store(half: int) -> str:
        return "".join(f"\n prmt.b32 p, lo, hi, {pair};\n{scaled}\n mov.b32 {{${4 * half + 2 * j}, "
                       f"${4 * half + 2 * j + 1}}}, p;" for j, pair in enumerate(_PAIRS))

    return ("{\n .reg .b32 s, t, m, a, b, lo, hi, p, sc;\n .reg .b16 h0, h1;\n .reg .f32 f0, f1;" + head
            + _lookup_ptx("$8", [f"${i}" for i in range(10, 18)], store) + "\n}")


def _dot_ptx() -> str:
    """PTX for the one-row path: ``$0`` (fp32) = the sum of the eight products of one word of codes
    (``$1``) and the eight x values of its columns (``$2`` ... ``$9``, fp32, in storage order), in fp32
    multiply-adds; ``$10`` ... ``$17``: the table as ``_row_value`` makes it (byte planes of its top 16
    bits). A product costs one ``prmt`` (the weight as fp32) and one ``fma``."""

    def multiply_add(half: int) -> str:
        return "".join(f"\n prmt.b32 p, lo, hi, {sel};\n fma.rn.f32 acc, p, ${2 + 4 * half + _NIBBLE_ELEMENT[j]}, "
                       "acc;" for j, sel in enumerate(_F32))

    return ("{\n .reg .b32 s, t, m, a, b, lo, hi, p;\n .reg .f32 acc;\n mov.f32 acc, 0f00000000;"
            + _lookup_ptx("$1", [f"${i}" for i in range(10, 18)], multiply_add) + "\n mov.f32 $0, acc;\n}")


PTX_BF16 = tl.constexpr(_dequant_ptx(torch.bfloat16))
PTX_FP16 = tl.constexpr(_dequant_ptx(torch.float16))
PTX_DOT = tl.constexpr(_dot_ptx())


@triton.jit
def _row_value(v):
    """The fp32 the one-row PTX makes of table value ``v``: 16 bits chosen here on top, and below them
    0x0000 for v >= 0 (v rounded to bf16) or 0xffff for v < 0 (the nearest such fp32): within half a
    bf16 step of v either way."""
    bits = v.to(tl.int32, bitcast=True)
    bits = tl.where(bits >= 0, (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536, ((bits - 0x7FFF) & -65536) | 0xFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _plane(CODE, FIRST: tl.constexpr, HIGH: tl.constexpr, DTYPE: tl.constexpr):
    """One byte plane of the table for the PTX: the low (HIGH=0) or high byte of entries FIRST ... FIRST+3,
    in bytes 0 ... 3 of an int32 (kept in a register through the loop). The entries rounded to DTYPE
    (bf16, fp16), or for DTYPE fp32 the top 16 bits of ``_row_value``."""
    word = 0
    for j in tl.static_range(4):
        v = tl.load(CODE + FIRST + j)
        if DTYPE == tl.bfloat16:
            bits = round_to_bf16(v).to(tl.int32, bitcast=True) >> 16
        elif DTYPE == tl.float32:
            bits = _row_value(v).to(tl.int32, bitcast=True) >> 16
        else:
            bits = v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        word = word | (((bits >> (8 * HIGH)) & 0xFF) << (8 * j))
    return word


@triton.jit
def _table_planes(CODE, DTYPE: tl.constexpr):
    """The eight ``_plane`` words of the table in the order the PTX takes them: the low bytes of entries
    0-3, 4-7, 8-11, 12-15, then their high bytes."""
    return (_plane(CODE, 0, 0, DTYPE), _plane(CODE, 4, 0, DTYPE), _plane(CODE, 8, 0, DTYPE),
            _plane(CODE, 12, 0, DTYPE), _plane(CODE, 0, 1, DTYPE), _plane(CODE, 4, 1, DTYPE),
            _plane(CODE, 8, 1, DTYPE), _plane(CODE, 12, 1, DTYPE))
