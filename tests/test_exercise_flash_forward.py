"""Exercise 05.4, the FlashAttention forward: its check fails the kernels a learner plausibly writes wrong (each a
real Triton kernel, one switch away from the solution), its cases hold what the check claims, and its reference
agrees with the course's attention reference where their conventions meet."""
import pytest
import torch

import helpers  # noqa: F401  (before triton: switches it to the interpreter without a GPU)
import triton
import triton.language as tl
from helpers.exercises import CHECKS, ex05
from helpers.kernels.flash_attention import attention_reference
from exercise_cells import checked

CHECK = CHECKS["05.4"]
BLOCK = 16  # the skeleton's BLOCK_M and BLOCK_N


@triton.jit
def _switched_kernel(q_ptr, k_ptr, v_ptr, o_ptr, S_q, S_k, scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GUARD_EXP: tl.constexpr,
                     GUARD_DIV: tl.constexpr, CAUSAL_MASK: tl.constexpr, KEY_MASK: tl.constexpr,
                     RESCALE: tl.constexpr):
    """The solution's kernel with each guard, mask and rescaling behind a switch (all on: the solution)."""
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    q_rows = bh * S_q * D + rows[:, None] * D + dims[None, :]
    q = tl.load(q_ptr + q_rows, mask=rows[:, None] < S_q, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, S_k, BLOCK_N):
        keys = start + cols
        kv_rows = bh * S_k * D + keys[:, None] * D + dims[None, :]
        k = tl.load(k_ptr + kv_rows, mask=keys[:, None] < S_k, other=0.0)
        v = tl.load(v_ptr + kv_rows, mask=keys[:, None] < S_k, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        visible = keys[None, :] < S_k
        if not KEY_MASK:  # the padding keys load as 0 and keep their score
            visible = keys[None, :] >= 0
        if CAUSAL and CAUSAL_MASK:
            visible = visible & (keys[None, :] <= rows[:, None] + S_k - S_q)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        shift = m_new
        if GUARD_EXP:
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - shift[:, None])
        alpha = tl.exp(m - shift)
        if not RESCALE:  # the sums kept against the old maximum are added as they are
            alpha = tl.full([BLOCK_M], 1.0, tl.float32)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    if GUARD_DIV:
        l = tl.where(l == 0.0, 1.0, l)
    tl.store(o_ptr + q_rows, (acc / l[:, None]).to(o_ptr.dtype.element_ty), mask=rows[:, None] < S_q)


def switched(grid_of_one=False, **switches):
    """``flash_forward`` with some switches off (a planted bug), or launched as a grid of one program."""
    flags = {"GUARD_EXP": True, "GUARD_DIV": True, "CAUSAL_MASK": True, "KEY_MASK": True, "RESCALE": True,
             **switches}

    def answer(q, k, v, causal):
        B, H, S_q, D = q.shape
        o = torch.empty_like(q)
        grid = (1, 1) if grid_of_one else (triton.cdiv(S_q, BLOCK), B * H)
        _switched_kernel[grid](q, k, v, o, S_q, k.shape[2], D ** -0.5, CAUSAL=bool(causal), D=D, BLOCK_M=BLOCK,
                               BLOCK_N=BLOCK, **flags)
        return o
    return answer


def test_the_switched_kernel_with_every_switch_on_passes():
    """So that each planted failure below comes from its one switch."""
    passed, out = checked(CHECK, switched())
    assert passed, out


@pytest.mark.parametrize("planted, kind", [
    (switched(GUARD_EXP=False), "unwritten"),  # exp(-inf - (-inf)) in a row that sees no key
    (switched(GUARD_DIV=False), "unwritten"),  # 0 / 0 in the same rows
    (switched(CAUSAL_MASK=False), "value"),
    (switched(KEY_MASK=False), "value"),  # the keys past S_k count with a score of 0
    (switched(RESCALE=False), "value"),
    (switched(grid_of_one=True), "unwritten"),
], ids=["unguarded exp", "unguarded division", "no causal mask", "no mask at the end of K", "no rescaling",
        "grid of one program"])
def test_check_fails_a_planted_kernel(planted, kind):
    passed, out = checked(CHECK, planted)
    assert not passed and f"- {kind}: " in out, out


def test_cases_hold_what_the_check_claims():
    params = [c.params for c in CHECK.cases]
    shapes = [p["shape"] for p in params]
    assert all(D >= 16 and D & (D - 1) == 0 for *_, D in shapes)  # tl.dot's sides; tl.arange's powers of two
    assert all(S_q % BLOCK and S_k % BLOCK for _, _, S_q, S_k, _ in shapes)  # ragged ends, queries and keys
    assert any(triton.cdiv(S_q, BLOCK) > 1 and B * H > 1 for B, H, S_q, _, _ in shapes)  # both grid axes
    assert {p["causal"] for p in params} == {False, True}
    assert any(S_q != S_k for _, _, S_q, S_k, _ in shapes)
    # rows that see no key: causal with S_q > S_k, so that some program holds such rows and visits only
    # tiles fully masked for them
    assert any(p["causal"] and p["shape"][2] > p["shape"][3] for p in params)
    assert torch.float16 in {c.dtype for c in CHECK.cases}  # half-precision V: tl.dot needs p cast to it


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S_q, S_k", [(37, 37), (20, 45)])
def test_reference_is_the_courses_attention(S_q, S_k, causal):
    """Where the conventions meet (S_q <= S_k: every query sees a key), 05.4's reference is the tuned kernel's."""
    q, k, v = (torch.randn(2, 3, s, 16, dtype=torch.float64) for s in (S_q, S_k, S_k))
    torch.testing.assert_close(CHECK.reference(q, k, v, causal), attention_reference(q, k, v, causal=causal))


def test_reference_gives_zero_to_a_row_with_no_key():
    q, k, v = torch.randn(1, 1, 9, 16), torch.randn(1, 1, 4, 16), torch.randn(1, 1, 4, 16)
    out = CHECK.reference(q, k, v, True)
    assert torch.equal(out[..., :5, :], torch.zeros(1, 1, 5, 16, dtype=torch.float64))
    assert (out[..., 5:, :] != 0).all()
    torch.testing.assert_close(out[..., 8:, :], CHECK.reference(q, k, v, False)[..., 8:, :])  # the last sees all


def test_solution_is_the_modules_function():
    assert CHECK.solution is ex05.flash_forward
