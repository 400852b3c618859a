"""Exercises of notebook 02 (arithmetic intensity, the roofline): a one-pass softmax, a ridge point, an intensity,
and a tiled matmul whose tiles are what raise its intensity."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device, datasheets
from ..studies import roofline
from .checks import Case, CodeCheck, NumberCheck, on_device


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Solution of 02.1: softmax over the last dimension of a contiguous 2-D ``x``, one program a row,
    computed in fp32 and stored in ``x``'s dtype."""
    out = torch.empty_like(x)
    _softmax_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def _softmax_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor]:
    # large scores, each row shifted down by up to 200: exp() overflows fp32 unless the row maximum is
    # subtracted first, and a padding lane that loads 0 instead of -inf outweighs a row that is all negative
    m, n = case.params["shape"]
    scores = 40 * torch.randn(m, n, generator=generator) - 200 * torch.rand(m, 1, generator=generator)
    return (on_device(scores.to(case.dtype)),)


SOFTMAX = CodeCheck(
    "02.1", "softmax_rows(x): the softmax of each row in one Triton program, one read and one write",
    solution=softmax_rows, make_inputs=_softmax_inputs,
    reference=lambda x: torch.softmax(x.detach().cpu().double(), dim=-1),
    cases=[Case(f"{m} x {n}", dtype, {"shape": (m, n)})
           for (m, n) in device.pick(full=[(3, 37), (64, 1000), (129, 4097)], smoke=[(3, 37), (4, 100), (2, 1000)])
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype,),
    hints={"value": "Wrong probabilities. Do masked lanes load -inf (`other=-float('inf')`), so that they add "
                    "exp(-inf) = 0 to the sum? Do you subtract the row maximum before `tl.exp`?",
           "unwritten": "NaN: either rows never written (grid `(x.shape[0],)`), or exp() overflowed to inf: "
                        "subtract the row maximum first; inf / inf is NaN.",
           "dtype": "Store in the input's dtype: `.to(out_ptr.dtype.element_ty)` before `tl.store`."})


def _ridge() -> tuple[float, str]:
    a100 = datasheets.by_name("A100 40GB SXM")
    return a100.ridge_flops_per_byte, (f"datasheet (helpers.datasheets): {a100.tensor_tflops:g} TFLOP/s bf16 tensor "
                                       f"cores / {a100.bandwidth_gbps:,.0f} GB/s = {a100.ridge_flops_per_byte:.1f} "
                                       "FLOP per byte")


RIDGE = NumberCheck("02.2", "the bf16 tensor-core ridge point of the A100 40GB, FLOP per byte",
                    _ridge, tolerance=0.05, relative=True, unit="FLOP/byte")


def _softmax_intensity() -> tuple[float, str]:
    op = next(o for o in roofline.operations() if o["operation"].startswith("softmax"))
    return op["flops_per_byte"], (f"{roofline.SOFTMAX_FLOPS} FLOPs an element (max, subtract, exp, sum, divide) "
                                  "over 2 + 2 bytes (one bf16 read, one bf16 write): roofline.operations()")


SOFTMAX_INTENSITY = NumberCheck("02.3", "the arithmetic intensity of your softmax on bf16 rows, FLOP per byte",
                                _softmax_intensity, tolerance=0.05, relative=True, unit="FLOP/byte")


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)  # each loaded element of a is used BLOCK_N times, each of b BLOCK_M times
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


MATMUL_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16}  # tl.dot needs sides of at least 16


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Solution of 02.4: ``a @ b`` for contiguous (M, K) and (K, N) float32 or float16 tensors, one program per
    BLOCK_M x BLOCK_N tile of the output, looping over K in BLOCK_K steps; accumulated in fp32, stored in
    ``a``'s dtype."""
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(m, MATMUL_BLOCKS["BLOCK_M"]), triton.cdiv(n, MATMUL_BLOCKS["BLOCK_N"]))
    _matmul_kernel[grid](a, b, c, m, n, k, **MATMUL_BLOCKS)
    return c


def _matmul_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    m, n, k = case.params["shape"]
    return (on_device(torch.randn(m, k, generator=generator).to(case.dtype)),
            on_device(torch.randn(k, n, generator=generator).to(case.dtype)))


MATMUL = CodeCheck(
    "02.4", "matmul(a, b): C = A @ B in Triton, one program per output tile, a loop over K with tl.dot",
    solution=matmul, make_inputs=_matmul_inputs,
    reference=lambda a, b: a.detach().cpu().double() @ b.detach().cpu().double(),
    # with 32 x 32 tiles every case needs several programs along M and along N, and K ends in a partial tile
    cases=[Case(f"({m}, {k}) @ ({k}, {n})", dtype, {"shape": (m, n, k)})
           for (m, n, k) in device.pick(full=[(70, 90, 45), (300, 200, 257), (1000, 513, 1000)],
                                        smoke=[(70, 90, 45), (33, 100, 70), (100, 40, 7)])
           for dtype in (torch.float32, torch.float16)],
    out_dtypes=lambda case: (case.dtype,),
    # on a GPU tl.dot multiplies float32 in tf32 (10 bits of mantissa); a float16 C is rounded to 11 bits
    tolerance=lambda case: 2e-3,
    hints={"value": "Wrong values. Does every K tile add into one fp32 accumulator, made once before the loop? "
                    "Does the loop reach the last, partial K tile, and what do its lanes past K load? Row r of a "
                    "starts at element r * K, row k of b at k * N.",
           "unwritten": "NaN in the result: some tiles of C were never written. How many tiles does C have along "
                        "M, and along N, counting a partial one? The grid needs a program for each, on the axis "
                        "whose program_id the kernel reads for it; and the store's mask must let every row < M and "
                        "column < N through. Or an unmasked load read past a or b, where memory can hold NaN (and "
                        "NaN x 0 is NaN): mask every load, along K too, with `other=0.0`.",
           "raised": "Your function raised: read the message. tl.dot(a, b) takes a (BLOCK_M, BLOCK_K) tile and a "
                     "(BLOCK_K, BLOCK_N) one; two 1-D offsets make a 2-D tile of pointers with rows[:, None] and "
                     "ks[None, :]. On a GPU tl.dot needs tile sides of at least 16; on the CPU the interpreter "
                     "multiplies float32 and float16 (not bfloat16).",
           "dtype": "Return a's dtype: accumulate in fp32, then `.to(c_ptr.dtype.element_ty)` in the store."})

CHECKS = (SOFTMAX, RIDGE, SOFTMAX_INTENSITY, MATMUL)
