"""Notebook 07's decoding measurements without the notebook: the nf4 GEMV bandwidth table and the
decoding ladder, for the models given, on this GPU. The ladder is saved as ``results/<gpu>/decode.json``
(the file notebook 07 writes) unless ``--topic`` names another file, so that a model notebook 07 does not run
(13B) is measured without replacing the notebook's records.

    python scripts/decode_ladder.py --models 7b
    python scripts/decode_ladder.py --models 13b --topic decode_13b
"""
from __future__ import annotations

import argparse

import torch

from helpers import bench, require_cuda, results  # first: sets Triton up
from helpers.studies import decoding_ladder
from helpers.finetune.generate import decode_bytes_per_token  # noqa: E402
from helpers.llama.models import build_model, spec_for  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["7b"])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, the rungs taken in turn in each")
    parser.add_argument("--topic", default="decode", help="the results file to write: results/<gpu>/<topic>.json")
    args = parser.parse_args()
    require_cuda("the decoding measurements")
    copy = bench.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:,.0f} GB/s")
    for rows in (1, 16):
        for r in decoding_ladder.gemv_bandwidth(decoding_ladder.LLAMA_7B_SHAPES, rows=rows):
            print(f"{rows:3d} row(s)  {r['shape']:34s} {r['impl']:20s} {r['ms'] * 1e3:7.1f} us "
                  f"{r['gbps']:7,.0f} GB/s {100 * r['gbps'] / copy:4.0f}% of copy", flush=True)
    ladder = []
    for name in args.models:
        model, _ = build_model(name, torch.device("cuda"), vocab_size=32000, attn="sdpa")
        model.eval()
        context = decoding_ladder.PROMPT_LEN + decoding_ladder.NEW_TOKENS // 2  # the cache mid-way, as notebook 07
        step_bytes = decode_bytes_per_token(spec_for(name, 32000), context, lm_head_bytes=2)
        ladder += decoding_ladder.ladder(model, name, step_bytes, copy, repeats=args.repeats, progress=False)
        del model
        torch.cuda.empty_cache()
    for r in ladder:
        print(f"{r['model']:4s} {r['variant']:28s} {r['tokens_per_s']:8.1f} tokens/s "
              f"({100 * r['tokens_per_s'] / r['roofline_tokens_per_s']:4.1f}% of roofline)  logits error "
              f"{r['logits_max_rel_error'] or 0:.4f} (transformers' own: {r['transformers_decode_error']:.4f}) "
              f"ok={decoding_ladder.logits_ok(r)}")
    print(f"saved to {results.save(args.topic, ladder)}")


if __name__ == "__main__":
    main()
