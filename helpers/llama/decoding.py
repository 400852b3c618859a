"""Token-by-token decoding of a Llama model with a static KV cache, optionally replayed as one CUDA graph.

    dec = Decoder(model, max_len=640)                     # bitsandbytes' 4-bit matmuls, PyTorch's norms
    dec = Decoder(model, max_len=640, linear=nf4_linear, linear_group=nf4_linear_group, norm=rms_norm,
                  rope=rope_cache, graph=True)                      # the course's kernels
    dec.prefill(prompt)                                   # (B, T) token ids
    tokens = dec.generate(256)                            # greedy; (B, 256)

One decode step reads the weights of a Hugging Face ``LlamaForCausalLM`` (its modules, not a copy)
and does what the model's own forward does for one new token per sequence: embedding, per layer
RMSNorm, q/k/v projections, rotary embedding, attention over the cache, output projection, residual,
RMSNorm, SwiGLU MLP, residual; final norm and lm_head. Everything a step needs lives in tensors
allocated once (the cache, the position, the token, the logits), and the position advances on the
device, so a step has no host synchronisation and can be captured once and replayed: each token
then costs one graph launch instead of hundreds of kernel launches from Python.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..bench import capture_graph

Linear = Callable[[torch.Tensor, nn.Module], torch.Tensor]
LinearGroup = Callable[[torch.Tensor, tuple[nn.Module, ...]], list[torch.Tensor]]  # several projections of one x
Norm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
AddNorm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
SwigluLinear = Callable[[torch.Tensor, torch.Tensor, nn.Module], torch.Tensor]  # (gate, up, down_proj)
# (q, k_cache, v_cache, pos)
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Rope = Callable[..., torch.Tensor]  # (q, k, v, cos, sin, pos, k_cache, v_cache) -> rotated q, see torch_rope_cache


def module_linear(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """The module's own forward (bitsandbytes' 4-bit matmul for a ``Linear4bit``)."""
    return module(x)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm in PyTorch ops, with the casts of ``transformers``' ``LlamaRMSNorm``."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (..., D) by the angles' cos and sin (broadcast to x), as transformers does it."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def torch_rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of one step's q (B, 1, H*D) and k, written with v into the caches (B, H_kv, max_len, D)
    at ``pos``, in PyTorch ops as transformers does it; returns the rotated q, (B, H, 1, D)."""
    b, d = q.shape[0], k_cache.shape[-1]
    q, k, v = (t.view(b, 1, -1, d).transpose(1, 2) for t in (q, k, v))
    c, s = cos.index_select(0, pos), sin.index_select(0, pos)
    k_cache.index_copy_(2, pos, rotate(k, c, s))
    v_cache.index_copy_(2, pos, v)
    return rotate(q, c, s)


# (layer index, q, k, v) of the new tokens, (B, T, H*D) and (B, T, H_kv*D), -> attention output (B, H, T, D)
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LlamaLayers:
    """The forward of a Hugging Face ``LlamaForCausalLM``'s modules for a batch's new tokens, with
    pluggable kernels; what a decoder shares with another (its cache and attention are the caller's).

    ``linear(x, module)`` computes every projection of the decoder layers (default: the module's own
    forward), or, where given, ``linear_group(x, modules)`` the projections that share an input (q, k
    and v; gate and up) together, and ``swiglu_linear(gate, up, down_proj)`` the MLP's last projection
    of ``silu(gate) * up``; ``norm(x, weight, eps)`` every RMSNorm, or, where given,
    ``add_norm(x, y, weight, eps) -> (x + y, norm(x + y))`` a residual addition with the norm after it.
    ``cos`` and ``sin``: the model's rotary tables for positions 0 ... ``max_len`` - 1, (max_len, D).
    """

    def __init__(self, model: nn.Module, max_len: int, *, linear: Linear = module_linear,
                 linear_group: LinearGroup | None = None, swiglu_linear: SwigluLinear | None = None,
                 norm: Norm = torch_rms_norm, add_norm: AddNorm | None = None) -> None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
            raise TypeError(f"expected a transformers LlamaForCausalLM, got {type(model).__name__}")
        cfg = model.config
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"max_len {max_len} is beyond the model's {cfg.max_position_embeddings} positions")
        self.model, self.linear, self.norm = model, linear, norm
        self.linear_group = linear_group or (lambda x, modules: [linear(x, m) for m in modules])
        self.swiglu_linear = swiglu_linear or (lambda gate, up, module: linear(F.silu(gate) * up, module))
        self.add_norm = add_norm or self._add_then_norm
        self.device = inner.embed_tokens.weight.device
        self.dtype = inner.embed_tokens.weight.dtype
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.max_len = max_len
        self.positions = torch.arange(max_len, device=self.device)
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        cos, sin = inner.rotary_emb(probe, self.positions[None])  # the model's own tables, in its dtype
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # (max_len, head_dim)

    def _add_then_norm(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + y
        return x, self.norm(x, weight, eps)

    def _residual_norm(self, x: torch.Tensor, branch: torch.Tensor | None, ln: nn.Module
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """x with the residual branch added (none before the first layer), and its norm."""
        if branch is None:
            return x, self.norm(x, ln.weight, ln.variance_epsilon)
        return self.add_norm(x, branch, ln.weight, ln.variance_epsilon)

    def forward(self, tokens: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The logits after the last of ``tokens`` (B, T), (B, vocab) in the model's dtype: embedding, per
        layer RMSNorm, q/k/v projections, ``attend`` (rotary, cache, attention), output projection,
        residual, RMSNorm, SwiGLU MLP, residual; final norm and lm_head."""
        inner = self.model.model
        b, t = tokens.shape
        x = inner.embed_tokens(tokens)
        branch = None  # a residual branch is added to x where the next norm reads x (one kernel with add_norm)
        for i, layer in enumerate(inner.layers):
            x, h = self._residual_norm(x, branch, layer.input_layernorm)
            attn = layer.self_attn
            q, k, v = self.linear_group(h, (attn.q_proj, attn.k_proj, attn.v_proj))
            out = attend(i, q, k, v)
            branch = self.linear(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim), attn.o_proj)
            x, h = self._residual_norm(x, branch, layer.post_attention_layernorm)
            gate, up = self.linear_group(h, (layer.mlp.gate_proj, layer.mlp.up_proj))
            branch = self.swiglu_linear(gate, up, layer.mlp.down_proj)
        _, h = self._residual_norm(x, branch, inner.norm)
        return self.model.lm_head(h[:, -1])


class Decoder(LlamaLayers):
    """Greedy or teacher-forced decoding of ``model`` for ``batch_size`` sequences of up to ``max_len`` tokens.

    The kernel hooks are :class:`LlamaLayers`'; ``rope(...)`` the rotary embedding and the cache write
    (:func:`torch_rope_cache`'s contract); ``attention(q, k_cache, v_cache, pos)`` the attention of the
    step's queries (B, H, 1, D) over cache positions 0 ... pos (default: ``scaled_dot_product_attention``
    over the whole cache, masked).
    ``graph=True`` (CUDA only) captures one step as a CUDA graph on first use and replays it for every token.
    """

    def __init__(self, model: nn.Module, max_len: int, batch_size: int = 1, *, linear: Linear = module_linear,
                 linear_group: LinearGroup | None = None, swiglu_linear: SwigluLinear | None = None,
                 norm: Norm = torch_rms_norm, add_norm: AddNorm | None = None, rope: Rope = torch_rope_cache,
                 attention: Attention | None = None, graph: bool = False) -> None:
        if max_len < 1 or batch_size < 1:
            raise ValueError(f"max_len and batch_size must be >= 1, got {max_len} and {batch_size}")
        super().__init__(model, max_len, linear=linear, linear_group=linear_group, swiglu_linear=swiglu_linear,
                         norm=norm, add_norm=add_norm)
        if graph and self.device.type != "cuda":
            raise ValueError(f"graph=True needs the model on a CUDA device; it is on {self.device}")
        self.rope, self.attention = rope, attention
        self.batch_size, self.use_graph = batch_size, graph
        shape = (len(model.model.layers), batch_size, self.kv_heads, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        # the attention mask's two values, in the model's dtype: added to the scores (SDPA converts a
        # boolean mask to this form in every layer; built once per step here instead)
        self._open = torch.zeros(max_len, dtype=self.dtype, device=self.device)
        self._closed = torch.full((max_len,), float("-inf"), dtype=self.dtype, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)  # the next position to write
        self.tokens = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.logits = torch.zeros(batch_size, model.config.vocab_size, dtype=torch.float32, device=self.device)
        self.greedy = False  # inside the step: the next token = argmax of this step's logits
        self._graphs: dict[bool, torch.cuda.CUDAGraph] = {}  # one captured step per value of ``greedy``

    def _step(self) -> None:
        mask = None  # for scaled_dot_product_attention: 0 up to and including this token, -inf beyond
        if self.attention is None:
            mask = torch.where(self.positions <= self.pos, self._open, self._closed)[None, None, None, :]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q = self.rope(q, k, v, self.cos, self.sin, self.pos, self.k_cache[i], self.v_cache[i])
            if self.attention is None:
                return F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i], attn_mask=mask,
                                                      enable_gqa=self.kv_heads != self.heads)
            return self.attention(q, self.k_cache[i], self.v_cache[i], self.pos)

        self.logits.copy_(self.forward(self.tokens[:, None], attend))
        self.pos.add_(1)
        if self.greedy:
            self.tokens.copy_(self.logits.argmax(-1))

    def _capture(self) -> torch.cuda.CUDAGraph:
        start, tokens = self.pos.clone(), self.tokens.clone()

        def undo() -> None:  # at the same position each time (never past the cache's end), the same token
            self.pos.copy_(start)
            self.tokens.copy_(tokens)  # a greedy warm-up step replaced it

        graph, _ = capture_graph(self._step, warmup=2, after_each=undo)
        return graph

    @torch.no_grad()
    def step(self, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Feed one token per sequence (None: keep the one in place) and return the logits, (B, vocab), fp32."""
        if tokens is not None:
            self.tokens.copy_(tokens.reshape(self.batch_size))
        if self.use_graph:
            if self.greedy not in self._graphs:
                self._graphs[self.greedy] = self._capture()
            self._graphs[self.greedy].replay()
        else:
            self._step()
        return self.logits

    def reset(self) -> None:
        """Start new sequences: position 0 (the old cache entries are masked out, not cleared)."""
        self.pos.zero_()

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """Reset and feed ``prompt`` (B, T) one token at a time; the logits after its last token."""
        self._check_tokens(prompt)
        self.reset()
        self.greedy = False
        for t in range(prompt.shape[1]):
            self.step(prompt[:, t])
        return self.logits

    @torch.no_grad()
    def teacher_forced(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits at every position of ``tokens`` (B, T), fed one at a time: (B, T, vocab), fp32."""
        self._check_tokens(tokens)
        self.reset()
        self.greedy = False
        out = torch.empty(*tokens.shape, self.logits.shape[-1], dtype=torch.float32, device=self.device)
        for t in range(tokens.shape[1]):
            out[:, t] = self.step(tokens[:, t])
        return out

    @torch.no_grad()
    def generate(self, new_tokens: int) -> torch.Tensor:
        """Greedy continuation after ``prefill``: (B, new_tokens) token ids; the loop never waits for the GPU."""
        if new_tokens < 1 or int(self.pos) + new_tokens > self.max_len:
            raise ValueError(f"{new_tokens} new tokens after position {int(self.pos)} do not fit in "
                             f"max_len {self.max_len}")
        self.tokens.copy_(self.logits.argmax(-1))
        out = torch.empty(self.batch_size, new_tokens, dtype=torch.long, device=self.device)
        self.greedy = True
        try:
            for t in range(new_tokens):
                out[:, t] = self.tokens
                self.step()
        finally:
            self.greedy = False
        return out

    def _check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.dim() != 2 or tokens.shape[0] != self.batch_size:
            raise ValueError(f"tokens must have shape (batch_size={self.batch_size}, T), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"{tokens.shape[1]} tokens do not fit in max_len {self.max_len}")
        if tokens.dtype != torch.long:
            raise TypeError(f"tokens must be torch.long ids, got {tokens.dtype}")
