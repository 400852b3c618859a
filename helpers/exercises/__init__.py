"""Exercises with automatic checks, one module per notebook (``ex00`` ... ``ex10``, and ``ex04a``, ``ex04b``,
``ex05a``, ``ex06a``, ``ex07a``, ``ex07b``, ``ex07c`` for the appendix).

``CHECKS["04.1"].check(answer)`` prints the cases it tried and returns True or False; ``.solution`` is
the reference answer (a function for code exercises, a number for predictions, with ``.tolerance``).
"""
from . import (ex00, ex01, ex02, ex03, ex04, ex04a, ex04b, ex05, ex05a, ex06, ex06a, ex07, ex07a, ex07b, ex07c,
               ex08, ex09, ex10)
from .checks import CodeCheck, NumberCheck, register

CHECKS: dict[str, CodeCheck | NumberCheck] = {}
for _module in (ex00, ex01, ex02, ex03, ex04, ex04a, ex04b, ex05, ex05a, ex06, ex06a, ex07, ex07a, ex07b, ex07c,
                ex08, ex09, ex10):
    register(CHECKS, *_module.CHECKS)

__all__ = ["CHECKS", "CodeCheck", "NumberCheck"]
