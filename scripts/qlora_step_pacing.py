"""Who sets the pace of notebook 07's QLoRA step, the device or the host: the wall time of a few training
steps against the time the device spends in kernels on the same batches (``kernel_ms``), per variant.

    python scripts/qlora_step_pacing.py [--batch 4] [--steps 8] [--rounds 3] [--variants stock course]
                                        [--host-top 30]

The variants' models are built first and held together; the wall time is taken ``--rounds`` times, the
variants in turn, and its median recorded (the host's speed drifts from minute to minute on a shared machine).

``--host-top K`` then profiles the host side of a few more forward passes of each variant (``cProfile``; the
backward runs on autograd's own thread, out of its sight) and prints the K functions where Python spends the
most time of its own. Writes ``results/<gpu>/qlora_pacing.json`` (on a CPU, ``.smoke-results/``), read by the
README's table.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats

import helpers  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers import results
from helpers.finetune import kernels_step, sweep
from helpers.llama.data import TokenizedData, make_batches


def host_profile(model, data: TokenizedData, args: argparse.Namespace, variant: str, steps: int = 3) -> None:
    """Print the functions of ``steps`` forward passes (each followed by its backward, not profiled) with the most
    time of their own."""
    batches = [{k: v.to(helpers.DEVICE) for k, v in b.items()}
               for b in make_batches(data.token_ids, args.batch, steps, args.max_len, seed=1)]
    profiler = cProfile.Profile()
    for batch in batches:
        profiler.enable()
        loss = model(**batch).loss
        profiler.disable()
        loss.backward()
        model.zero_grad(set_to_none=True)
    print(f"--- {variant}: host time of {steps} forward passes, by function (own time)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.host_top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="7b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=helpers.pick(full=1024, smoke=32))
    parser.add_argument("--variants", nargs="+", choices=kernels_step.VARIANTS, default=["stock", "course"])
    parser.add_argument("--rounds", type=int, default=3, help="wall times taken per variant, the variants in turn")
    parser.add_argument("--host-top", type=int, default=0, help="print the host's K most costly functions")
    args = parser.parse_args()
    data = TokenizedData.load(sweep.data_file())
    built = {v: kernels_step.build(args.model, v, data, helpers.DEVICE) for v in args.variants}
    records = kernels_step.pacing_side_by_side(args.model, args.variants, args.batch, data, helpers.DEVICE, args.steps,
                                               args.max_len, rounds=args.rounds, built=built)
    for r in records:
        print(f"{args.model} {r['variant']} batch {args.batch}: {r['wall_ms']:.0f} ms a step (median of {args.rounds} "
              f"rounds, {r['wall_ms_min']:.0f}-{r['wall_ms_max']:.0f}), {r['kernel_ms']:.0f} ms of it in kernels, the "
              f"device idle {r['idle_ms']:.0f} ms ({r['idle_ms'] / r['wall_ms']:.0%})", flush=True)
    if args.host_top:
        for variant, (model, _) in built.items():
            host_profile(model, data, args, variant)
    print(f"saved to {results.save('qlora_pacing', records)}")


if __name__ == "__main__":
    main()
