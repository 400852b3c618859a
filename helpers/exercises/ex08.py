"""Exercises of notebook 08 (two GPUs): the nf4 bytes each GPU holds, the bytes of an all-reduce of LoRA gradients."""
from __future__ import annotations

from ..llama import lora, models
from .checks import NumberCheck


def _sharded_bytes() -> tuple[float, str]:
    spec = models.MODELS["70b"]
    nbytes = models.nf4_bytes(spec)
    return nbytes / 2 / 1e9, (f"models.nf4_bytes(70B) = {nbytes / 1e9:.1f} GB of nf4 weights; FSDP over 2 GPUs "
                              f"keeps half of every tensor on each: {nbytes / 2e9:.1f} GB (plus one gathered layer "
                              f"at a time, {nbytes / spec.num_hidden_layers / 1e9:.2f} GB)")


SHARDED = NumberCheck("08.1", "GB of 70B's nf4 weights each GPU holds when sharded over 2 GPUs",
                      _sharded_bytes, tolerance=0.05, relative=True, unit="GB")


def lora_parameters(spec: models.ModelSpec, settings: lora.LoraSettings = lora.LoraSettings()) -> int:
    """LoRA's trainable parameters: A (r x in) and B (out x r) for each targeted projection of every layer."""
    h = spec.hidden_size
    kv = h * spec.num_key_value_heads // spec.num_attention_heads
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h)}  # (in, out)
    per_layer = sum(settings.r * (shapes[m][0] + shapes[m][1]) for m in settings.target_modules)
    return spec.num_hidden_layers * per_layer


def _allreduce_bytes() -> tuple[float, str]:
    spec, settings = models.MODELS["70b"], lora.LoraSettings()
    n = lora_parameters(spec, settings)
    return n * 4 / 1e6, (f"r={settings.r} on {', '.join(settings.target_modules)} of {spec.num_hidden_layers} layers "
                         f"(q: {spec.hidden_size} -> {spec.hidden_size}, v: {spec.hidden_size} -> "
                         f"{spec.hidden_size * spec.num_key_value_heads // spec.num_attention_heads}, grouped-query "
                         f"attention): {n / 1e6:.1f} M parameters x 4 bytes (fp32 gradients) = {n * 4 / 1e6:.0f} MB; "
                         "a ring all-reduce over N GPUs sends 2(N-1)/N times that per GPU, 1x for N = 2")


ALLREDUCE = NumberCheck("08.2", "MB of LoRA gradients (fp32) that DDP all-reduces each step for 70B, r=16 on q and v",
                        _allreduce_bytes, tolerance=0.05, relative=True, unit="MB")

CHECKS = (SHARDED, ALLREDUCE)
