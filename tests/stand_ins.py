"""Stand-ins shared by the tests (``from stand_ins import fixed_timer``; pytest puts this folder on ``sys.path``)."""
from __future__ import annotations

from typing import Callable

from helpers import bench


def fixed_timer(ms: float, after: Callable[[object], None] | None = None):
    """A stand-in for ``bench.time_fn``: runs ``fn`` once, hands its result to ``after``, and says it took
    ``ms``, so that a record's rates can be checked against their closed forms."""
    def time_fn(fn, **kwargs):
        result = fn()
        if after is not None:
            after(result)
        return bench.Timing(ms=ms, ms_p20=ms, ms_p80=ms, reps=1, timer="fixed")
    return time_fn
