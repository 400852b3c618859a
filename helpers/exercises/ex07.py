"""Exercises of notebook 07 (decoding): unpacking nf4, one step into a static KV cache, the roofline's tokens/s,
and two of the fused kernels in Triton: RMSNorm's forward and the rotary embedding of q and k."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import datasheets, device
from ..finetune import generate
from ..llama import models
from .checks import Case, CodeCheck, NumberCheck, on_device, truncated_bf16_tolerance


def nf4_unpack(packed: torch.Tensor, code: torch.Tensor, absmax: torch.Tensor, blocksize: int) -> torch.Tensor:
    """Solution of 07.1: weight ``i`` is ``code[q_i] * absmax[i // blocksize]``, where byte ``j`` holds
    ``q_2j`` in its high nibble and ``q_2j+1`` in its low one; float32, two weights a byte."""
    q = torch.stack((packed >> 4, packed & 15), dim=1).flatten().long()
    return code[q] * absmax.repeat_interleave(blocksize)


def _nf4_inputs(case: Case, generator: torch.Generator) -> tuple:
    blocks, blocksize = case.params["blocks"], case.params["blocksize"]
    packed = torch.randint(0, 256, (blocks * blocksize // 2,), generator=generator, dtype=torch.uint8)
    # a fresh table each time (sorted, from -1 to 1, like nf4's): the answer must read it, not its own copy
    inner = torch.sort(torch.rand(14, generator=generator, dtype=torch.float64) * 2 - 1).values
    code = torch.cat((torch.tensor([-1.0], dtype=torch.float64), inner, torch.tensor([1.0], dtype=torch.float64)))
    absmax = torch.rand(blocks, generator=generator, dtype=torch.float64) + 0.1
    return on_device(packed), on_device(code.float()), on_device(absmax.float()), blocksize


def _nf4_reference(packed, code, absmax, blocksize) -> torch.Tensor:
    packed, code, absmax = packed.cpu().long(), code.cpu().double(), absmax.cpu().double()
    weights = torch.empty(2 * packed.numel(), dtype=torch.float64)
    for j, byte in enumerate(packed.tolist()):  # one byte at a time: slow and plain, the definition itself
        for half, q in enumerate((byte >> 4, byte & 15)):
            i = 2 * j + half
            weights[i] = code[q] * absmax[i // blocksize]
    return weights


NF4_UNPACK = CodeCheck(
    "07.1", "nf4_unpack(packed, code, absmax, blocksize): two 4-bit codes a byte, looked up and scaled",
    solution=nf4_unpack, make_inputs=_nf4_inputs, reference=_nf4_reference,
    cases=[Case(f"{b} blocks of {bs}", torch.float32, {"blocks": b, "blocksize": bs})
           for b, bs in ((1, 64), (3, 64), (5, 16), (7, 2))],
    out_dtypes=lambda case: (torch.float32,),
    hints={"value": "Wrong weights. The high nibble (byte >> 4) is the first weight of the pair, the low one "
                    "(byte & 15) the second. Weight i (not byte j) belongs to block i // blocksize.",
           "raised": "Indexing a tensor with uint8 values treats them as a mask: convert the codes with .long() "
                     "before `code[q]`.",
           "shape": "Two weights per byte: the result has 2 * packed.numel() elements, in order."})


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Solution of 07.2: write one step's ``k``, ``v`` (B, H, 1, D) into the caches (B, H, max_len, D) at
    the position in the one-element tensor ``pos``, in place; returns the caches."""
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    return k_cache, v_cache


class GraphPosition(torch.Tensor):
    """The step's position as a CUDA graph holds it: a tensor it reads at every replay. Reading it on the host
    (``int(pos)``, ``pos.item()``, ``pos.tolist()``) would freeze one step's value into the graph, so here it
    raises."""

    def _read_on_the_host(self, *args, **kwargs):
        raise RuntimeError("pos read on the host (int(pos), pos.item(), pos.tolist()): a CUDA graph would keep "
                           "that one value")

    item = tolist = __int__ = __index__ = _read_on_the_host


def _kv_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    b, h, max_len, d = case.params["cache"]
    caches = [torch.randn(b, h, max_len, d, generator=generator).to(case.dtype) for _ in range(2)]  # earlier steps
    step = [torch.randn(b, h, 1, d, generator=generator).to(case.dtype) for _ in range(2)]
    pos = on_device(torch.tensor([case.params["pos"]])).as_subclass(GraphPosition)
    return (*(on_device(t) for t in (*caches, *step)), pos)


def _kv_reference(k_cache, v_cache, k, v, pos) -> tuple[torch.Tensor, torch.Tensor]:
    k_ref, v_ref = k_cache.detach().cpu().double().clone(), v_cache.detach().cpu().double().clone()
    p = int(pos.as_subclass(torch.Tensor).item())
    k_ref[:, :, p] = k.detach().cpu().double()[:, :, 0]
    v_ref[:, :, p] = v.detach().cpu().double()[:, :, 0]
    return k_ref, v_ref


WRITE_KV = CodeCheck(
    "07.2", "write_kv(k_cache, v_cache, k, v, pos): one decode step's K and V into a static cache, in place",
    solution=write_kv, make_inputs=_kv_inputs, reference=_kv_reference,
    cases=[Case(f"cache {c}, pos {p}", dtype, {"cache": c, "pos": p})
           for c, p in (((1, 2, 7, 8), 0), ((2, 3, 11, 16), 10), ((1, 4, 9, 8), 4))
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype, case.dtype),
    in_place={0: 0, 1: 1},
    hints={"value": "The caches differ from the reference. Only position pos along dim 2 (the sequence) may "
                    "change; every other position holds earlier steps and must stay as it was. K goes to k_cache, "
                    "V to v_cache.",
           "not in place": "A static cache is allocated once: write into it (k_cache.index_copy_(2, pos, k), or "
                           "k_cache[:, :, pos] = k) and return the same tensors; torch.cat makes new ones.",
           "raised": "pos is a one-element tensor so that one CUDA graph serves every step: index with it directly "
                     "(k_cache.index_copy_(2, pos, k), or k_cache[:, :, pos] = k), never through int(pos) or "
                     "pos.item()."})


def _roofline_tokens() -> tuple[float, str]:
    spec, h200, context = models.MODELS["7b"], datasheets.by_name("H200"), 128
    per_token = generate.decode_bytes_per_token(spec, context, lm_head_bytes=2)
    rate = h200.bandwidth_gbps * 1e9 / per_token
    return rate, (f"generate.decode_bytes_per_token(7B, {context} cached tokens, bf16 lm_head) = "
                  f"{per_token / 1e9:.2f} GB a token (nf4 weights, lm_head, one embedding row, the KV cache); "
                  f"the H200's datasheet {h200.bandwidth_gbps:,.0f} GB/s / that = {rate:,.0f} tokens/s")


ROOFLINE_TOKENS = NumberCheck("07.3", "tokens/s the H200's bandwidth allows Llama-2-7B nf4 at batch 1 "
                              "(128 tokens in the cache)", _roofline_tokens, tolerance=0.1, relative=True,
                              unit="tokens/s")



@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, eps, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # padding lanes add 0 to the sum of squares
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)  # one per row: the mean over the n_cols real columns
    tl.store(y_ptr + offs, (x * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, rows_per_program: int) -> torch.Tensor:
    """Solution of 07.4: ``y = x / sqrt(mean(x**2) + eps) * w`` over each row of a contiguous (M, N) ``x``, one
    program per ``rows_per_program`` rows (a power of two), statistics in fp32, ``y`` in ``x``'s dtype."""
    m, n = x.shape
    y = torch.empty_like(x)
    _rms_norm_kernel[(triton.cdiv(m, rows_per_program),)](x, w, y, m, n, eps, ROWS=rows_per_program,
                                                          BLOCK_N=triton.next_power_of_2(n))
    return y


def _rms_norm_inputs(case: Case, generator: torch.Generator) -> tuple:
    # rows whose root mean square spans 3e-4 to 10: at the small end eps weighs as much as mean(x**2), so an
    # eps outside the square root is visible; a weight far from 1, so a missing weight is too
    m, n, rows_per_program = case.params["shape"]
    scale = 10 ** (torch.rand(m, 1, generator=generator) * 4.5 - 3.5)
    x = (scale * torch.randn(m, n, generator=generator)).to(case.dtype)
    w = (1 + torch.randn(n, generator=generator)).to(case.dtype)
    return on_device(x), on_device(w), case.params["eps"], rows_per_program


def _rms_norm_reference(x, w, eps, rows_per_program) -> torch.Tensor:
    x64, w64 = x.detach().cpu().double(), w.detach().cpu().double()
    return x64 / torch.sqrt(x64.pow(2).mean(dim=1, keepdim=True) + eps) * w64


RMS_NORM = CodeCheck(
    "07.4", "rms_norm(x, w, eps, rows_per_program): Llama's RMSNorm forward in Triton, rows_per_program rows a "
            "program, fp32 statistics, y in x's dtype",
    solution=rms_norm, make_inputs=_rms_norm_inputs, reference=_rms_norm_reference,
    cases=[Case(f"{m} x {n}, {r} rows a program", dtype, {"shape": (m, n, r), "eps": eps})
           for (m, n, r), eps in device.pick(full=[((7, 37, 2), 1e-6), ((1001, 1000, 4), 1e-5),
                                                   ((4099, 4000, 2), 1e-6)],
                                             smoke=[((7, 37, 2), 1e-6), ((10, 100, 4), 1e-5), ((13, 300, 4), 1e-6)])
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype,),
    tolerance=truncated_bf16_tolerance,
    hints={"value": "Wrong values. The mean of x**2 is over a row's n_cols real columns: what do the padding lanes "
                    "(cols >= n_cols) load, and what do you divide the sum by? eps is added to the mean before the "
                    "square root, and each row has its own statistic. The check's rows include some whose mean "
                    "square is as small as eps. On the CPU, Triton's interpreter computes wrong values in bfloat16 "
                    "arithmetic: convert each load to float32 first.",
           "unwritten": "NaN in the result: rows never written (they start as NaN). The grid needs enough programs "
                        "of rows_per_program rows to cover all M rows, counting a partial last one, and the store's "
                        "mask must let every row < M and column < N through.",
           "raised": "Your function raised: read the message. tl.arange needs a power of two (BLOCK_N, ROWS); a 2-D "
                     "tile of offsets comes from rows[:, None] * n_cols + cols[None, :].",
           "dtype": "Return x's dtype: compute in fp32, then `.to(y_ptr.dtype.element_ty)` in the store."})



@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, seq_len, start, HALF: tl.constexpr, BLOCK_S: tl.constexpr):
    head = tl.program_id(0)  # one (batch, head) pair of x seen as (B * H, S, D)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)  # this program's tokens
    d = tl.arange(0, HALF)
    ok = (s < seq_len)[:, None]
    x_offs = (head * seq_len + s)[:, None] * (2 * HALF) + d[None, :]  # the first halves of the tokens' vectors
    t_offs = (start + s)[:, None] * (2 * HALF) + d[None, :]  # the table rows of the tokens' positions
    x1 = tl.load(x_ptr + x_offs, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_offs + HALF, mask=ok, other=0.0).to(tl.float32)  # element i + D/2: i's partner
    cos1 = tl.load(cos_ptr + t_offs, mask=ok, other=0.0)
    cos2 = tl.load(cos_ptr + t_offs + HALF, mask=ok, other=0.0)
    sin1 = tl.load(sin_ptr + t_offs, mask=ok, other=0.0)
    sin2 = tl.load(sin_ptr + t_offs + HALF, mask=ok, other=0.0)
    # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
    tl.store(y_ptr + x_offs, (x1 * cos1 - x2 * sin1).to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + x_offs + HALF, (x2 * cos2 + x1 * sin2).to(y_ptr.dtype.element_ty), mask=ok)


ROPE_BLOCK_S = 4  # tokens a program


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Solution of 07.5: Llama's rotary embedding (transformers' rotate-half convention) of contiguous q
    (B, H, S, D) and k (B, H_kv, S, D), token s at position ``start + s``, with fp32 ``cos`` and ``sin`` tables
    (max_len, D); one program per (batch, head) and ``ROPE_BLOCK_S`` tokens; returns the rotated q and k in
    their dtypes."""
    rotated = []
    for x in (q, k):
        b, h, s, d = x.shape
        y = torch.empty_like(x)
        _rope_kernel[(b * h, triton.cdiv(s, ROPE_BLOCK_S))](x, cos, sin, y, s, start, HALF=d // 2,
                                                             BLOCK_S=ROPE_BLOCK_S)
        rotated.append(y)
    return rotated[0], rotated[1]


def rope_tables(max_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's fp32 cos and sin tables (max_len, head_dim), as transformers builds them: row p holds
    cos(p * theta_j) and sin(p * theta_j), theta_j = base ** (-2j / head_dim), for j < head_dim / 2, twice."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * theta[None, :]
    angles = torch.cat([angles, angles], dim=1)
    return angles.cos().float(), angles.sin().float()


def _rope_inputs(case: Case, generator: torch.Generator) -> tuple:
    b, h, h_kv, s, d, start = case.params["shape"]
    q = torch.randn(b, h, s, d, generator=generator).to(case.dtype)
    k = torch.randn(b, h_kv, s, d, generator=generator).to(case.dtype)
    cos, sin = rope_tables(start + s + 5, d)  # a few rows past the last position, as a cache's tables have
    return on_device(q), on_device(k), on_device(cos), on_device(sin), start


def _rope_reference(q, k, cos, sin, start) -> tuple[torch.Tensor, torch.Tensor]:
    positions = start + torch.arange(q.shape[2])
    c, s = cos.detach().cpu().double()[positions], sin.detach().cpu().double()[positions]
    out = []
    for x in (q, k):
        x = x.detach().cpu().double()
        x1, x2 = x.chunk(2, dim=-1)
        out.append(x * c + torch.cat([-x2, x1], dim=-1) * s)  # transformers' apply_rotary_pos_emb
    return out[0], out[1]


ROPE = CodeCheck(
    "07.5", "rope(q, k, cos, sin, start): Llama's rotary embedding of q and k in Triton, pairs (i, i + D/2), token s "
            "at position start + s",
    solution=rope, make_inputs=_rope_inputs, reference=_rope_reference,
    # (B, H, H_kv, S, D, start): odd numbers of tokens and heads, positions after a cache of `start` tokens
    cases=[Case(f"q {b}x{h}x{s}x{d}, k {b}x{h_kv}x{s}x{d}, start {start}", dtype,
                {"shape": (b, h, h_kv, s, d, start)})
           for (b, h, h_kv, s, d, start) in device.pick(full=[(1, 3, 1, 5, 16, 7), (2, 15, 5, 129, 128, 300),
                                                              (3, 9, 3, 1, 128, 1000)],
                                                        smoke=[(1, 3, 1, 5, 16, 7), (2, 5, 1, 9, 32, 20),
                                                               (3, 3, 3, 1, 64, 40)])
           for dtype in (torch.float32, torch.bfloat16)],
    out_dtypes=lambda case: (case.dtype, case.dtype),
    tolerance=truncated_bf16_tolerance,
    hints={"value": "Wrong values (the error is the worse of q and k). Which element is element i rotated with: "
                    "its neighbour, or the one half a vector away? Which half takes the minus sign, "
                    "rotate_half(x) = (-x2, x1)? Token s of x sits at position start + s: which row of the tables "
                    "does it read? On the CPU, Triton's interpreter computes wrong values in bfloat16 arithmetic: "
                    "convert each load to float32 first.",
           "unwritten": "NaN in the result: tokens or heads never written (they start as NaN). The grid needs a "
                        "program for every (batch, head) pair on axis 0 and every block of BLOCK_S tokens, counting "
                        "a partial last one, on axis 1; q and k each need their own launch, with their own number "
                        "of heads.",
           "raised": "Your function raised: read the message. tl.arange needs a power of two (BLOCK_S, D / 2); a "
                     "2-D tile of offsets comes from tokens[:, None] * D + d[None, :]. A masked load needs its "
                     "mask to broadcast to the tile's shape.",
           "dtype": "Return q's and k's dtypes: compute in fp32, then `.to(y_ptr.dtype.element_ty)` in the store."})

CHECKS = (NF4_UNPACK, WRITE_KV, ROOFLINE_TOKENS, RMS_NORM, ROPE)
