"""Exercise 09.3, a decode step over a paged cache: its cases hold what the task says they hold, more wrong kernels
fail, the solution compiles for a GPU, the notebook's cells run alone after a restart, and the skeleton filled in
as the task asks passes the check."""
import math
import time

import helpers  # before triton: switches it to the interpreter without a GPU
import pytest
import torch
import triton
import triton.language as tl
from helpers.exercises import CHECKS
from helpers.kernels.paged_decode_attention import gather_pages
from helpers.results import REPO_ROOT
from exercise_cells import checked, run_exercise, shared_bytes_on_sm90

NOTEBOOK = REPO_ROOT / "notebooks" / "09_serving_paged_attention.ipynb"
CHECK = CHECKS["09.3"]


def drawn(case, seed=0):
    return CHECK.make_inputs(case, torch.Generator().manual_seed(seed))


def test_cases_hold_what_the_task_says():
    lengths, pages = [], []
    for case in CHECK.cases:
        for seed in range(3):
            q, k_pages, _, table, lens = (t.cpu() for t in drawn(case, seed))
            num_pages, hkv, page, d = k_pages.shape
            assert q.shape[0] >= 2 and q.shape[1] >= 2, "a grid of one program in a dimension would pass"
            assert table.dtype == lens.dtype == torch.int32
            assert num_pages >= table.numel(), "request b's pages b * W ... read in pool order: outside the pool"
            assert ((table >= 0) & (table < num_pages)).all(), "an entry past a length must still be a page"
            used = [table[b, :triton.cdiv(n, page)] for b, n in enumerate(lens.tolist())]
            assert len(torch.cat(used).unique()) == sum(u.numel() for u in used), "a page given out twice"
            assert all(table.shape[1] > u.numel() for u in used), "no entry past the length"
            pages.append(torch.cat(used))
            lengths += [(n, page) for n in lens.tolist()]
            for b, n in enumerate(lens.tolist()):  # every score far below exp()'s range in fp32
                keys = gather_pages(k_pages, table[b], n).double().repeat_interleave(q.shape[1] // hkv, 0)
                scores = (q[b].double() @ keys.transpose(-1, -2)) / math.sqrt(d)
                assert scores.max() < math.log(torch.finfo(torch.float32).tiny) - 10
    assert any(n == 1 for n, _ in lengths), "no request of length 1"
    assert any(n % page for n, page in lengths if n > page), "no length that ends mid-page past the first page"
    assert any(n % page == 0 for n, page in lengths), "no length that fills its last page"
    assert not any(torch.equal(p, torch.arange(p.numel())) for p in pages), "pages handed out in pool order"
    # the interpreter truncates bf16: a GPU only
    assert {c.dtype for c in CHECK.cases} == helpers.pick(full={torch.float32, torch.float16, torch.bfloat16},
                                                          smoke={torch.float32, torch.float16})


def test_check_is_quick_on_this_machine(capsys):
    start = time.perf_counter()
    assert CHECK.check(CHECK.solution).passed
    assert time.perf_counter() - start < 30, capsys.readouterr().out


# --- wrong kernels beyond tests/test_exercises.py's planted ones --------------------------------------

MAX_FROM_ZERO, SCORES_NOT_MASKED, NO_RESCALE, HEAD_BY_MODULO = range(4)


@triton.jit
def _paged_attention_bug(Q, KP, VP, TABLE, LENS, OUT, H, HKV, TABLE_WIDTH, scale, PAGE: tl.constexpr,
                         HEAD_DIM: tl.constexpr, BUG: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h % HKV if BUG == HEAD_BY_MODULO else h // (H // HKV)
    rt = tl.arange(0, PAGE)
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (b * H + h) * HEAD_DIM + rd).to(tl.float32)
    length = tl.load(LENS + b)
    m = 0.0 if BUG == MAX_FROM_ZERO else -float("inf")
    l = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for p in range(0, tl.cdiv(length, PAGE)):
        page = tl.load(TABLE + b * TABLE_WIDTH + p).to(tl.int64)
        ok = p * PAGE + rt < length
        rows = (page * HKV + g) * PAGE + rt
        k = tl.load(KP + rows[:, None] * HEAD_DIM + rd[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(VP + rows[:, None] * HEAD_DIM + rd[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[None, :] * k, axis=1) * scale  # masked rows load 0: they score 0
        if BUG != SCORES_NOT_MASKED:
            scores = tl.where(ok, scores, -float("inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp(m - m_new)
        w = tl.exp(scores - m_new)
        l = l * alpha + tl.sum(w, axis=0)
        acc = (acc if BUG == NO_RESCALE else acc * alpha) + tl.sum(w[:, None] * v, axis=0)
        m = m_new
    tl.store(OUT + (b * H + h) * HEAD_DIM + rd, (acc / l).to(OUT.dtype.element_ty))


def with_bug(bug: int):
    def answer(q, k_pages, v_pages, block_table, lengths):
        out = torch.empty_like(q)
        _paged_attention_bug[(q.shape[0], q.shape[1])](
            q, k_pages, v_pages, block_table, lengths, out, q.shape[1], k_pages.shape[1], block_table.shape[1],
            1 / math.sqrt(q.shape[3]), PAGE=k_pages.shape[2], HEAD_DIM=q.shape[3], BUG=bug)
        return out
    return answer


@pytest.mark.parametrize("bug, kind", [(MAX_FROM_ZERO, "unwritten"), (SCORES_NOT_MASKED, "value"),
                                       (NO_RESCALE, "value"), (HEAD_BY_MODULO, "value")])
def test_more_wrong_kernels_fail(bug, kind):
    assert with_bug(-1)(*drawn(CHECK.cases[0])).isfinite().all()  # the kernel without a bug is the solution's
    passed, out = checked(CHECK, with_bug(-1), seed=2)
    assert passed, out
    passed, out = checked(CHECK, with_bug(bug), seed=2)
    assert not passed and f"- {kind}:" in out, out


# --- the solution on a GPU, and the notebook's cells -----------------------------------------------

def test_solution_compiles_for_the_gpu():
    """The readable kernel (loop-carried scalars m and l) through Triton's compiler for sm_90, on this CPU."""
    args = ("dict(Q=b, KP=b, VP=b, TABLE=i, LENS=i, OUT=b, H=32, HKV=8, TABLE_WIDTH=17, scale=0.1, PAGE=16, "
            "HEAD_DIM=128)")
    assert shared_bytes_on_sm90("ex09._paged_attention_kernel", args) >= 0


FILLED = {  # what a learner writes for each TODO of the skeleton, as the task and the comments ask
    "page = ...": "page = tl.load(TABLE + b * TABLE_WIDTH + p).to(tl.int64)",
    "ok = ...": "ok = t < length",
    "rows = ...": "rows = (page * HKV + g) * PAGE + rt",
    "k = ...": "k = tl.load(KP + rows[:, None] * HEAD_DIM + rd[None, :], mask=ok[:, None], other=0.0).to(tl.float32)",
    "v = ...": "v = tl.load(VP + rows[:, None] * HEAD_DIM + rd[None, :], mask=ok[:, None], other=0.0).to(tl.float32)",
    "scores = ...": "scores = tl.where(ok, tl.sum(q[None, :] * k, axis=1) * scale, -float('inf'))",
    "# TODO: the online-softmax": "m_new = tl.maximum(m, tl.max(scores, axis=0)); alpha = tl.exp(m - m_new); "
                                  "w = tl.exp(scores - m_new); l = l * alpha + tl.sum(w, axis=0); "
                                  "acc = acc * alpha + tl.sum(w[:, None] * v, axis=0); m = m_new",
    "# TODO: launch": "paged_attention_kernel[(b, h)](q, k_pages, v_pages, block_table, lengths, out, h, hkv, "
                      "block_table.shape[1], 1 / math.sqrt(d), PAGE=page, HEAD_DIM=d)",
    "#       TABLE_WIDTH": "",
    "raise NotImplementedError": "",
}


def test_skeleton_filled_in_passes():
    assert "09.3: correct on all" in run_exercise(NOTEBOOK, "09.3", FILLED)
