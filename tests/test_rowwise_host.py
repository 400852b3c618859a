"""helpers.kernels.rowwise: its host arithmetic (the same grid sizes as Triton's own helpers, without their cost), the
launch rule the row-wise kernels fall back on, and the kernel that adds partial column sums."""
import helpers  # noqa: F401  (first: without a GPU it switches Triton to its interpreter before Triton is imported)
import pytest
import torch
import triton
from helpers.kernels.rowwise import (MAX_BLOCK_BWD, MAX_BLOCK_FWD, backward_rule, cdiv, forward_rule, next_power_of_2,
                                     sum_partials)

DEV = helpers.DEVICE


def test_cdiv_and_next_power_of_2_match_triton():
    for a in (0, 1, 2, 3, 63, 64, 65, 4095, 4096, 4097, 32768, 100_003):
        assert next_power_of_2(a) == triton.next_power_of_2(a), a
        for b in (1, 2, 3, 64, 132 * 16):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_rule_launches():
    """~16 elements a thread forward, ~8 backward; a few programs per SM; the widest blocks are the caps."""
    for block in (1, 16, 128, 1024, 4096, MAX_BLOCK_BWD, MAX_BLOCK_FWD):
        fwd = forward_rule(block)
        assert (fwd.block_n, fwd.stages, fwd.prefetch) == (block, 1, True)
        assert fwd.num_warps == max(1, min(16, block * fwd.rows // 512)) and 2 <= fwd.programs_per_sm <= 8
        if block <= MAX_BLOCK_BWD:
            bwd = backward_rule(block)
            assert bwd.block_n == block and bwd.programs_per_sm == 2
            assert bwd.num_warps == max(4, min(16, block * bwd.rows // 256))
    assert forward_rule(1024).rows == 1 and forward_rule(128).rows == 8 and backward_rule(1024).rows == 2


@pytest.mark.parametrize("k, p, n", [(1, 1, 1), (1, 33, 300), (3, 5, 257), (3, 70, 1000)])
def test_sum_partials_adds_each_set_of_partial_rows(k, p, n, poisoned):
    """out[k] = part[k].sum(0), every column written (integers: exact in any order), into K rows or one."""
    part = torch.randint(-1000, 1000, (k, p, n)).float().to(DEV)
    out = torch.empty(k, n, device=DEV)
    sum_partials(part, out, p, n)
    assert torch.equal(out, part.sum(1))
    if k == 1:  # RMSNorm's case: one set of partial rows (P, N) into one vector (N,)
        vec = torch.empty(n, dtype=torch.float16, device=DEV)
        sum_partials(part[0], vec, p, n)
        assert torch.equal(vec, part[0].sum(0).half())
