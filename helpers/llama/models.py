"""Llama-2 architectures for the QLoRA experiment, built with random weights and quantised to nf4.

Speed, memory and out-of-memory behaviour depend on the architecture and the tensor shapes, not on
the weights' values, so the experiment needs no download: ``build_model("70b")`` makes the exact
Llama-2-70B architecture with random weights, quantising each linear layer to nf4 (double
quantisation, bf16 compute: what ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)`` gives) as soon as it is
made, one layer at a time. The 70B model therefore never exists in bf16 (140 GB); it peaks at its
nf4 size plus one bf16 matrix. A real checkpoint (a Hugging Face id or a local path) is loaded
instead when given and reachable.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from .data import hub_reachable

LLAMA2_VOCAB = 32000


@dataclass(frozen=True)
class ModelSpec:
    """One architecture: the fields of a ``LlamaConfig`` that set the shapes."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = LLAMA2_VOCAB
    max_position_embeddings: int = 4096
    checkpoint: str | None = None  # the real model this stands in for

    def params(self) -> int:
        """Parameter count (embeddings and lm_head included)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        kv = h * self.num_key_value_heads // self.num_attention_heads
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
        return self.num_hidden_layers * per_layer + 2 * v * h + h

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of KV cache one token takes: a key and a value of ``head_dim`` in every key/value head of
        every layer, ``dtype_bytes`` an element (2: bf16). Grouped-query attention (70B) has fewer KV heads."""
        head_dim = self.hidden_size // self.num_attention_heads
        return 2 * self.num_hidden_layers * self.num_key_value_heads * head_dim * dtype_bytes

    def linear_params(self) -> int:
        """Parameters in the decoder layers' linear projections: the ones stored in nf4."""
        h, i = self.hidden_size, self.intermediate_size
        kv = h * self.num_key_value_heads // self.num_attention_heads
        return self.num_hidden_layers * (2 * h * h + 2 * h * kv + 3 * h * i)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec for spec in (
        ModelSpec("7b", 4096, 11008, 32, 32, 32, checkpoint="meta-llama/Llama-2-7b-chat-hf"),
        ModelSpec("13b", 5120, 13824, 40, 40, 40, checkpoint="meta-llama/Llama-2-13b-chat-hf"),
        ModelSpec("70b", 8192, 28672, 80, 64, 8, checkpoint="meta-llama/Llama-2-70b-chat-hf"),
        # smoke scale: the same code path in seconds on a CPU (grouped KV heads as in 70B, and the head
        # size of the real models, 64 or more, that the course's attention kernel needs)
        ModelSpec("tiny", 128, 192, 2, 2, 1, max_position_embeddings=4096),
    )
}

_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def spec_for(name: str, vocab_size: int | None = None) -> ModelSpec:
    """The architecture called ``name`` (a key of MODELS); ``vocab_size`` overrides the vocabulary."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    spec = MODELS[name]
    if vocab_size is not None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        spec = dataclasses.replace(spec, vocab_size=vocab_size)
    return spec


def llama_config(spec: ModelSpec):
    """The ``transformers.LlamaConfig`` of an architecture (bf16, no KV cache during training)."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                       num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
                       num_key_value_heads=spec.num_key_value_heads, vocab_size=spec.vocab_size,
                       max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=1e-5,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                       use_cache=False)


def random_nf4_linear(in_features: int, out_features: int, device: torch.device, std: float,
                      generator: torch.Generator, quant_storage: torch.dtype = torch.uint8) -> nn.Module:
    """A bias-free bnb ``Linear4bit`` holding a random N(0, std) matrix, quantised on ``device``.

    ``quant_storage``: the dtype the packed 4-bit codes are stored as (bf16 lets FSDP shard them
    alongside bf16 parameters; the bytes are the same).
    """
    import bitsandbytes as bnb

    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=torch.bfloat16,
                              compress_statistics=True, quant_type="nf4", quant_storage=quant_storage,
                              device="meta")
    weight = torch.empty(out_features, in_features, dtype=torch.bfloat16, device=device)
    weight.normal_(0.0, std, generator=generator)
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, compress_statistics=True, quant_type="nf4",
                                     quant_storage=quant_storage, module=layer).to(device)
    # on CPUs with AVX512-bf16 bitsandbytes would repack the weight in place at the first inference
    # call into a CPU-only layout; keep the standard nf4 layout that every kernel of the course reads
    layer.support_avx512bf16_for_cpu = False
    return layer


def build_random(spec: ModelSpec, device: torch.device | str, seed: int = 0, attn: str = "sdpa",
                 quant_storage: torch.dtype = torch.uint8) -> nn.Module:
    """The architecture ``spec`` with random weights: nf4 linears, bf16 embeddings, norms and lm_head.

    Each decoder layer is made on the meta device and each of its projections is created in bf16
    on ``device`` and quantised at once, so peak memory is the nf4 model plus one bf16 matrix.
    The model says it is loaded in 4 bit, as ``from_pretrained`` with a quantisation config would,
    so that peft prepares it the same way (gradient checkpointing, fp32 norms and embeddings).
    ``attn``: "sdpa" (fused attention kernels, today's default) or "eager" (the S x S score matrix
    in memory, as the seed's transformers 4.31 ran Llama). ``quant_storage``: see ``random_nf4_linear``.
    """
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    std = 0.02
    with torch.device(device):  # embeddings, final norm, rotary table, lm_head; no layers yet
        model = LlamaForCausalLM(llama_config(dataclasses.replace(spec, num_hidden_layers=0)))
    model.to(torch.bfloat16)
    with torch.no_grad():  # from the seeded generator too (the constructor drew them from the global one)
        for table in (model.model.embed_tokens.weight, model.lm_head.weight):
            table.normal_(0.0, std, generator=generator)
    config = model.config  # shared by every submodule; now say how many layers it will have
    config.num_hidden_layers = spec.num_hidden_layers
    config._attn_implementation = attn
    for index in range(spec.num_hidden_layers):
        with torch.device("meta"):
            layer = LlamaDecoderLayer(config, index)
        for parent in (layer.self_attn, layer.mlp):
            for name in _LINEARS:
                if hasattr(parent, name):
                    old = getattr(parent, name)
                    setattr(parent, name, random_nf4_linear(old.in_features, old.out_features, device, std,
                                                            generator, quant_storage))
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight = nn.Parameter(torch.ones(spec.hidden_size, dtype=torch.bfloat16, device=device))
        model.model.layers.append(layer)
    model.is_loaded_in_4bit = True  # what from_pretrained(quantization_config=nf4) sets; peft reads it
    model.eval()
    leftovers = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if leftovers:
        raise RuntimeError(f"parameters left on the meta device: {leftovers[:5]}")
    return model


def load_checkpoint(name_or_path: str, device: torch.device | str, attn: str = "sdpa",
                    quant_storage: torch.dtype = torch.uint8) -> nn.Module:
    """A real checkpoint loaded in nf4 (double quantisation, bf16 compute) by transformers."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=quant_storage)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, quantization_config=quant, device_map={"": device},
                                                 dtype=torch.bfloat16, attn_implementation=attn,
                                                 local_files_only=not hub_reachable())
    model.config.use_cache = False
    return model


def build_model(name: str, device: torch.device | str, *, checkpoint: str | None = None,
                vocab_size: int | None = None, seed: int = 0, attn: str = "sdpa",
                quant_storage: torch.dtype = torch.uint8) -> tuple[nn.Module, str]:
    """The model for architecture ``name`` and where its weights came from.

    With ``checkpoint`` (a Hugging Face id or a local folder) the real weights are loaded when they
    can be; otherwise, and by default, random weights in the exact architecture.
    """
    spec = spec_for(name, vocab_size)
    if checkpoint:
        try:
            return load_checkpoint(checkpoint, device, attn, quant_storage), f"checkpoint {checkpoint}"
        except (OSError, ValueError) as error:
            print(f"checkpoint {checkpoint!r} not loadable ({type(error).__name__}); using random weights")
    return build_random(spec, device, seed, attn, quant_storage), f"random weights, Llama-2 {name} architecture"


def nf4_bytes(spec: ModelSpec, block: int = 64) -> int:
    """Bytes the nf4 weights take: 4 bits a weight plus double-quantised absmax (~0.127 bit a weight)."""
    n = spec.linear_params()
    absmax = n / block  # one 8-bit absmax per block of 64, plus one fp32 per 256 blocks
    return math.ceil(n / 2 + absmax + 4 * absmax / 256)


def model_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers as stored (nf4 packed weights count as packed)."""
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
