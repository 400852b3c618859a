"""The two kinds of exercise check: code (run the learner's callable on fresh inputs, compare with a float64
reference) and number (compare a prediction with a value computed from shapes, datasheets or results/).

Every check has ``check(answer) -> Verdict`` (true when the answer is right), which prints what it tried
and never raises on a wrong answer, and ``solution``. An answer of ``None``, or a callable that raises
``NotImplementedError`` (the skeleton as shipped), is "not attempted yet": the check says where the solution is
and returns a false Verdict.
"""
from __future__ import annotations

import contextlib
import math
import secrets
import textwrap
import traceback
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .. import device

# The error a result may have against the float64 reference, by the dtype it is stored in: a few
# units of the dtype's rounding (bf16 keeps 8 bits of mantissa, fp16 11, fp32 24).
TOLERANCE: dict[torch.dtype, float] = {torch.bfloat16: 5e-3, torch.float16: 2e-3, torch.float32: 1e-5,
                                       torch.float64: 1e-10}


def truncated_bf16_tolerance(case: Case) -> float:
    """``TOLERANCE``, with bf16's raised to 8e-3 for a kernel that stores bf16 from fp32 through several steps:
    Triton's interpreter truncates that conversion where a GPU rounds to nearest, about doubling the error."""
    return 8e-3 if case.dtype == torch.bfloat16 else TOLERANCE[case.dtype]

DEFAULT_HINTS = {
    "raised": "Your function raised an exception: read its message above, then the shapes and dtypes it was given.",
    "type": "Return a torch.Tensor (or a tuple of them, in the order the task lists).",
    "shape": "Compare the shape you return with the one the task asks for.",
    "dtype": "Return the dtype the task asks for (usually the input's: compute in fp32, store in the input dtype).",
    "device": "Return the result on the device of the inputs.",
    "unwritten": "NaN in the result: some elements were never written (the outputs start as NaN). Check the grid "
                 "covers every element and the store's mask lets every valid lane through.",
    "value": "The values differ from the reference by more than the tolerance.",
    "inputs changed": "Your function changed one of its inputs; compute into a new tensor instead.",
    "not in place": "Write into the tensors you were given (in place) and return them, rather than new tensors.",
    "not contiguous": "Return one contiguous tensor: a permute or a transpose only changes the strides, so call "
                      "`.contiguous()` after it (or build the result with `torch.cat` / `torch.stack`).",
}


class Verdict:
    """A check's outcome: true when the answer is right. As a notebook cell's last value it shows nothing
    (no ``Out: False`` under the check's own printout); ``passed`` is the plain bool."""

    __slots__ = ("passed",)

    def __init__(self, passed: bool) -> None:
        self.passed = bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __eq__(self, other: object) -> bool:
        return self.passed == bool(other) if isinstance(other, (bool, Verdict)) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.passed)

    def __repr__(self) -> str:
        return f"Verdict(passed={self.passed})"

    def _ipython_display_(self) -> None:
        """IPython shows this instead of an ``Out`` value: nothing, since the check printed its verdict."""


class NotAttempted(Exception):
    """Raised inside a check when the answer is still the skeleton."""


def _say_not_attempted(check_id: str, code: bool) -> Verdict:
    handle = f"CHECKS[{check_id!r}]"
    where = (f"The solution is `{handle}.solution` (its source: `inspect.getsource({handle}.solution)`)" if code else
             f"The reference is `{handle}.solution`, and `{handle}.explanation` says how it is obtained")
    print(textwrap.fill(f"{check_id}: not attempted yet. Write your answer in the cell above, run it, then run this "
                        f"cell again. Stuck? {where}, in helpers/exercises/ex{check_id.split('.')[0]}.py.", 116))
    return Verdict(False)


@dataclass
class Case:
    """One set of inputs a code check tries: a label for the table and the dtype under test."""

    label: str
    dtype: torch.dtype
    params: dict = field(default_factory=dict)


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """While active, every float tensor made by ``torch.empty`` or ``torch.empty_like`` starts as NaN,
    so an output element that the answer never writes shows up (as the kernel tests do)."""
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(math.nan) if t.is_floating_point() else t

    torch.empty = lambda *a, **k: nan(empty(*a, **k))
    torch.empty_like = lambda *a, **k: nan(empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def _as_tuple(out: Any) -> tuple | None:
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return tuple(out)
    return None


def _error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``norm(got - ref) / norm(ref)`` in float64, ref's infinities left out of the norm (exact mismatch fraction
    for bool and integer results)."""
    got = got.detach().to("cpu")
    if not ref.is_floating_point():
        return (got != ref).double().mean().item() if got.numel() else 0.0
    got, ref = got.double(), ref.double()
    diff = torch.where(got == ref, 0.0, got - ref)  # equal infinities (a row no key reaches: m = -inf) are exact
    scale = torch.where(torch.isinf(ref), 0.0, ref).norm().item()
    return diff.norm().item() / (scale if scale > 0 else 1.0)


def _raised_by(answer: Callable, error: BaseException) -> bool:
    """Whether ``error`` was raised by ``answer``'s own body (not by something it called)."""
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code is getattr(answer, "__code__", None)


def _learner_line(error: BaseException) -> str:
    """Where in the learner's own code ``error`` was raised: the deepest frame outside the installed
    packages and this package's checks, as " (line N: code)"; empty if there is none."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if "site-packages" not in f.filename and Path(f.filename).parent != Path(__file__).parent]
    return f" (line {frames[-1].lineno}: {(frames[-1].line or '').strip()[:60]})" if frames else ""


class CodeCheck:
    """Runs an answer on every case and compares it with a float64 reference.

    ``make_inputs(case, generator)`` returns the positional arguments (tensors on ``helpers.DEVICE``, or
    plain numbers); ``reference(*args)`` returns the expected results, float64 on the CPU for float
    outputs (a tensor or a tuple); ``dtypes(case)`` the dtype each output must have. ``in_place`` maps an
    output index to the argument index it must be written into; ``contiguous``: every output must be one
    contiguous tensor, not a strided view."""

    def __init__(self, check_id: str, task: str, solution: Callable, make_inputs: Callable, reference: Callable,
                 cases: list[Case], out_dtypes: Callable[[Case], tuple[torch.dtype, ...]],
                 hints: dict[str, str] | None = None, in_place: dict[int, int] | None = None,
                 tolerance: Callable[[Case], float] | None = None, contiguous: bool = False) -> None:
        self.id, self.task, self.solution = check_id, task, solution
        self.make_inputs, self.reference, self.cases, self.out_dtypes = make_inputs, reference, cases, out_dtypes
        self.hints = {**DEFAULT_HINTS, **(hints or {})}
        self.in_place, self.contiguous = in_place or {}, contiguous
        self._tolerance = tolerance or (lambda case: TOLERANCE.get(case.dtype, 0.0))

    def check(self, answer: Callable | None, seed: int | None = None) -> Verdict:
        """Try ``answer`` on every case (fresh random inputs unless ``seed``), print a table and hints."""
        if answer is None:
            return _say_not_attempted(self.id, code=True)
        if not callable(answer):
            print(f"{self.id}: the answer must be a function (a callable), got {type(answer).__name__}.")
            return Verdict(False)
        seed = secrets.randbits(32) if seed is None else seed
        generator = torch.Generator().manual_seed(seed)
        rows, failures = [], []
        for case in self.cases:
            try:
                verdict, error, shape = self._run(answer, case, generator)
            except NotAttempted:
                return _say_not_attempted(self.id, code=True)
            rows.append((case.label, str(case.dtype).replace("torch.", ""), verdict, error, shape))
            if verdict != "pass":
                failures.append(verdict.split(":")[0])
        print(f"{self.id}: {len(rows)} cases, inputs drawn with seed={seed} (pass it to check() to replay them)")
        self._print(rows)
        if failures:
            print("\nHints:")
            for kind in dict.fromkeys(failures):
                print(f"- {kind}: {self.hints.get(kind, DEFAULT_HINTS['value'])}")
            print(f"\n{self.id}: not yet; {len(failures)} of {len(rows)} cases failed.")
            return Verdict(False)
        print(f"\n{self.id}: correct on all {len(rows)} cases.")
        return Verdict(True)

    def _run(self, answer: Callable, case: Case, generator: torch.Generator) -> tuple[str, str, str]:
        args = self.make_inputs(case, generator)
        expected = _as_tuple(self.reference(*args))
        kept = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            with poisoned_allocations():
                out = answer(*args)
        except NotImplementedError as error:
            if _raised_by(answer, error):  # the skeleton's own `raise NotImplementedError`
                raise NotAttempted from None
            return f"raised: NotImplementedError: {error}"[:160] + _learner_line(error), "-", "-"
        except Exception as error:  # the learner's code: report it, do not crash the cell
            message = f"{type(error).__name__}: {error}".splitlines()[0][:160]
            return f"raised: {message}{_learner_line(error)}", "-", "-"
        if out is None:
            return "type: returned None (did you forget `return`?)", "-", "-"
        got = _as_tuple(out)
        if got is None:
            return f"type: returned {type(out).__name__}, not a tensor", "-", "-"
        if len(got) != len(expected):
            return f"type: returned {len(got)} tensors, expected {len(expected)}", "-", "-"
        shapes = ", ".join(str(tuple(t.shape)) for t in got)
        for i, (g, e, dtype) in enumerate(zip(got, expected, self.out_dtypes(case))):
            if tuple(g.shape) != tuple(e.shape):
                return f"shape: output {i} has shape {tuple(g.shape)}, expected {tuple(e.shape)}", "-", shapes
            if g.dtype != dtype:
                return f"dtype: output {i} is {g.dtype}, expected {dtype}", "-", shapes
            if isinstance(args[0], torch.Tensor) and g.device.type != args[0].device.type:
                return f"device: output {i} is on {g.device}, inputs on {args[0].device}", "-", shapes
            if i in self.in_place and g.data_ptr() != args[self.in_place[i]].data_ptr():
                return f"not in place: output {i} is a new tensor", "-", shapes
            if self.contiguous and not g.is_contiguous():
                return f"not contiguous: output {i} is a strided view", "-", shapes
        for j, (before, after) in enumerate(zip(kept, args)):
            if isinstance(before, torch.Tensor) and j not in self.in_place.values() and not torch.equal(before, after):
                return f"inputs changed: argument {j} was modified", "-", shapes
        errors = [_error(g, e) for g, e in zip(got, expected)]
        worst = max(errors)
        text = f"{worst:.1e}"
        if any(g.is_floating_point() and torch.isnan(g).any() and not torch.isnan(e).any()
               for g, e in zip(got, expected)):
            return "unwritten: NaN in the result", "nan", shapes
        tol = self._tolerance(case)
        if not worst <= tol:
            return f"value: error {text} > tolerance {tol:.0e}", text, shapes
        return "pass", text, shapes

    @staticmethod
    def _print(rows: list[tuple[str, str, str, str, str]]) -> None:
        head = ("case", "dtype", "result", "error", "returned shape")
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
        order = (0, 1, 3, 4, 2)  # the result, the longest column, last
        for r in [head, *rows]:
            print("  ".join(r[i].ljust(widths[i]) for i in order).rstrip())


class NumberCheck:
    """A prediction: ``answer`` is a number, compared with ``solution`` (computed when first asked for by
    ``compute() -> (value, explanation)``) within ``tolerance``, absolute or relative. ``choices``: the
    answer must be one of these numbers (a multiple-choice question; ``tolerance`` is then 0.5)."""

    def __init__(self, check_id: str, task: str, compute: Callable[[], tuple[float, str]], tolerance: float,
                 relative: bool, unit: str = "", choices: dict[int, str] | None = None) -> None:
        if tolerance <= 0:
            raise ValueError(f"{check_id}: tolerance must be > 0, got {tolerance}")
        self.id, self.task, self._compute = check_id, task, compute
        self.tolerance, self.relative, self.unit, self.choices = tolerance, relative, unit, choices
        self._value: tuple[float, str] | None = None

    def _solve(self) -> tuple[float, str]:
        if self._value is None:
            self._value = self._compute()
        return self._value

    @property
    def solution(self) -> float:
        """The reference value."""
        return self._solve()[0]

    @property
    def explanation(self) -> str:
        """How the reference value was obtained."""
        return self._solve()[1]

    def allowed(self) -> str:
        """The tolerance in words."""
        if self.choices:
            return "exactly"
        if self.relative:
            return f"within {100 * self.tolerance:g}%"
        return f"within +-{self.tolerance:g} {self.unit}".rstrip()

    def check(self, answer: float | int | None) -> Verdict:
        """Compare ``answer`` with the reference and print the reference, the rule and its derivation."""
        if answer is None:
            return _say_not_attempted(self.id, code=False)
        if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
            print(f"{self.id}: the answer must be a finite number, got {answer!r}.")
            return Verdict(False)
        if self.choices and answer not in self.choices:
            print(f"{self.id}: the answer must be one of {sorted(self.choices)}, got {answer!r}.")
            return Verdict(False)
        value, explanation = self._solve()
        bound = self.tolerance * abs(value) if self.relative else self.tolerance
        ok = abs(answer - value) <= bound
        unit = f" {self.unit}" if self.unit else ""
        shown = (lambda v: f"{v:g} ({self.choices[int(v)]})") if self.choices else (lambda v: _number(v) + unit)
        print(f"{self.id}: your answer {shown(answer)}; reference {shown(value)}; rule: {self.allowed()} -> "
              f"{'correct' if ok else 'not yet'}")
        print(f"How the reference is obtained: {explanation}")
        return Verdict(ok)


def _number(v: float) -> str:
    """A number as a person writes it: thousands separated, four significant digits below 1,000."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def register(registry: dict, *checks: CodeCheck | NumberCheck) -> None:
    """Add ``checks`` to ``registry`` by id; an id used twice is an error."""
    for c in checks:
        if c.id in registry:
            raise ValueError(f"exercise id {c.id!r} registered twice")
        registry[c.id] = c


def on_device(t: torch.Tensor) -> torch.Tensor:
    """``t`` moved to the course's device (where the learner's kernels run)."""
    return t.to(device.DEVICE)
