"""helpers.kernels.rowwise's host arithmetic: the same grid sizes as Triton's own helpers, without their cost."""
import helpers  # noqa: F401  (first: without a GPU it switches Triton to its interpreter before Triton is imported)
import triton
from helpers.kernels.rowwise import cdiv, next_power_of_2


def test_cdiv_and_next_power_of_2_match_triton():
    for a in (0, 1, 2, 3, 63, 64, 65, 4095, 4096, 4097, 32768, 100_003):
        assert next_power_of_2(a) == triton.next_power_of_2(a), a
        for b in (1, 2, 3, 64, 132 * 16):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
