"""Exercise 07.5, Llama's rotary embedding of q and k in Triton: its check fails the kernels a learner plausibly
writes wrong (each a real Triton kernel, one switch away from the solution), its cases hold what the task claims,
its reference is transformers' apply_rotary_pos_emb, the notebook's cells run alone after a restart, and the
skeleton filled in as the task asks passes."""
import pytest
import torch

import helpers  # noqa: F401  (before triton: switches it to the interpreter without a GPU)
import triton
import triton.language as tl
from helpers.exercises import CHECKS, ex07
from helpers.results import REPO_ROOT
from exercise_cells import checked, run_exercise, shared_bytes_on_sm90

NOTEBOOK = REPO_ROOT / "notebooks" / "07_kernels_at_work.ipynb"
CHECK = CHECKS["07.5"]


@triton.jit
def _switched_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, seq_len, start, HALF: tl.constexpr, BLOCK_S: tl.constexpr,
                     HALVES: tl.constexpr, SIGN: tl.constexpr, OFFSET: tl.constexpr):
    """The solution's kernel with each part behind a switch (all on: the solution)."""
    head = tl.program_id(0)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = (s < seq_len)[:, None]
    pos = s
    if OFFSET:
        pos = start + s
    if HALVES:  # element i with element i + D/2, both at frequency i
        d = tl.arange(0, HALF)
        first = d
        stride = HALF
    else:  # Meta's original convention: element 2i with element 2i + 1, at frequency i
        d = tl.arange(0, HALF)
        first = 2 * d
        stride = 1
    x_offs = (head * seq_len + s)[:, None] * (2 * HALF) + first[None, :]
    t_offs = pos[:, None] * (2 * HALF) + d[None, :]
    x1 = tl.load(x_ptr + x_offs, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_offs + stride, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + t_offs, mask=ok, other=0.0)
    sn = tl.load(sin_ptr + t_offs, mask=ok, other=0.0)
    if not SIGN:  # the rotation the other way: rotate_half(x) taken as (x2, -x1)
        sn = -sn
    tl.store(y_ptr + x_offs, (x1 * c - x2 * sn).to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + x_offs + stride, (x2 * c + x1 * sn).to(y_ptr.dtype.element_ty), mask=ok)


def switched(grid_of_one=False, rotate_k=True, **switches):
    """``rope`` with some switches off (a planted bug), launched as a grid of one program, or leaving k as it is."""
    flags = {"HALVES": True, "SIGN": True, "OFFSET": True, **switches}

    def answer(q, k, cos, sin, start):
        rotated = []
        for x in (q, k) if rotate_k else (q,):
            b, h, s, d = x.shape
            y = torch.empty_like(x)
            grid = (1, 1) if grid_of_one else (b * h, triton.cdiv(s, 4))
            _switched_kernel[grid](x, cos, sin, y, s, start, HALF=d // 2, BLOCK_S=4, **flags)
            rotated.append(y)
        return rotated[0], rotated[1] if rotate_k else k.clone()
    return answer


def test_the_switched_kernel_with_every_switch_on_passes():
    """So that each planted failure below comes from its one switch."""
    passed, out = checked(CHECK, switched())
    assert passed, out


@pytest.mark.parametrize("planted, kind", [
    (switched(HALVES=False), "value"),
    (switched(SIGN=False), "value"),
    (switched(OFFSET=False), "value"),
    (switched(rotate_k=False), "value"),
    (switched(grid_of_one=True), "unwritten"),
], ids=["pairs (2i, 2i + 1)", "sign of sin", "positions from 0", "k not rotated", "grid of one program"])
def test_check_fails_a_planted_kernel(planted, kind):
    passed, out = checked(CHECK, planted)
    assert not passed and f"- {kind}: " in out, out


def test_cases_hold_what_the_task_claims():
    shapes = [case.params["shape"] for case in CHECK.cases]
    for b, h, h_kv, s, d, start in shapes:
        assert s % 2 and h % 2 and start > 0, "even tokens or heads, or positions from 0"
        assert h_kv <= h and h % h_kv == 0 and d & (d - 1) == 0
    assert any(triton.cdiv(s, ex07.ROPE_BLOCK_S) >= 2 and b * h_kv >= 2 for b, h, h_kv, s, d, start in shapes), \
        "no case needs several programs on both axes, for q and for k"
    assert any(s % ex07.ROPE_BLOCK_S and s > ex07.ROPE_BLOCK_S for b, h, h_kv, s, d, start in shapes)
    assert any(h_kv < h for b, h, h_kv, s, d, start in shapes), "no case where k has fewer heads than q"
    assert {case.dtype for case in CHECK.cases} == {torch.float32, torch.bfloat16}


def test_tables_and_reference_are_transformers():
    """rope_tables and the reference agree with transformers' Llama rotary embedding and apply_rotary_pos_emb."""
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    d, start, s = 32, 20, 9
    config = LlamaConfig(hidden_size=4 * d, num_attention_heads=4, max_position_embeddings=64)
    q, k = torch.randn(2, 4, s, d, dtype=torch.float64), torch.randn(2, 1, s, d, dtype=torch.float64)
    positions = (start + torch.arange(s))[None, :]
    cos_t, sin_t = LlamaRotaryEmbedding(config)(q.float(), positions)
    cos, sin = ex07.rope_tables(start + s, d)
    torch.testing.assert_close(cos[start:], cos_t[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[start:], sin_t[0], rtol=0, atol=1e-6)
    want = apply_rotary_pos_emb(q, k, cos[None, start:].double(), sin[None, start:].double())
    for got, expected in zip(CHECK.reference(q, k, cos, sin, start), want):
        torch.testing.assert_close(got, expected)


def test_solution_is_the_modules_function():
    assert CHECK.solution is ex07.rope


def test_solution_compiles_for_the_gpu():
    """The readable kernel through Triton's compiler for sm_90, on this CPU (the check runs it on a GPU at full
    scale)."""
    args = "dict(x_ptr=b, cos_ptr=f, sin_ptr=f, y_ptr=b, seq_len=129, start=300, HALF=64, BLOCK_S=ex07.ROPE_BLOCK_S)"
    assert shared_bytes_on_sm90("ex07._rope_kernel", args) >= 0


FILLED = {  # what a learner writes for each TODO of the skeleton, as the task and the comments ask
    "ok = ...": "ok = (s < seq_len)[:, None]",
    "x_offs = ...": "x_offs = (head * seq_len + s)[:, None] * (2 * HALF) + d[None, :]",
    "t_offs = ...": "t_offs = (start + s)[:, None] * (2 * HALF) + d[None, :]",
    "# TODO: load": "x1 = tl.load(x_ptr + x_offs, mask=ok, other=0.0).to(tl.float32); "
                    "x2 = tl.load(x_ptr + x_offs + HALF, mask=ok, other=0.0).to(tl.float32); "
                    "c = tl.load(cos_ptr + t_offs, mask=ok, other=0.0); "
                    "sn = tl.load(sin_ptr + t_offs, mask=ok, other=0.0)",
    "# TODO: store": "tl.store(y_ptr + x_offs, (x1 * c - x2 * sn).to(y_ptr.dtype.element_ty), mask=ok); "
                     "tl.store(y_ptr + x_offs + HALF, (x2 * c + x1 * sn).to(y_ptr.dtype.element_ty), mask=ok)",
    "raise NotImplementedError": "",
    "# TODO: launch": "rope_kernel[(b * h, triton.cdiv(s, BLOCK_S))](x, cos, sin, y, s, start, HALF=d // 2, "
                      "BLOCK_S=BLOCK_S)",
}


def test_skeleton_filled_in_passes():
    assert "07.5: correct on all" in run_exercise(NOTEBOOK, "07.5", FILLED)
