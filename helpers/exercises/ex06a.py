"""Exercise of appendix 06a (how far to trust notebook 06's step model): its error on the sweep's points."""
from __future__ import annotations

import statistics

from .. import claims, datasheets, results
from ..finetune import step_model, sweep
from .checks import NumberCheck


def _median_error() -> tuple[float, str]:
    sweep_gpu = results.source_gpu(sweep.TOPIC)  # the parts of the GPU whose sweep measures the model's error
    parts = results.load("step_parts", gpu=results.source_gpu("step_parts", prefer=sweep_gpu))
    model = step_model.StepModel.from_records(parts.records, datasheets.lookup(parts.provenance["gpu"]))
    rows = step_model.validate(model, claims.seed_sweep(claims.committed, sweep_gpu))
    errors = [100 * abs(r["error"]) for r in rows]
    return statistics.median(errors), (
        f"step_model.validate: the model fit on the step parts of {parts.describe()}, against the committed "
        f"sweep's {len(rows)} (model, batch) points in the seed's setting; the median of their |errors|, which "
        f"run from {min(errors):.0f}% to {max(errors):.0f}%")


MEDIAN_ERROR = NumberCheck("06a.1", "the step model's median |error| (%) on the committed sweep's points",
                           _median_error, tolerance=10.0, relative=False, unit="%")

CHECKS = (MEDIAN_ERROR,)
