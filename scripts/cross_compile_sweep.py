"""Compile the course's kernel launches ahead of time for sm_75 ... sm_90, without a GPU, and print which
configs fit each target's shared memory a block (``helpers.kernels.launches``, ``helpers.kernels.fit``).

By default every config of every launch (slow: minutes); ``--picks`` only those that decide fitting (the
config the code picks and its smallest fallback), ``--ci`` only the launches and targets the CI test checks. Exits 1 if,
for some launch and target, none of its picks fits. Run as ``python scripts/cross_compile_sweep.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # before helpers: the kernels must be Triton's compiled ones, not interpreted
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is its default
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers.kernels import launches as kl  # noqa: E402
from helpers.kernels.fit import TARGETS  # noqa: E402


def summary(rows: list[dict], targets: list[str]) -> str:
    """A table: for each launch, on each target, how many of its compiled configs fit ("fitting/compiled")."""
    counts: dict[str, dict[str, list[int]]] = {}
    for row in rows:
        count = counts.setdefault(row["launch"], {}).setdefault(row["target"], [0, 0])
        count[0] += row["fits"]
        count[1] += 1
    width = max([len(name) for name in counts] + [16])
    lines = [f"{'configs that fit':{width}s} " + " ".join(f"{t:>7s}" for t in targets)]
    for name, by_target in counts.items():
        cells = [f"{by_target[t][0]}/{by_target[t][1]}" if t in by_target else "-" for t in targets]
        lines.append(f"{name:{width}s} " + " ".join(f"{c:>7s}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cross_compile_sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--kernels", default="", help="only launches whose name contains this text")
    parser.add_argument("--picks", action="store_true", help="only the configs that decide fitting")
    parser.add_argument("--ci", action="store_true", help="only the launches and targets the CI test compiles")
    parser.add_argument("--plant", action="store_true", help="add a config that needs 120 KB on sm_89 (must fail)")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    launches = [launch for launch in kl.launches() if args.kernels in launch.name]
    launches += [kl.planted()] if args.plant else []
    rows = []
    for launch in launches:
        for target in args.targets:
            if target not in launch.targets or args.ci and target not in launch.ci:
                continue
            for row in kl.check(launch, target, picks_only=args.picks):
                rows.append(row)
                print(f"{row['launch']:58s} {target}  {row['config']:34s} {row['shared'] / 1024:6.1f} KB "
                      f"of {row['limit'] // 1024:3d}  {'fits' if row['fits'] else 'TOO BIG'}"
                      f"{'  (pick)' if row['pick'] else ''}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(summary(rows, args.targets))
    failures = kl.misfits(rows)
    for line in failures:
        print("FAIL:", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
