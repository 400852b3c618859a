"""Exercises of notebook 05 (FlashAttention): merging two online-softmax states, the tiles a causal kernel
visits, the memory of standard attention, and a FlashAttention forward in Triton."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device, results
from .checks import Case, CodeCheck, NumberCheck, on_device


def combine_states(m1: torch.Tensor, l1: torch.Tensor, acc1: torch.Tensor,
                   m2: torch.Tensor, l2: torch.Tensor, acc2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Solution of 05.1: the online-softmax state (m, l, acc) of two tiles of keys from each tile's own."""
    m = torch.maximum(m1, m2)
    shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # a row neither tile sees: m = -inf, sums stay 0
    a1, a2 = torch.exp(m1 - shift), torch.exp(m2 - shift)
    return m, a1 * l1 + a2 * l2, a1[:, None] * acc1 + a2[:, None] * acc2


def _state(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    m = scores.max(dim=1).values
    p = torch.exp(scores - m[:, None]).nan_to_num(0.0)  # a fully masked row: m = -inf, p = 0
    return m, p.sum(dim=1), p @ values


def _combine_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    rows, t1, t2, d = case.params["shape"]
    scores = 3 * torch.randn(rows, t1 + t2, generator=generator, dtype=torch.float64)
    if case.params.get("masked"):  # a causal mask hides all of tile 2 from the first rows
        scores[: rows // 2, t1:] = -float("inf")
    if case.params.get("both_masked"):  # the first rows see no key of either tile (padding, a split of the keys)
        scores[: rows // 3] = -float("inf")
    values = torch.randn(t1 + t2, d, generator=generator, dtype=torch.float64)
    states = _state(scores[:, :t1], values[:t1]) + _state(scores[:, t1:], values[t1:])
    return tuple(on_device(s.to(case.dtype)) for s in states)


def _combine_reference(m1, l1, acc1, m2, l2, acc2) -> tuple[torch.Tensor, ...]:
    """The merged state in float64, rescaling each tile's sums to the common maximum."""
    m1, l1, acc1, m2, l2, acc2 = (t.detach().cpu().double() for t in (m1, l1, acc1, m2, l2, acc2))
    m = torch.maximum(m1, m2)
    seen = ~torch.isinf(m)  # a row that no key of either tile reaches keeps l = 0 and acc = 0
    a1 = torch.where(seen, torch.exp(m1 - m), torch.zeros_like(m))
    a2 = torch.where(seen, torch.exp(m2 - m), torch.zeros_like(m))
    return m, l1 * a1 + l2 * a2, acc1 * a1[:, None] + acc2 * a2[:, None]


_MASKS = {"": "", "masked": ", tile 2 masked for half the rows",
          "both_masked": ", both tiles masked for a third of the rows"}

COMBINE = CodeCheck(
    "05.1", "combine_states(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc): the online-softmax update of two tiles",
    solution=combine_states, make_inputs=_combine_inputs, reference=_combine_reference,
    cases=[Case(f"{r} rows, tiles {t1}+{t2}, d={d}" + _MASKS[mask], torch.float32,
                {"shape": (r, t1, t2, d), mask: True} if mask else {"shape": (r, t1, t2, d)})
           for (r, t1, t2, d), mask in device.pick(
               full=[((64, 64, 64, 128), ""), ((37, 16, 53, 64), ""), ((64, 64, 64, 128), "masked"),
                     ((48, 32, 32, 64), "both_masked")],
               smoke=[((5, 4, 6, 16), ""), ((7, 8, 3, 33), ""), ((6, 4, 4, 16), "masked"),
                      ((9, 4, 5, 16), "both_masked")])],
    out_dtypes=lambda case: (case.dtype,) * 3,
    hints={"value": "Wrong (m, l, acc). Tile i's l and acc are sums of exp(score - m_i), each against its own "
                    "maximum; before adding the two, put both against the same maximum. By what factor does a sum "
                    "of exp(s - m_i) change when m_i is replaced by a larger m? (One factor a row: broadcast it "
                    "over acc's columns.)",
           "unwritten": "NaN in the result. A tile whose keys a row cannot see has m_i = -inf and l_i = 0, acc_i = "
                        "0; where both tiles are hidden from a row, the common maximum is -inf too, and -inf - "
                        "(-inf) is NaN. Such a row must come out as m = -inf, l = 0, acc = 0."})


def causal_tile_plan(seq_len: int, block_m: int, block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Solution of 05.2: for each (query tile, key tile), whether a causal kernel must visit it, and
    whether it needs the mask (it holds both allowed and hidden pairs)."""
    n_m, n_n = -(-seq_len // block_m), -(-seq_len // block_n)
    first_q = torch.arange(n_m)[:, None] * block_m
    last_q = torch.clamp(first_q + block_m - 1, max=seq_len - 1)
    first_k = torch.arange(n_n)[None, :] * block_n
    last_k = torch.clamp(first_k + block_n - 1, max=seq_len - 1)
    visit = first_k <= last_q  # some key in the tile is at or before some query
    return visit, visit & (last_k > first_q)  # ...and some key after some query: mask needed


def _tile_reference(seq_len: int, block_m: int, block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Brute force: the causal mask of every (query, key) pair, cut into tiles."""
    allowed = torch.arange(seq_len)[None, :] <= torch.arange(seq_len)[:, None]
    n_m, n_n = -(-seq_len // block_m), -(-seq_len // block_n)
    visit, partial = torch.zeros(n_m, n_n, dtype=torch.bool), torch.zeros(n_m, n_n, dtype=torch.bool)
    for i in range(n_m):
        for j in range(n_n):
            tile = allowed[i * block_m:(i + 1) * block_m, j * block_n:(j + 1) * block_n]
            visit[i, j], partial[i, j] = tile.any(), tile.any() and not tile.all()
    return visit, partial


CAUSAL_TILES = CodeCheck(
    "05.2", "causal_tile_plan(seq_len, block_m, block_n) -> (visit, needs_mask): which tiles a causal kernel runs",
    solution=causal_tile_plan, make_inputs=lambda case, generator: case.params["args"], reference=_tile_reference,
    cases=[Case(f"S={s}, tiles {bm} x {bn}", torch.bool, {"args": (s, bm, bn)})
           for s, bm, bn in ((37, 16, 16), (100, 32, 16), (64, 16, 32), (33, 16, 16), (130, 64, 32), (5, 16, 16))],
    out_dtypes=lambda case: (torch.bool, torch.bool),
    hints={"value": "Wrong tiles (the error is the fraction of tiles that differ). Query q may see key k when "
                    "k <= q (the diagonal is allowed). Compare positions, not tile indices (block_m and block_n "
                    "may differ): a tile is visited if its first key <= its last query, and needs the mask if "
                    "also its last key > its first query. The last tiles end at seq_len - 1, not at their edge.",
           "dtype": "Return two bool tensors (comparisons give bool; do not convert to int)."})


def _naive_memory() -> tuple[float, str]:
    saved = results.load("flash_attention", gpu="h200")
    shape = {"B": 16, "H": 32, "S": 1024, "D": 64}
    row = saved.where(impl="naive", causal=False, status="ok", **{"pass": "fwd"}, **shape)[0]
    scores = shape["B"] * shape["H"] * shape["S"] ** 2 * 2
    return row["peak_mem_bytes"] / 1e9, (
        f"results/h200/flash_attention.json ({saved.describe()}): the standard attention's forward held "
        f"{row['peak_mem_bytes'] / 1e9:.2f} GB above its inputs. One S x S bf16 matrix for all B x H heads is "
        f"{scores / 1e9:.2f} GB; the forward keeps two (the scores and the probabilities), plus the output")


NAIVE_MEMORY = NumberCheck("05.3", "GB the standard attention's forward held at its peak, B=16, H=32, S=1024, "
                           "D=64, bf16, on the H200", _naive_memory, tolerance=0.15, relative=True, unit="GB")

@triton.jit
def _flash_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, S_q, S_k, scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)  # which (batch, head) pair
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # the query positions of this program
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    q_rows = bh * S_q * D + rows[:, None] * D + dims[None, :]
    q = tl.load(q_ptr + q_rows, mask=rows[:, None] < S_q, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # the running maximum of each row's scores
    l = tl.zeros([BLOCK_M], tl.float32)  # the running sum of exp(score - m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)  # the running sum of exp(score - m) * v
    for start in range(0, S_k, BLOCK_N):
        keys = start + cols
        kv_rows = bh * S_k * D + keys[:, None] * D + dims[None, :]
        k = tl.load(k_ptr + kv_rows, mask=keys[:, None] < S_k, other=0.0)
        v = tl.load(v_ptr + kv_rows, mask=keys[:, None] < S_k, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        visible = keys[None, :] < S_k
        if CAUSAL:  # aligned to the bottom-right corner: query i sees key j <= i + S_k - S_q
            visible = visible & (keys[None, :] <= rows[:, None] + S_k - S_q)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: no NaN
        p = tl.exp(s - shift[:, None])
        alpha = tl.exp(m - shift)  # rescales the sums kept against the old maximum
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]  # a row that sees no key at all comes out 0
    tl.store(o_ptr + q_rows, out.to(o_ptr.dtype.element_ty), mask=rows[:, None] < S_q)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  block_m: int = 16, block_n: int = 16) -> torch.Tensor:
    """Solution of 05.4: ``softmax(q k^T / sqrt(D) [+ causal mask]) v`` for contiguous q (B, H, S_q, D) and
    k, v (B, H, S_k, D), D a power of two >= 16; one program a tile of ``block_m`` queries of one (batch, head),
    streaming ``block_n`` keys at a time. Causal: query i sees key j <= i + S_k - S_q; a query that sees no key
    (S_q > S_k) gets 0."""
    B, H, S_q, D = q.shape
    o = torch.empty_like(q)
    grid = (triton.cdiv(S_q, block_m), B * H)
    _flash_forward_kernel[grid](q, k, v, o, S_q, k.shape[2], D ** -0.5, CAUSAL=bool(causal), D=D,
                                BLOCK_M=block_m, BLOCK_N=block_n)
    return o


def _attention_inputs(case: Case, generator: torch.Generator) -> tuple:
    B, H, S_q, S_k, D = case.params["shape"]
    q, k, v = (2 * torch.randn(B, H, s, D, generator=generator) for s in (S_q, S_k, S_k))  # scores of a few units
    return (*(on_device(t.to(case.dtype)) for t in (q, k, v)), case.params["causal"])


def _attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Standard attention in float64, the same conventions: a bottom-right causal mask, 0 for a row with no key."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    S_q, S_k = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        hidden = torch.arange(S_k)[None, :] > torch.arange(S_q)[:, None] + S_k - S_q
        s = s.masked_fill(hidden, -float("inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v  # a row of -inf only: softmax gives NaN, the kernel 0


def _attention_label(B: int, H: int, S_q: int, S_k: int, D: int, causal: bool) -> str:
    empty = f", first {S_q - S_k} rows see no key" if causal and S_q > S_k else ""
    return f"B={B} H={H} S_q={S_q} S_k={S_k} D={D}{' causal' if causal else ''}{empty}"


FLASH_FORWARD = CodeCheck(
    "05.4", "flash_forward(q, k, v, causal) -> o: a FlashAttention forward in Triton, one program a query tile",
    solution=flash_forward, make_inputs=_attention_inputs, reference=_attention_reference,
    cases=[Case(_attention_label(*shape, causal), dtype, {"shape": shape, "causal": causal})
           for shape, causal, dtype in device.pick(
               full=[((2, 3, 200, 200, 64), False, torch.float16), ((2, 3, 200, 200, 64), True, torch.bfloat16),
                     ((1, 4, 77, 300, 128), True, torch.float16), ((3, 2, 150, 61, 64), True, torch.bfloat16),
                     ((3, 2, 150, 61, 64), False, torch.float16)],
               smoke=[((1, 2, 37, 37, 16), False, torch.float32), ((2, 1, 37, 37, 16), True, torch.float16),
                      ((1, 2, 20, 45, 16), True, torch.float32), ((2, 1, 40, 19, 16), True, torch.float32),
                      ((1, 2, 40, 19, 16), False, torch.float16)])],  # no bfloat16: the interpreter's tl.dot
    out_dtypes=lambda case: (case.dtype,),
    hints={"value": "Wrong values. Scores are q k^T / sqrt(D). Keys at or past S_k must weigh nothing: -inf "
                    "before the maximum, not 0. Causal: which keys may query i see when S_k != S_q? Each tile, "
                    "l and acc were summed against the old maximum: by what factor do they change when it grows "
                    "(section 2's loop)? And divide acc by l once, after the loop.",
           "unwritten": "NaN in the result. Either some outputs were never written (the grid must be "
                        "(cdiv(S_q, BLOCK_M), B * H), each program storing its rows below S_q), or a row that has "
                        "seen no key yet: its maximum is -inf, and exp(-inf - (-inf)) is NaN (guard the exp); a row "
                        "that sees no key at all must come out 0, not 0 / 0.",
           "raised": "Your function raised: read the message. tl.dot needs tiles whose sides are all at least 16 "
                     "(BLOCK_M, BLOCK_N and D), and two operands of one dtype: the probabilities are float32, V "
                     "may be float16 (`p.to(v.dtype)`). tl.trans(k) turns a (BLOCK_N, D) tile into (D, BLOCK_N). "
                     "On the CPU the interpreter runs tl.dot on float32 and float16 only (not bfloat16).",
           "dtype": "Return q's dtype: accumulate in float32, then `.to(o_ptr.dtype.element_ty)` in the store."})

CHECKS = (COMBINE, CAUSAL_TILES, NAIVE_MEMORY, FLASH_FORWARD)
