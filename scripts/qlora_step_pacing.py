"""Who sets the pace of notebook 07's QLoRA step, the device or the host: the wall time of a few training
steps against the time the device spends in kernels on the same batches (``kernel_ms``), per variant.

    python scripts/qlora_step_pacing.py [--batch 4] [--steps 8] [--variants stock course]

Writes ``results/<gpu>/qlora_pacing.json`` (on a CPU, ``.smoke-results/``), read by the README's table.
"""
from __future__ import annotations

import argparse

import helpers  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers import results
from helpers.finetune import kernels_step, sweep
from helpers.finetune.data import TokenizedData


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="7b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=helpers.pick(full=1024, smoke=32))
    parser.add_argument("--variants", nargs="+", choices=kernels_step.VARIANTS, default=["stock", "course"])
    args = parser.parse_args()
    data = TokenizedData.load(sweep.data_file())
    records = []
    for variant in args.variants:
        r = kernels_step.step_pacing(args.model, variant, args.batch, data, helpers.DEVICE, args.steps, args.max_len)
        records.append(r)
        print(f"{args.model} {variant} batch {args.batch}: {r['wall_ms']:.0f} ms a step, {r['kernel_ms']:.0f} ms of it "
              f"in kernels, the device idle {r['idle_ms']:.0f} ms ({r['idle_ms'] / r['wall_ms']:.0%})", flush=True)
    print(f"saved to {results.save('qlora_pacing', records)}")


if __name__ == "__main__":
    main()
