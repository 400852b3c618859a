"""Text-generation speed with the LoRA adapter attached, and what the bandwidth would allow.

Greedy ``generate()`` at batch 1 (the seed's tables: 64, 128, 256 and 512 new tokens). Each new
token reads every weight once, so ``decode_bytes_per_token`` over the card's bandwidth is the
fastest a decode step can be; the measured tokens/s as a fraction of that says how far decode is
from the memory roofline (notebook 07 takes it from there).
"""
from __future__ import annotations

import statistics
import time

import torch

from ..bench import profile_kernels
from ..children import report_progress
from ..llama.data import TokenizedData
from ..llama.lora import LoraSettings, attach_lora
from ..llama.memory_caps import apply_cap, is_oom
from ..llama.models import ModelSpec, build_model, nf4_bytes
from .point_spec import PointSpec, base_record
from .timing import sync


def run_generate(spec: PointSpec, data: TokenizedData, device: torch.device) -> list[dict]:
    """Seconds and tokens/s of greedy ``generate()`` at batch 1 for each count of new tokens."""
    base = {"kind": "generate", **base_record(spec, device), "kv_cache": True}
    if device.type == "cuda":
        base.update(apply_cap(spec.cap_gb))
    try:
        model, source = build_model(spec.model, device, vocab_size=data.vocab_size, attn=spec.attn)
        model = attach_lora(model, LoraSettings(r=spec.lora_r))
        model.eval()
        prompt = torch.tensor([data.token_ids[0][:32]], device=device)
        records = []
        with torch.no_grad():
            report_progress("model built; warming up")
            _generate(model, prompt, 8)  # warm-up: kernels, cache allocation
            for n in spec.new_tokens:
                sync(device)
                t0 = time.perf_counter()
                out = _generate(model, prompt, n)
                sync(device)
                seconds = time.perf_counter() - t0
                if out.shape[1] - prompt.shape[1] != n:
                    raise RuntimeError(f"generate() made {out.shape[1] - prompt.shape[1]} tokens, not {n}")
                records.append({**base, "status": "ok", "weights": source, "new_tokens": n, "seconds": seconds,
                                "tokens_per_s": n / seconds})
                report_progress(f"generated {n} tokens in {seconds:.1f} s")
    except Exception as error:
        if not is_oom(error):
            raise
        return [{**base, "status": "oom", "new_tokens": n, "seconds": None, "tokens_per_s": None,
                 "oom_message": str(error).splitlines()[0][:200]} for n in spec.new_tokens]
    return records


def _generate(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy ``generate()`` of exactly ``n`` new tokens with the KV cache on. ``use_cache`` is passed here
    because ``generate()`` reads it from the generation config, which kept the training config's False."""
    return model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                          min_new_tokens=n, do_sample=False, pad_token_id=0, use_cache=True)


def decode_bytes_per_token(spec: ModelSpec, context_tokens: int, lm_head_bytes: int = 4) -> int:
    """Bytes one decode step must read at batch 1: nf4 linears, the lm_head (fp32 after peft's
    preparation, ``lm_head_bytes`` a weight), one embedding row, and the KV cache so far (bf16)."""
    kv = context_tokens * spec.kv_bytes_per_token()
    return nf4_bytes(spec) + spec.vocab_size * spec.hidden_size * lm_head_bytes + spec.hidden_size * 4 + kv


def decode_parts(model, prompt_ids: list[int], contexts: list[int], device: torch.device, new_tokens: int = 16,
                 rounds: int = 5) -> list[dict]:
    """Time per new token of greedy ``generate()`` at each context length, split into the device's time (the
    profiler's kernels) and the host's (the rest of the wall time). A prompt of ``context`` tokens is prefilled,
    then ``new_tokens`` more are made; the prefill is taken out by subtracting a 1-token run. The wall times
    are the median of ``rounds``, the contexts in turn within each round."""
    if max(contexts) > len(prompt_ids) or min(contexts) < 1:
        raise ValueError(f"contexts must be in 1..{len(prompt_ids)} (the prompt's length), got {contexts}")
    if new_tokens < 1 or rounds < 1:
        raise ValueError(f"new_tokens and rounds must be >= 1, got {new_tokens}, {rounds}")
    prompts = {c: torch.tensor([prompt_ids[:c]], device=device) for c in contexts}
    walls: dict[tuple[int, int], list[float]] = {}
    with torch.no_grad():
        _generate(model, prompts[contexts[0]], 2)  # warm-up: kernels, cache allocation
        for _ in range(rounds):
            for c in contexts:
                for n in (1, 1 + new_tokens):
                    sync(device)
                    t0 = time.perf_counter()
                    _generate(model, prompts[c], n)
                    sync(device)
                    walls.setdefault((c, n), []).append(time.perf_counter() - t0)
        records = []
        for c in contexts:
            device_s = {n: sum(r["calls"] * r["us_per_call"] for r in
                               profile_kernels(lambda: _generate(model, prompts[c], n), reps=1)) / 1e6
                        for n in (1, 1 + new_tokens)}
            wall = {n: statistics.median(walls[(c, n)]) for n in (1, 1 + new_tokens)}
            per_token = (wall[1 + new_tokens] - wall[1]) / new_tokens
            dev = (device_s[1 + new_tokens] - device_s[1]) / new_tokens
            spread = [(a - b) / new_tokens for a, b in zip(walls[(c, 1 + new_tokens)], walls[(c, 1)])]
            records.append({"what": "decode_parts", "kv_cache": True, "context": c, "new_tokens": new_tokens,
                            "rounds": rounds,
                            "s_per_token": per_token, "s_per_token_min": min(spread), "s_per_token_max": max(spread),
                            "device_s_per_token": dev, "host_s_per_token": max(0.0, per_token - dev)})
            report_progress(f"context {c}: {1e3 * per_token:.1f} ms a token, {1e3 * dev:.1f} ms of it on the device")
    return records
