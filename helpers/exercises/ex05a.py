"""Exercise of appendix 05a (what limits the course's FlashAttention): the highest share of time the tensor cores
can be busy in a forward that takes turns between the matrix products and the exponentials, at head dim 64."""
from __future__ import annotations

from ..datasheets import EXP2_PER_CLOCK_PER_SM, TENSOR_FLOP_PER_CLOCK_PER_SM
from .checks import NumberCheck

HEAD_DIM = 64


def serial_ceiling(head_dim: int, architecture: str = "Hopper") -> tuple[float, str]:
    """Tensor-core share of a forward that never overlaps its products with its exp2s: T / (T + E) per score."""
    flop, exps = TENSOR_FLOP_PER_CLOCK_PER_SM[architecture], EXP2_PER_CLOCK_PER_SM[architecture]
    tensor, exp2 = 4 * head_dim / flop, 1 / exps  # SM clocks a score: Q K^T and P V (2 x 2D FLOP), one exp2
    share = tensor / (tensor + exp2)
    return share, (f"a score costs the tensor cores 4 x {head_dim} FLOP / {flop:,} FLOP a clock = {tensor:.4f} SM "
                   f"clocks and the exp2 unit 1 / {exps} = {exp2:.4f}; taking turns, the tensor cores are busy "
                   f"{tensor:.4f} / ({tensor:.4f} + {exp2:.4f}) = {share:.2f} of the time")


SERIAL_CEILING = NumberCheck("05a.1", f"the highest share of time the tensor cores can be busy at head dim {HEAD_DIM} "
                             "when products and exp2s take turns (a number between 0 and 1)",
                             lambda: serial_ceiling(HEAD_DIM), tolerance=0.02, relative=False)

CHECKS = (SERIAL_CEILING,)
