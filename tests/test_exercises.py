"""The exercises' checks: every solution passes, planted wrong answers fail, skeletons are "not attempted",
every notebook 01-09 carries at least two of them, and 00 those it has."""
import json
import re
from pathlib import Path

import pytest
import torch
from exercise_cells import exercise_cells, notebook_of, run_exercise

import helpers  # noqa: F401  (before triton: switches it to the interpreter without a GPU)
import triton
import triton.language as tl
from helpers.exercises import CHECKS, CodeCheck, NumberCheck, ex01, ex02, ex04, ex05, ex07, ex09
from helpers.exercises.checks import Verdict

ROOT = Path(__file__).resolve().parents[1]
CODE_IDS = sorted(i for i, c in CHECKS.items() if isinstance(c, CodeCheck))
NUMBER_IDS = sorted(i for i, c in CHECKS.items() if isinstance(c, NumberCheck))


def scaled(fn, factor=1.01):
    """``fn`` with every tensor it returns multiplied by ``factor`` (a result off by 1%)."""
    def answer(*args):
        out = fn(*args)
        return out * factor if isinstance(out, torch.Tensor) else tuple(t * factor for t in out)
    return answer


# --- planted bugs, two or more for each code exercise ------------------------------------------------

@triton.jit
def _row_sum_off_by_one(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + tl.program_id(0) * n_cols + cols, mask=cols < n_cols - 1, other=0.0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(x.to(tl.float32), axis=0))


def row_sum_off_by_one(x):
    out = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
    _row_sum_off_by_one[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


@triton.jit
def _softmax_store_off_by_one(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    base = tl.program_id(0) * n_cols
    x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + base + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=cols < n_cols - 1)


def softmax_store_off_by_one(x):
    out = torch.empty_like(x)
    _softmax_store_off_by_one[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def softmax_pads_with_zero(x):
    """Masked lanes as 0 instead of -inf: each adds exp(0 - max) to the sum (the torch equivalent)."""
    n = x.shape[1]
    padded = torch.cat([x.float(), torch.zeros(x.shape[0], triton.next_power_of_2(n) - n, device=x.device)], dim=1)
    e = torch.exp(padded - padded.max(dim=1, keepdim=True).values)
    return (e / e.sum(dim=1, keepdim=True))[:, :n].to(x.dtype)


def softmax_without_max(x):
    e = torch.exp(x.float())
    return (e / e.sum(dim=1, keepdim=True)).to(x.dtype)


def bias_gelu_bias_by_row(x, bias):
    return torch.nn.functional.gelu(x.float() + bias.float().repeat(x.shape[0] // bias.numel() + 1)[:x.shape[0], None]
                                    ).to(x.dtype)


def bias_gelu_missing_bias(x, bias):
    return torch.nn.functional.gelu(x.float()).to(x.dtype)


def combine_without_rescaling_acc(m1, l1, acc1, m2, l2, acc2):
    m, l, _ = ex05.combine_states(m1, l1, acc1, m2, l2, acc2)
    return m, l, acc1 + acc2


def combine_inverted_factor(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m - m1), torch.exp(m - m2)
    return m, a1 * l1 + a2 * l2, a1[:, None] * acc1 + a2[:, None] * acc2


def combine_naive_shift(m1, l1, acc1, m2, l2, acc2):
    """The textbook rescaling, right wherever some tile sees a key: NaN in a row that neither tile sees."""
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a1 * l1 + a2 * l2, a1[:, None] * acc1 + a2[:, None] * acc2


def bias_gelu_one_program(x, bias):
    """A kernel whose grid is one program of 1,024 elements: right only while x fits one block."""
    out = ex04.bias_gelu(x, bias)
    out.view(-1)[1024:] = float("nan")
    return out


def tiles_by_index(seq_len, block_m, block_n):
    """Tile (i, j) visited when j <= i, masked when j == i: right only when block_m == block_n."""
    n_m, n_n = -(-seq_len // block_m), -(-seq_len // block_n)
    i, j = torch.arange(n_m)[:, None], torch.arange(n_n)[None, :]
    return j <= i, j == i


def tiles_ignore_sequence_end(seq_len, block_m, block_n):
    n_m, n_n = -(-seq_len // block_m), -(-seq_len // block_n)
    first_q, first_k = torch.arange(n_m)[:, None] * block_m, torch.arange(n_n)[None, :] * block_n
    visit = first_k <= first_q + block_m - 1
    return visit, visit & (first_k + block_n - 1 > first_q)


def nf4_low_nibble_first(packed, code, absmax, blocksize):
    q = torch.stack((packed & 15, packed >> 4), dim=1).flatten().long()
    return code[q] * absmax.repeat_interleave(blocksize)


def nf4_block_of_byte(packed, code, absmax, blocksize):
    q = torch.stack((packed >> 4, packed & 15), dim=1).flatten().long()
    byte_block = torch.arange(packed.numel(), device=packed.device) // blocksize
    return code[q] * absmax[byte_block].repeat_interleave(2)


def write_kv_next_position(k_cache, v_cache, k, v, pos):
    return ex07.write_kv(k_cache, v_cache, k, v, (pos + 1) % k_cache.shape[2])


def write_kv_read_on_the_host(k_cache, v_cache, k, v, pos):
    """Right values, but the position read on the host: a CUDA graph would replay the first step's forever."""
    k_cache[:, :, pos.item()] = k[:, :, 0]
    v_cache[:, :, pos.item()] = v[:, :, 0]
    return k_cache, v_cache


def write_kv_swapped(k_cache, v_cache, k, v, pos):
    return ex07.write_kv(k_cache, v_cache, v, k, pos)


def write_kv_new_tensors(k_cache, v_cache, k, v, pos):
    return ex07.write_kv(k_cache.clone(), v_cache.clone(), k, v, pos)


def gather_pages_in_pool_order(pages, table_row, length):
    """Pages 0, 1, ... as if the table were the identity: right only when pages are handed out in order."""
    return ex09.gather_request(pages, torch.arange(table_row.numel(), device=table_row.device), length)


def gather_strided_view(pages, table_row, length):
    """The right values as a view whose strides are not a contiguous tensor's (the task asks for one tensor)."""
    return ex09.gather_request(pages, table_row, length).transpose(1, 2).contiguous().transpose(1, 2)


def gather_heads_not_moved(pages, table_row, length):
    """The pages joined without putting the heads first: heads and positions mixed up."""
    used = pages[table_row[:-(-length // pages.shape[2])].long()]
    return used.reshape(pages.shape[1], -1, pages.shape[3])[:, :length]


def gather_every_table_entry(pages, table_row, length):
    """Every entry of the table gathered, then cut: reads the entry past the length, which is no page."""
    every = pages[table_row.long()].permute(1, 0, 2, 3)
    return every.reshape(pages.shape[1], -1, pages.shape[3])[:, :length]


def _matmul_launch(a, b, grid, k):
    """The solution's kernel (32 x 32 x 16 tiles) launched on ``grid``, multiplying only the first ``k`` of K."""
    c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype)
    ex02._matmul_kernel[grid](a[:, :k].contiguous(), b[:k].contiguous(), c, a.shape[0], b.shape[1], k,
                              **ex02.MATMUL_BLOCKS)
    return c


def matmul_one_program(a, b):
    return _matmul_launch(a, b, (1, 1), a.shape[1])


def matmul_grid_axes_swapped(a, b):
    """The tiles of N counted on axis 0, which the kernel reads as C's rows."""
    return _matmul_launch(a, b, (triton.cdiv(b.shape[1], 32), triton.cdiv(a.shape[0], 32)), a.shape[1])


def matmul_k_tail_dropped(a, b):
    """A loop over K // BLOCK_K full tiles, with no K mask: the partial last tile never counts."""
    return _matmul_launch(a, b, (triton.cdiv(a.shape[0], 32), triton.cdiv(b.shape[1], 32)), a.shape[1] // 16 * 16)


def matmul_accumulator_overwritten(a, b):
    """`acc = tl.dot(a, b)` in the loop: only the last K tile is left (the torch equivalent)."""
    last = (a.shape[1] - 1) // 16 * 16
    return (a[:, last:].float() @ b[last:].float()).to(a.dtype)


def flash_unguarded_exp(q, k, v, causal):
    """The textbook exp(s - m) against each row's maximum: NaN in a row that sees no key, where m = -inf."""
    S_q, S_k = q.shape[2], k.shape[2]
    s = q.double() @ k.double().transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        hidden = torch.arange(S_k, device=q.device) > torch.arange(S_q, device=q.device)[:, None] + S_k - S_q
        s = s.masked_fill(hidden, -float("inf"))
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return (p @ v.double() / p.sum(dim=-1, keepdim=True)).to(q.dtype)


def flash_one_program(q, k, v, causal):
    """The solution's kernel launched as a grid of one program: the first tile of queries of the first head."""
    o = torch.empty_like(q)
    ex05._flash_forward_kernel[(1, 1)](q, k, v, o, q.shape[2], k.shape[2], q.shape[-1] ** -0.5, CAUSAL=bool(causal),
                                       D=q.shape[-1], BLOCK_M=16, BLOCK_N=16)
    return o


def layernorm_backward_one_program(x, w, mean, rstd, dy, rows_per_program):
    """A grid of one program: its rows' dx and partial sums only, the other rows of dx never written."""
    r = rows_per_program
    dx, dw, db = ex04.layernorm_backward(x[:r], w, mean[:r], rstd[:r], dy[:r], r)
    return torch.cat([dx, torch.full_like(x[r:], float("nan"))]), dw, db


def layernorm_backward_means_over_block(x, w, mean, rstd, dy, rows_per_program):
    """dx's two row means taken over the padded block of next_power_of_2(N) lanes, not the N columns."""
    xhat = (x.float() - mean[:, None]) * rstd[:, None]
    wdy, block = w.float() * dy.float(), triton.next_power_of_2(x.shape[1])
    dx = rstd[:, None] * (wdy - wdy.sum(1, keepdim=True) / block - xhat * (wdy * xhat).sum(1, keepdim=True) / block)
    return dx.to(x.dtype), (dy.float() * xhat).sum(0).to(w.dtype), dy.float().sum(0).to(w.dtype)


def layernorm_backward_first_partial_only(x, w, mean, rstd, dy, rows_per_program):
    """The host takes the first program's partial row as dw and db instead of adding all of them."""
    r = rows_per_program
    _, dw, db = ex04.layernorm_backward(x[:r], w, mean[:r], rstd[:r], dy[:r], r)
    return ex04.layernorm_backward(x, w, mean, rstd, dy, r)[0], dw, db


def paged_pages_in_pool_order(q, k_pages, v_pages, block_table, lengths):
    """Page p of request b read as pool page b * W + p, as if each request held adjacent pages: the table ignored."""
    b, w = block_table.shape
    in_order = torch.arange(b * w, dtype=block_table.dtype, device=block_table.device).view(b, w)
    return ex09.paged_attention(q, k_pages, v_pages, in_order, lengths)


def paged_no_length_mask(q, k_pages, v_pages, block_table, lengths):
    """Every row of the last page read and scored, as if each length were a whole number of pages."""
    page = k_pages.shape[2]
    return ex09.paged_attention(q, k_pages, v_pages, block_table, (lengths + page - 1) // page * page)


def paged_one_program(q, k_pages, v_pages, block_table, lengths):
    """The solution's kernel launched as a grid of one program: request 0's query head 0 only."""
    out = torch.empty_like(q)
    ex09._paged_attention_kernel[(1, 1)](q, k_pages, v_pages, block_table, lengths, out, q.shape[1], k_pages.shape[1],
                                         block_table.shape[1], q.shape[3] ** -0.5, PAGE=k_pages.shape[2],
                                         HEAD_DIM=q.shape[3])
    return out


def rms_norm_one_program(x, w, eps, rows_per_program):
    """The solution's kernel launched as a grid of one program: the first rows_per_program rows only."""
    y = torch.empty_like(x)
    ex07._rms_norm_kernel[(1,)](x, w, y, x.shape[0], x.shape[1], eps, ROWS=rows_per_program,
                                BLOCK_N=triton.next_power_of_2(x.shape[1]))
    return y


def rms_norm_mean_over_block(x, w, eps, rows_per_program):
    """The sum of squares divided by the padded block's next_power_of_2(N) lanes, not by N."""
    mean = x.float().pow(2).sum(dim=1, keepdim=True) / triton.next_power_of_2(x.shape[1])
    return (x.float() * torch.rsqrt(mean + eps) * w.float()).to(x.dtype)


def rms_norm_padding_unmasked(x, w, eps, rows_per_program):
    """Padding lanes not masked: a row's lanes past N load the next row's first elements (0 past the end of x)."""
    m, n = x.shape
    block = triton.next_power_of_2(n)
    flat = torch.cat([x.float().flatten(), torch.zeros(block, device=x.device)])
    lanes = flat[torch.arange(m, device=x.device)[:, None] * n + torch.arange(block, device=x.device)[None, :]]
    return (x.float() * torch.rsqrt(lanes.pow(2).sum(dim=1, keepdim=True) / n + eps) * w.float()).to(x.dtype)


def rms_norm_eps_outside_sqrt(x, w, eps, rows_per_program):
    rms = x.float().pow(2).mean(dim=1, keepdim=True).sqrt()
    return (x.float() / (rms + eps) * w.float()).to(x.dtype)


def rope_adjacent_pairs(q, k, cos, sin, start):
    """Meta's original convention: element 2i turned with 2i + 1 (by angle i), not with i + D/2."""
    positions = start + torch.arange(q.shape[2], device=q.device)
    c, s = (t[positions, :q.shape[-1] // 2] for t in (cos, sin))
    out = []
    for x in (q, k):
        even, odd = x.float()[..., 0::2], x.float()[..., 1::2]
        out.append(torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2).to(x.dtype))
    return tuple(out)


def rope_one_program(q, k, cos, sin, start):
    """The solution's kernel launched as a grid of one program: the first BLOCK_S tokens of the first head."""
    out = []
    for x in (q, k):
        y = torch.empty_like(x)
        ex07._rope_kernel[(1, 1)](x, cos, sin, y, x.shape[2], start, HALF=x.shape[3] // 2,
                                  BLOCK_S=ex07.ROPE_BLOCK_S)
        out.append(y)
    return tuple(out)


PLANTED = {
    "01.1": [row_sum_off_by_one, lambda x: x.float()[:, :-1].sum(dim=1), lambda x: x.float().sum(dim=1) / x.shape[1]],
    "02.1": [softmax_store_off_by_one, softmax_pads_with_zero, softmax_without_max],
    "02.4": [matmul_one_program, matmul_grid_axes_swapped, matmul_k_tail_dropped, matmul_accumulator_overwritten],
    "04.1": [bias_gelu_bias_by_row, bias_gelu_missing_bias,
             lambda x, b: torch.nn.functional.gelu(x.float() + b.float(), approximate="tanh").to(x.dtype),
             bias_gelu_one_program],
    "04.3": [layernorm_backward_one_program, layernorm_backward_means_over_block,
             layernorm_backward_first_partial_only],
    "05.1": [combine_without_rescaling_acc, combine_inverted_factor, combine_naive_shift],
    "05.2": [tiles_by_index, tiles_ignore_sequence_end],
    "05.4": [flash_unguarded_exp, lambda q, k, v, causal: ex05.flash_forward(q, k, v, False),  # no causal mask
             flash_one_program],
    "07.1": [nf4_low_nibble_first, nf4_block_of_byte],
    "07.2": [write_kv_next_position, write_kv_swapped, write_kv_new_tensors, write_kv_read_on_the_host],
    "07.4": [rms_norm_one_program, rms_norm_mean_over_block, rms_norm_padding_unmasked, rms_norm_eps_outside_sqrt],
    "07.5": [rope_adjacent_pairs, lambda q, k, cos, sin, start: ex07.rope(q, k, cos, -sin, start),  # sign error
             lambda q, k, cos, sin, start: ex07.rope(q, k, cos, sin, 0), rope_one_program],  # positions from 0
    "09.2": [gather_pages_in_pool_order, gather_heads_not_moved, gather_every_table_entry, gather_strided_view],
    "09.3": [paged_pages_in_pool_order, paged_no_length_mask, paged_one_program],
}


def test_every_code_exercise_has_planted_bugs():
    assert sorted(PLANTED) == CODE_IDS
    assert all(len(bugs) >= 2 for bugs in PLANTED.values())


@pytest.mark.parametrize("check_id", sorted(CHECKS))
def test_solution_passes(check_id, capsys):
    check = CHECKS[check_id]
    assert check.check(check.solution).passed is True, capsys.readouterr().out


@pytest.mark.parametrize("check_id", CODE_IDS)
def test_exercise_cells_run_alone_after_a_restart(check_id):
    """A learner who restarts the kernel and runs only an exercise's cells gets "not attempted yet", and helpers
    is imported before triton (without a GPU it switches Triton to its interpreter, which must happen first)."""
    notebook = notebook_of(check_id)
    skeleton, _ = exercise_cells(notebook, check_id)
    if "import triton" in skeleton:
        assert skeleton.index("helpers") < skeleton.index("import triton"), skeleton
    assert f"{check_id}: not attempted yet" in run_exercise(notebook, check_id)


@pytest.mark.gpu
@pytest.mark.parametrize("check_id", CODE_IDS)
def test_solution_compiles_and_passes_on_the_gpu(check_id, capsys):
    """The interpreter runs kernels that a GPU compile refuses (a loop-carried value changing its type, say):
    every code exercise's solution, compiled for this GPU and checked at full scale."""
    test_solution_passes(check_id, capsys)


@pytest.mark.parametrize("check_id", CODE_IDS)
def test_code_check_fails_wrong_answers(check_id, capsys):
    check = CHECKS[check_id]
    for answer in [scaled(check.solution), *PLANTED[check_id]]:
        assert check.check(answer, seed=1).passed is False, f"{getattr(answer, '__name__', answer)} passed"
        out = capsys.readouterr().out
        assert "Hints:" in out and "not yet" in out


@pytest.mark.parametrize("check_id", NUMBER_IDS)
def test_number_check_fails_beyond_tolerance(check_id, capsys):
    check = CHECKS[check_id]
    value = check.solution
    margin = 3 * check.tolerance * (abs(value) if check.relative else 1)
    assert check.check(value + margin).passed is False
    assert check.check(value - margin).passed is False
    assert check.check(float("nan")).passed is False and check.check("12").passed is False
    for other in set(check.choices or ()) - {value}:  # a multiple choice: every other option is wrong
        assert check.check(other).passed is False
    out = capsys.readouterr().out
    assert "How the reference is obtained" in out and "must be" in out


@pytest.mark.parametrize("check_id", sorted(CHECKS))
def test_skeleton_is_not_attempted(check_id, capsys):
    def skeleton(*args):
        raise NotImplementedError("your code here")

    check = CHECKS[check_id]
    answers = [None, skeleton] if isinstance(check, CodeCheck) else [None]
    for answer in answers:
        assert check.check(answer).passed is False
        out = capsys.readouterr().out
        assert "not attempted yet" in out and f"CHECKS[{check_id!r}].solution" in out


@pytest.mark.parametrize("check_id", CODE_IDS)
def test_crash_and_wrong_shape_are_reported(check_id, capsys):
    check = CHECKS[check_id]

    def crashes(*args):
        raise ValueError("shape mismatch in my kernel")

    def wrong_shape(*args):
        out = check.solution(*args)
        return out[0][..., :-1] if isinstance(out, tuple) else out[..., :-1]

    assert check.check(crashes, seed=1).passed is False
    out = capsys.readouterr().out
    assert "raised: ValueError: shape mismatch in my kernel" in out and "Hints:" in out
    assert check.check(wrong_shape, seed=1).passed is False
    out = capsys.readouterr().out
    assert ("shape: output 0 has shape" in out) or ("returned 1 tensors" in out)
    assert check.check(lambda *args: None, seed=1).passed is False and "forget `return`" in capsys.readouterr().out
    assert check.check(42).passed is False and "must be a function" in capsys.readouterr().out


def test_not_implemented_deeper_down_is_a_crash(capsys):
    """A NotImplementedError from something the answer calls is a failure to report, not a skeleton."""
    def unsupported(*args):
        raise NotImplementedError("this op has no CPU kernel")

    assert CHECKS["05.1"].check(lambda *args: unsupported(*args), seed=1).passed is False
    out = capsys.readouterr().out
    assert "raised: NotImplementedError: this op has no CPU kernel" in out and "not attempted" not in out


def test_unwritten_elements_are_caught(capsys):
    """The poisoned outputs make a store that misses the last column fail as "unwritten"."""
    assert CHECKS["02.1"].check(softmax_store_off_by_one, seed=1).passed is False
    assert "unwritten" in capsys.readouterr().out


def test_input_changed_is_caught(capsys):
    def in_place_sum(x):
        out = x.float().sum(dim=1)
        x.zero_()
        return out

    assert CHECKS["01.1"].check(in_place_sum, seed=1).passed is False
    assert "inputs changed" in capsys.readouterr().out


def test_solutions_are_the_modules_functions():
    assert CHECKS["01.1"].solution is ex01.masked_row_sum and CHECKS["02.1"].solution is ex02.softmax_rows
    assert CHECKS["04.1"].solution is ex04.bias_gelu


# --- the notebooks carry the exercises ------------------------------------------------------------

ID_PATTERN = re.compile(r"""CHECKS\[["'](\d\d[a-z]?\.\d+)["']\]""")


def cell_sources(cells: list[dict]) -> str:
    return "\n".join("".join(c["source"]) for c in cells)


def ids_in_notebook(number: str) -> set[str]:
    """The exercise ids a notebook's cells name."""
    folder = ROOT / "notebooks" / ("appendix" if number[-1].isalpha() else "")
    notebook = next(folder.glob(f"{number}_*.ipynb"))
    return set(ID_PATTERN.findall(cell_sources(json.loads(notebook.read_text())["cells"])))


@pytest.mark.parametrize("number", [f"{n:02d}" for n in range(1, 11)])
def test_notebook_has_exercises(number):
    ids = {i for i in ids_in_notebook(number) if i in CHECKS}
    assert len(ids) >= 2, f"notebook {number} names {sorted(ids)} of CHECKS"
    assert all(i.startswith(number + ".") for i in ids)


def test_notebook_00_carries_its_exercises():
    ids = {i for i in CHECKS if i.startswith("00.")}
    assert ids and ids_in_notebook("00") == ids


@pytest.mark.parametrize("number", ["04a", "04b", "05a", "06a", "07a", "07b", "07c"])
def test_appendix_notebook_carries_its_exercise(number):
    ids = {i for i in CHECKS if i.startswith(number + ".")}
    assert ids and ids_in_notebook(number) == ids


def test_every_check_is_in_a_notebook():
    appendix = ["04a", "04b", "05a", "06a", "07a", "07b", "07c"]
    named = set().union(*(ids_in_notebook(n) for n in [f"{n:02d}" for n in range(0, 11)] + appendix))
    assert set(CHECKS) <= named, f"not in any notebook: {sorted(set(CHECKS) - named)}"


def test_a_verdict_shows_no_out_value(capsys):
    """A check cell's last value is the Verdict: IPython shows nothing for it (no stray "Out: False")."""
    from IPython.core.formatters import DisplayFormatter

    verdict = CHECKS["00.1"].check(None)
    capsys.readouterr()
    assert verdict.passed is False and not verdict and verdict == False  # noqa: E712
    assert DisplayFormatter().format(verdict) == ({}, {})
    assert Verdict(True) and Verdict(True) == True and repr(Verdict(True)) == "Verdict(passed=True)"  # noqa: E712
