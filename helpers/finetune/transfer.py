"""The step model tested across GPUs: built from one GPU's measured step parts, it predicts another GPU's
steps, and a bar fixed before that GPU measured anything says whether the prediction holds.

:func:`rows` sets each predicted step (and, where the other GPU measured its step parts, each part) beside the
measured one; :func:`judge` holds them to the bar (:data:`BAR`); :func:`report` prints both. :func:`replay_rows`
tests the host's part two ways: added to the device's time, or the recorded step replayed.
"""
from __future__ import annotations

import statistics
import textwrap
from dataclasses import dataclass

from ..datasheets import GpuSpec
from .launch_replay import Timeline
from .step_model import PARTS, StepModel, replayed_us, trained_runs, validate


@dataclass(frozen=True)
class Bar:
    """What the step model must achieve on the GPU it did not see: the median over the points of the step
    time's relative error at most ``median_step_error``; every part taking more than ``part_share`` of the
    measured step within ``part_error`` of its measured time."""

    median_step_error: float
    part_share: float
    part_error: float

    def rule(self) -> str:
        return (f"median |step-time error| over the points measured on both GPUs <= {self.median_step_error:.0%}, "
                f"and every step part above {self.part_share:.0%} of the measured step within "
                f"{self.part_error:.0%} of its measured time: passed; otherwise (or with no point or no part "
                "measured on the target): failed")


# Pre-registered on 2026-12-06 (issue 50), before any step part or re-timed step was measured on the H100:
# the bar the H200-built model must clear on the H100 (and back). Do not move it after seeing the H100's data.
BAR = Bar(median_step_error=0.15, part_share=0.10, part_error=0.25)


@dataclass(frozen=True)
class Judgement:
    """Rows held to a bar: the line of each criterion they failed, and of each they met."""

    failed: tuple[str, ...]
    met: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every criterion's line, the failed ones first."""
        return self.failed + self.met


def rows(step_model: StepModel, target: GpuSpec, target_sweep: list[dict], target_parts: list[dict],
         fit_sweep: list[dict] | None = None) -> list[dict]:
    """One row per model and batch the target's sweep measured (and ``fit_sweep`` too, where given): the
    target's measured step (median over its runs, as :func:`step_model.validate` groups them), the step
    predicted on ``target`` at that median padded length, their relative error, and the fit GPU's own measured
    step on the same texts (the median of its runs padded to a length one of the target's runs was; None where it
    has none: a 3-step sweep and a re-timing pad differently). Where ``target_parts`` (``train_parts`` records)
    measured that point, each part's predicted and measured milliseconds (the prediction at the parts record's own
    padded length), its share of the measured step (the parts' sum) and its relative error; None elsewhere."""
    parts_at = {(r["model"], r["batch_size"]): r for r in target_parts if r.get("what") == "train_parts"}
    fit_runs, target_runs = trained_runs(fit_sweep or []), trained_runs(target_sweep)
    out = []
    for v in validate(step_model, target_sweep):
        point = (v["model"], v["batch"])
        if fit_sweep is not None and point not in fit_runs:
            continue
        lengths = {round(r["mean_padded_len"], 1) for r in target_runs[point]}
        same_texts = [r["step_s"] for r in fit_runs.get(point, []) if round(r["mean_padded_len"], 1) in lengths]
        predicted = step_model.predict(v["model"], v["batch"], v["mean_padded_len"], target)["step_s"]
        row = {k: v[k] for k in ("model", "batch", "mean_padded_len", "runs", "measured s", "min s", "max s")}
        row.update({"predicted s": predicted, "error": predicted / v["measured s"] - 1,
                    "fit measured s": statistics.median(same_texts) if same_texts else None})
        measured = parts_at.get(point)
        row["parts mean_padded_len"] = measured["mean_padded_len"] if measured else None
        guess = step_model.predict(*point, measured["mean_padded_len"], target) if measured else {}
        total = sum(measured[f"{p} ms"] for p in PARTS) if measured else None
        for p in PARTS:
            ms = measured[f"{p} ms"] if measured else None
            row[f"{p} predicted ms"] = 1e3 * guess[p] if measured else None
            row[f"{p} measured ms"] = ms
            row[f"{p} share"] = ms / total if measured else None
            row[f"{p} error"] = 1e3 * guess[p] / ms - 1 if measured and ms > 0 else None
        out.append(row)
    return out


def judge(table: list[dict], bar: Bar = BAR) -> Judgement:
    """``table`` (:func:`rows`) against ``bar``: the median absolute step error, then every part above the
    bar's share of its measured step. No row, or no part measured at all, fails: the bar was not tested."""
    if not table:
        return Judgement(("no point measured on both GPUs",), ())
    failed, met = [], []
    median = statistics.median(abs(r["error"]) for r in table)
    line = f"median |step error| {median:.1%} over {len(table)} points"
    if median <= bar.median_step_error:
        met.append(f"{line} <= {bar.median_step_error:.0%}")
    else:
        failed.append(f"{line} > {bar.median_step_error:.0%}")
    checked = [(r, p) for r in table for p in PARTS if r[f"{p} share"] is not None and r[f"{p} share"] > bar.part_share]
    if not any(r[f"{p} share"] is not None for r in table for p in PARTS):
        failed.append("no step part measured on the target: the parts' bar is not tested")
    for r, p in checked:
        error = r[f"{p} error"]
        what = f"{r['model']} batch {r['batch']}: {p} ({r[f'{p} share']:.0%} of the step) off by {error:+.0%}"
        if abs(error) <= bar.part_error:
            met.append(f"{what} <= {bar.part_error:.0%}")
        else:
            failed.append(f"{what} > {bar.part_error:.0%}")
    return Judgement(tuple(failed), tuple(met))


def report(table: list[dict], judgement: Judgement, fit: str, target: str) -> list[str]:
    """``table`` and its judgement as lines of at most 116 characters: a row per point (the parts above the bar's
    share beside it), the rule, the verdict and each criterion's line."""
    lines = [f"step model fit on {fit}, predicting {target}",
             f"{'model':>5} {'batch':>5} {'measured s':>10} {'predicted s':>11} {'error':>7} {'fit s':>7}  "
             f"parts above {BAR.part_share:.0%} of the step (share) error"]
    for r in table:
        parts = ", ".join(f"{p} ({r[f'{p} share']:.0%}) {r[f'{p} error']:+.0%}" for p in PARTS
                          if r[f"{p} error"] is not None and r[f"{p} share"] > BAR.part_share)
        fit_s = f"{r['fit measured s']:7.3f}" if r["fit measured s"] is not None else f"{'-':>7}"
        lines.append(f"{r['model']:>5} {r['batch']:>5} {r['measured s']:10.3f} {r['predicted s']:11.3f} "
                     f"{r['error']:+7.1%} {fit_s}  {parts or '-'}")
    lines += textwrap.wrap(f"rule: {BAR.rule()}", 116, subsequent_indent="  ")
    lines.append(f"verdict: {'PASSED' if judgement.passed else 'FAILED'}")
    lines += [f"  {reason}" for reason in judgement.reasons]
    return lines


def replay_rows(step_model: StepModel, target: GpuSpec, timelines: dict[str, Timeline], here_parts: list[dict],
                target_parts: list[dict]) -> list[dict]:
    """The step model's two ways to put the host beside the device, each predicting ``target``'s measured step at
    every point both GPUs' ``train_parts`` measured and ``timelines`` (``launch_replay.load_events``, recorded on
    the model's own GPU) holds. "added": the device's parts scaled to ``target``, plus the host's part (wall minus
    kernels) as measured. "replayed": the recorded step replayed with each kernel scaled by its part's ratio
    (``target``'s predicted part time over this GPU's), the host's issue times kept; the replayed wall over the
    recorded one times this GPU's measured step (the profiler slows the host, so the ratio is taken, not the
    time; the timeline is one of the point's batches)."""
    here_at, target_at = ({(r["model"], r["batch_size"]): r for r in parts if r.get("what") == "train_parts"}
                          for parts in (here_parts, target_parts))
    out = []
    for key, timeline in timelines.items():
        model, batch = key.split(":")
        point = (model, int(batch))
        if point not in here_at or point not in target_at:
            continue
        here, measured = here_at[point], target_at[point]["step_s"]
        length = here["mean_padded_len"]
        on_here, on_target = (step_model.predict(model, int(batch), length, card) for card in (step_model.here, target))
        replayed = here["step_s"] * replayed_us(timeline, on_target, on_here) / timeline.wall_us()
        out.append({"model": model, "batch": int(batch), "here s": here["step_s"], "measured s": measured,
                    "added s": on_target["step_s"], "added error": on_target["step_s"] / measured - 1,
                    "replayed s": replayed, "replayed error": replayed / measured - 1,
                    "host issue ms": timeline.host_issue_us() / 1e3,
                    "wall - device ms": (timeline.wall_us() - timeline.device_us()) / 1e3})
    return out
