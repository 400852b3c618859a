"""One rank of a multi-process measurement (see ``distributed``); started by torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m helpers.finetune.fsdp_point \\
        --spec '{"kind": "train", "model": "70b", "gpus": 2, "cap_gb": 40}' --data D --out-dir O

NCCL joins the ranks on GPUs, gloo on CPUs. Rank 0 merges every rank's numbers into flat records,
writes them to ``O/records.json`` and adds them to the results file; a rank that runs out of memory
writes ``O/oom-rank<r>.json`` and exits with ``distributed.OOM_EXIT`` (torchrun stops the others).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .. import results
from ..llama.data import TokenizedData, make_batches
from .distributed import OOM_EXIT, DistSpec, save_records
from ..llama.lora import LoraSettings, attach_lora, check_checkpointing, decoder_layers
from ..llama.memory_caps import GiB, SimulatedMemory, apply_cap, is_oom, peak_memory
from ..llama.models import build_model
from .timing import run_timed_steps, sync


def rank_batches(token_ids: list[list[int]], batch_size: int, world: int, rank: int, steps: int,
                 max_len: int | None) -> tuple[list[dict], list[int]]:
    """This rank's slices of ``steps`` global batches of ``batch_size * world`` texts, and the real
    tokens of each global batch. The first global batch holds the longest texts (the peak step);
    each slice is trimmed to its own longest text, as a GPU given only those texts would pad."""
    global_batches = make_batches(token_ids, batch_size * world, steps, max_len)
    rows = slice(rank * batch_size, (rank + 1) * batch_size)
    mine = []
    for b in global_batches:
        width = int(b["attention_mask"][rows].sum(1).max())
        mine.append({k: v[rows, :width] for k, v in b.items()})
    return mine, [int(b["attention_mask"].sum()) for b in global_batches]


def shard(model: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """FSDP2 (one unit a decoder layer, then the root) or DDP around the peft model."""
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def local_bytes(model: nn.Module) -> int:
    """Bytes of the parameters and buffers this rank holds (its shards under FSDP)."""
    from torch.distributed.tensor import DTensor

    tensors = list(model.parameters()) + list(model.buffers())
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


def lora_vector(model: nn.Module) -> torch.Tensor:
    """Every LoRA weight, whole (gathered from the shards under FSDP), as one float64 vector.
    A collective under FSDP: every rank calls it."""
    from torch.distributed.tensor import DTensor

    parts = []
    for name, p in model.named_parameters():
        if "lora_" in name:
            full = p.full_tensor() if isinstance(p, DTensor) else p
            parts.append(full.detach().double().flatten().cpu())
    if not parts:
        raise ValueError("no LoRA parameters in this model")
    return torch.cat(parts)


def train_rank(spec: DistSpec, data: TokenizedData, device: torch.device, rank: int, world: int) -> dict:
    """Build, attach LoRA, shard, train; this rank's numbers (raises on out-of-memory)."""
    steps = spec.warmup_steps + spec.timed_steps
    batches, global_tokens = rank_batches(data.token_ids, spec.batch_size, world, rank, steps, spec.max_len)
    mine: dict = {"stage": "build"}
    meter = None
    try:
        model, source = build_model(spec.model, device, vocab_size=data.vocab_size, attn=spec.attn, seed=spec.seed,
                                    quant_storage=torch.bfloat16)
        torch.manual_seed(spec.seed)  # the same LoRA initialisation on every rank
        model = attach_lora(model, LoraSettings(r=spec.lora_r), gradient_checkpointing=spec.grad_ckpt)
        whole = local_bytes(model)
        model = shard(model, spec.strategy, device)
        mine.update(weights=source, whole_model_gb=whole / GiB, local_model_gb=local_bytes(model) / GiB)
        if device.type == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()  # the unsharded build's blocks go back before the cap applies
            mine.update(apply_cap(spec.cap_gb))
            torch.cuda.reset_peak_memory_stats()
        else:
            meter = SimulatedMemory(local_bytes(model), None if spec.cap_gb is None else int(spec.cap_gb * GiB))
        mine["stage"] = "train"
        mine["checkpointing"] = check_checkpointing(model, batches[0]["input_ids"][:1, :16].to(device))
        before = lora_vector(model)
        times, summary, losses = run_timed_steps(model, batches, device, spec.warmup_steps, meter)
        after = lora_vector(model)
    except Exception as error:
        if not is_oom(error):
            raise
        mine.update(status="oom", oom_message=str(error).splitlines()[0][:200], **peak_memory(device, meter))
        return mine
    mine.update(status="ok", times=times, loss=losses[-1], lora_norm=float(after.norm()),
                lora_change=float((after - before).norm()), gpu_util_pct=summary.get("util_pct_mean"),
                timed_tokens=sum(global_tokens[spec.warmup_steps:]), **peak_memory(device, meter))
    return mine


def merge(spec: DistSpec, ranks: list[dict], device: torch.device, weights: str) -> dict:
    """One flat record from every rank's numbers: a step lasts as long as its slowest rank."""
    record = {"kind": "train", "point": spec.key(), "model": spec.model, "gpus": spec.gpus, "strategy": spec.strategy,
              "cap_gb": spec.cap_gb, "batch_size": spec.batch_size, "global_batch": spec.batch_size * spec.gpus,
              "lora_r": spec.lora_r, "attn": spec.attn, "max_len": spec.max_len, "grad_ckpt": spec.grad_ckpt,
              "expandable_segments": spec.expandable_segments, "device": device.type,
              "backend": dist.get_backend(), "weights": weights}
    run = results.provenance()  # per record: a plan resumed over several sessions keeps each run's own
    record.update(git_commit=run["git_commit"], measured_at=run["timestamp"])
    peaks = [r["peak_alloc_gb"] for r in ranks if r.get("peak_alloc_gb") is not None]
    record["peak_alloc_gb_per_gpu"] = max(peaks) if peaks else None  # the fullest GPU's
    for i, r in enumerate(ranks):
        record[f"peak_alloc_gb_rank{i}"] = r.get("peak_alloc_gb")
        record[f"peak_reserved_gb_rank{i}"] = r.get("peak_reserved_gb")
        record[f"local_model_gb_rank{i}"] = r.get("local_model_gb")
    record["whole_model_gb"] = next((r["whole_model_gb"] for r in ranks if "whole_model_gb" in r), None)
    oom = [i for i, r in enumerate(ranks) if r["status"] == "oom"]
    if oom:
        return {**record, "status": "oom", "oom_rank": oom[0], "oom_stage": ranks[oom[0]]["stage"],
                "oom_message": ranks[oom[0]]["oom_message"], "step_s": None, "step_s_min": None,
                "step_s_max": None, "timed_steps": spec.timed_steps, "tokens_per_s": None, "scaling_efficiency": None}
    step = [max(r["times"][k] for r in ranks) for k in range(spec.timed_steps)]  # a step ends with its slowest rank
    record.update(status="ok", step_s=statistics.median(step), step_s_min=min(step), step_s_max=max(step),
                  timed_steps=spec.timed_steps, tokens_per_s=ranks[0]["timed_tokens"] / sum(step),
                  scaling_efficiency=None, checkpointing=all(r["checkpointing"] for r in ranks),
                  alloc_limit_gb=ranks[0].get("alloc_limit_gb"), context_gb=ranks[0].get("context_gb"))
    for i, r in enumerate(ranks):
        record.update({f"step_s_rank{i}": statistics.median(r["times"]), f"loss_rank{i}": r["loss"],
                       f"lora_norm_rank{i}": r["lora_norm"], f"lora_change_rank{i}": r["lora_change"],
                       f"gpu_util_pct_rank{i}": r["gpu_util_pct"]})
    return record


def allreduce_rank(spec: DistSpec, device: torch.device, world: int) -> list[dict]:
    """Seconds per all-reduce of each size (the slowest rank's), and the bandwidths nccl-tests reports:
    algbw = bytes / time; busbw = algbw x 2(n-1)/n, what each link carries (comparable to one
    direction of a link's datasheet rate)."""
    rows = []
    for size_mb in spec.sizes_mb:
        x = torch.ones(max(1, int(size_mb * 2**20) // 4), dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(x)
        sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(spec.iters):
            dist.all_reduce(x)
        sync(device)
        seconds = torch.tensor([(time.perf_counter() - t0) / spec.iters], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        x.fill_(1.0)
        dist.all_reduce(x)
        correct = bool(torch.all(x == world))
        t = float(seconds)
        algbw = x.numel() * 4 / t / 1e9
        rows.append({"kind": "allreduce", "point": f"{spec.key()}/size={size_mb:g}", "gpus": world,
                     "backend": dist.get_backend(), "device": device.type, "size_mb": size_mb, "time_s": t,
                     "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (world - 1) / world, "sum_correct": correct})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="the run as JSON (DistSpec fields)")
    parser.add_argument("--data", type=Path, help="tokenized data (training runs)")
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    spec = DistSpec.from_json(args.spec)
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("start this module with torchrun (python -m torch.distributed.run ...)")
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(minutes=5))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        if world != spec.gpus:
            raise ValueError(f"the spec asks for {spec.gpus} processes; torchrun started {world}")
        spec.validate(torch.cuda.device_count() if device.type == "cuda" else None)
        warm = torch.ones(1, device=device)
        dist.all_reduce(warm)  # NCCL's buffers exist before the cap measures this process's memory
        if spec.kind == "allreduce":
            records = allreduce_rank(spec, device, world)
        else:
            mine = train_rank(spec, TokenizedData.load(args.data), device, rank, world)
            if mine["status"] == "oom":  # the other ranks wait in a collective that never comes: end the run
                ranks = [mine if i == rank else {"status": "stopped"} for i in range(world)]
                (args.out_dir / f"oom-rank{rank}.json").write_text(json.dumps([merge(spec, ranks, device, "-")]))
                os._exit(OOM_EXIT)
            ranks: list = [None] * world
            dist.all_gather_object(ranks, mine)
            records = [merge(spec, ranks, device, mine["weights"])]
        if rank == 0:  # the only writer
            for record in records:
                bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
                if bad:
                    raise RuntimeError(f"non-finite {bad} in {record['point']}")
            (args.out_dir / "records.json").write_text(json.dumps(save_records(records)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
