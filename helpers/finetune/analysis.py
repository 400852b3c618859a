"""Reading the sweep: the seed's tables and the records its claims are tested on.

The step-time and decode projections to other cards are in ``step_model`` (each part measured, then
scaled by the datasheet rate it depends on).
"""
from __future__ import annotations

import pandas as pd


def generate_runs(records: list[dict]) -> list[dict]:
    """The finished generation records timed with the KV cache on (each new token one pass over one
    position); a record without ``kv_cache`` re-read the whole sequence for every token and is left out."""
    return [r for r in records if r.get("kind") == "generate" and r.get("status") == "ok" and r.get("kv_cache")]


def train_runs(records: list[dict], model: str, cap, **fields) -> list[dict]:
    """The training records of ``model`` under ``cap`` whose other ``fields`` match, by batch size."""
    return sorted((r for r in records if r.get("kind") == "train" and r["model"] == model and r.get("cap_gb") == cap
                   and all(r.get(k) == v for k, v in fields.items())), key=lambda r: r["batch_size"])


def first_oom(records: list[dict], model: str, cap, **fields) -> int | None:
    """The smallest batch size that ran out of memory for ``model`` under ``cap`` (None: none did)."""
    return next((r["batch_size"] for r in train_runs(records, model, cap, **fields) if r["status"] == "oom"), None)


def status(records: list[dict], model: str, batch: int, cap, **fields) -> str | None:
    """"ok", "oom" or None (not measured) for one training point."""
    return next((r["status"] for r in train_runs(records, model, cap, **fields) if r["batch_size"] == batch), None)


def seed_table(records: list[dict], model: str, caps, **fields) -> pd.DataFrame:
    """The seed's table for one model: per batch size and cap, step time, memory % and GPU utilisation %
    (or OOM). Memory % is of the emulated card: peak reserved + CUDA context over the cap."""
    rows = {}
    for r in records:
        if r.get("kind") != "train" or r["model"] != model or not all(r.get(k) == v for k, v in fields.items()):
            continue
        if r.get("cap_gb") not in caps:
            continue
        label = "whole card" if r.get("cap_gb") is None else f"{r['cap_gb']:g} GB cap"
        if r["status"] != "ok":
            cell = "OOM" if r.get("measured", True) else "OOM (smaller batch did)"
        else:
            if r.get("cap_gb") is None:
                mem = r.get("mem_pct")
            else:
                mem = 100 * (r["peak_reserved_gb"] + (r.get("context_gb") or 0)) / r["cap_gb"]
            util = r.get("gpu_util_pct")
            cell = (f"{r['step_s']:.2f} s, mem {mem:.0f}%" if mem is not None else f"{r['step_s']:.2f} s") + \
                   (f", util {util:.0f}%" if util is not None else "")
        rows.setdefault(r["batch_size"], {})[label] = cell
    table = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    order = ["whole card" if c is None else f"{c:g} GB cap" for c in caps]
    table = table[[c for c in order if c in table.columns]]  # the caps' order, whatever order the points ran in
    table.index.name = "batch size"
    return table.fillna("-")


def beside(here: list[dict], reference: list[dict], here_name: str, reference_name: str,
           model: str | None = None) -> pd.DataFrame:
    """This card's training points (``here``) beside the reference's at the same batch size and cap, of the same
    model (or of ``model``: the smoke scale's tiny points beside the reference's 7B): step time, tokens/s and peak
    memory reserved, one row a point of ``here`` ("-" where the reference has no such point); columns (whose, what)."""
    rows = []
    for r in here:
        twin = next((x for x in reference if x.get("kind") == "train" and x["model"] == (model or r["model"])
                     and x["batch_size"] == r["batch_size"] and x.get("cap_gb") == r.get("cap_gb")
                     and x.get("attn") == r.get("attn") and x.get("status") == "ok"
                     and not x["point"].endswith("/no-ckpt")), None)
        row = {"model": r["model"], "batch size": r["batch_size"],
               "cap": "whole card" if r.get("cap_gb") is None else f"{r['cap_gb']:g} GiB"}
        for name, x in ((here_name, r), (reference_name, twin)):
            ok = x is not None and x.get("status") == "ok"
            peak = x.get("peak_reserved_gb") if ok else None
            row[(name, "step s")] = f"{x['step_s']:.2f}" if ok else ("OOM" if x else "-")
            row[(name, "tokens/s")] = f"{x['tokens_per_s']:,.0f}" if ok else "-"
            row[(name, "peak GiB")] = f"{peak:.1f}" if peak else "-"
        rows.append(row)
    table = pd.DataFrame(rows).set_index(["model", "batch size", "cap"])
    table.columns = pd.MultiIndex.from_tuples(table.columns)
    return table
