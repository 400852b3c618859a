"""The step model built on one GPU's step parts, tested on another GPU's measured steps against a bar set before
that GPU measured them (``helpers.finetune.transfer.BAR``).

    python scripts/step_model_transfer.py [--fit h200] [--target h100-80gb-hbm3]
    python scripts/step_model_transfer.py --retime [--fit h200] [--budget-s 480]   # on the target GPU

Reads the committed results of both GPU folders: the fit GPU's ``step_parts.json`` (the model) and sweep
(``finetune.json`` with ``finetune_timing.json``'s re-timed steps, notebook 06's seed setting), the target's
``step_parts.json`` and re-timed steps (its own sweep where it has one). Prints a row per point measured on
both GPUs and the verdict with its rule, and saves ``results/<target>/step_model_validation.json`` when run on
the target GPU (``helpers.results.save`` writes this machine's folder; on a CPU, ``.smoke-results/``).
Where the target lacks the measurements, exits with status 2 and the commands to run on it first.

``--retime``: on the target GPU, re-time the points the fit GPU re-timed (``helpers.finetune.retime``, resumable:
run again until none is left), since the target may have no sweep of its own to re-time.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import statistics
import sys

import helpers  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers import claims, results
from helpers.finetune import point_spec, retime, transfer

TOPIC = "step_model_validation"
SESSION_GAP_S = 600  # consecutive re-timed points further apart than this were measured in different sessions


def train_parts(gpu: str) -> list[dict]:
    parts = results.find("step_parts", gpu)
    return [r for r in parts.records if r.get("what") == "train_parts"] if parts else []


def retime_estimate(records: list[dict]) -> str:
    """How long re-timing ``records``' points took, from their ``measured_at``: each session's span plus its
    first point's steps (that point's model build is not recorded)."""
    done = sorted((r for r in records if r.get("status") == "ok"), key=lambda r: r["measured_at"])
    if not done:
        return "unknown"
    total = (done[0]["warmup_steps"] + done[0]["timed_steps"]) * done[0]["step_s"]
    for before, r in zip(done, done[1:]):
        gap = (dt.datetime.fromisoformat(r["measured_at"]) - dt.datetime.fromisoformat(before["measured_at"]))
        seconds = gap.total_seconds()
        total += seconds if seconds < SESSION_GAP_S else (r["warmup_steps"] + r["timed_steps"]) * r["step_s"]
    return f"about {total / 60:.0f} min plus a model build a session"


def parts_estimate(parts: list[dict]) -> str:
    """A lower bound on measuring ``parts`` (a step_parts file's records) again: the training points' timed and
    profiled steps and the decoders' timed tokens (warm-up, profiler and model builds are not recorded)."""
    seconds = sum(2 * r["timed_steps"] * r["step_s_mean"] if r.get("what") == "train_parts"
                  else r.get("rounds", 0) * r.get("new_tokens", 0) * r.get("s_per_token", 0.0) for r in parts)
    return f"at least {seconds / 60:.1f} min of steps and tokens plus model builds" if seconds else "unknown"


def missing(fit: str, target: str) -> str | None:
    """One line naming what to run on the target (or fit) GPU before the test can run, or None if nothing is."""
    fit_parts = train_parts(fit)
    if not fit_parts:
        return f"{fit} has no train_parts to build the step model from: run scripts/step_parts.py on the {fit} GPU"
    todo = []
    if not train_parts(target):
        points = " ".join(f"{r['model']}:{r['batch_size']}" for r in fit_parts)
        timed = max((r["timed_steps"] for r in fit_parts), default=10)
        every = results.find("step_parts", fit)
        todo.append(f"`python scripts/step_parts.py --train {points} --timed {timed}` (its decode parts too; "
                    f"{parts_estimate(every.records if every else [])} on the {fit})")
    if claims.seed_sweep(claims.sweep_or_retimed, target) is None:
        timing = results.find(retime.TOPIC, fit)
        todo.append(f"`python scripts/step_model_transfer.py --retime --fit {fit} --budget-s 480` until none is "
                    f"left ({retime_estimate(timing.records if timing else [])} on the {fit})")
    if not todo:
        return None
    return (f"{target} lacks the measurements to test the step model on: on the {target} GPU run "
            + ", then ".join(todo) + ", then this script again")


def retime_here(fit: str, budget_s: float) -> None:
    """Re-time on this GPU the points ``fit`` re-timed, saving them to this GPU's ``finetune_timing.json``."""
    if not helpers.HAS_CUDA or helpers.SCALE != "full":
        raise SystemExit("--retime measures this GPU: run it on the target GPU at full scale")
    timing = results.find(retime.TOPIC, fit)
    if timing is None:
        raise SystemExit(f"{fit} has no re-timed points (results/{fit}/{retime.TOPIC}.json) to re-time here")
    points = point_spec.full_plan()
    records = retime.run(points, timing.records, budget_s=budget_s)
    left = [p for p in retime.todo(points, timing.records) if p.key() not in {r["point"] for r in records}]
    print(f"{len(records)} re-timed points saved to {results.path_for(retime.TOPIC)}; {len(left)} left")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", default=results.SECOND_GPU, help="GPU folder whose step parts build the model")
    parser.add_argument("--target", default=results.REFERENCE_GPU, help="GPU folder whose steps are predicted")
    parser.add_argument("--retime", action="store_true", help="re-time the fit GPU's points on this GPU, then stop")
    parser.add_argument("--budget-s", type=float, default=None, help="--retime: start no point after this long")
    args = parser.parse_args(argv)
    if args.retime:
        retime_here(args.fit, args.budget_s)
        return 0
    line = missing(args.fit, args.target)
    if line:
        print(line, file=sys.stderr)
        return 2
    got = claims.transfer_test(args.fit, args.target)
    if isinstance(got, str):
        print(got, file=sys.stderr)
        return 2
    table, verdict = got
    print("\n".join(transfer.report(table, verdict, args.fit, args.target)))
    if not table:
        print(f"not saved: no point measured on both {args.fit} and {args.target}")
        return 0
    if helpers.SCALE == "full" and results.gpu_slug() != args.target:
        print(f"not saved: results.save writes this machine's folder ({results.gpu_slug()}), not {args.target}'s")
        return 0
    bar = {f"bar {k.replace('_', ' ')}": v for k, v in dataclasses.asdict(transfer.BAR).items()}
    records = [{"fit_gpu": args.fit, "target_gpu": args.target, **r, "passed": verdict.passed, **bar} for r in table]
    print(f"wrote {results.save(TOPIC, records)}; median |error| "
          f"{statistics.median(abs(r['error']) for r in table):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
