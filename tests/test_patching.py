import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)

import dataclasses

import pytest
import torch

from helpers.llama.lora import LoraSettings, attach_lora
from helpers.llama.models import ModelSpec, build_random
from helpers.llama import kernel_set, patching
from helpers.llama.patching import (use_attention, use_course_kernels, use_course_nf4, use_course_rms_norm,
                                    use_course_rotary, use_course_swiglu)

SPEC = ModelSpec("head64", 128, 192, 2, 2, 1, vocab_size=96)  # head_dim 64, GQA 2:1
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the Triton interpreter runs on CPU tensors


def _model(seed=0, checkpointing=False):
    model = build_random(SPEC, DEV, seed=seed, attn="sdpa")
    torch.manual_seed(seed)
    return attach_lora(model, LoraSettings(), gradient_checkpointing=checkpointing)


def _batch():
    ids = torch.randint(3, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # right padding
    ids[1, 17:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
    return {k: v.to(DEV) for k, v in batch.items()}


def _loss_and_grads(model, batch):
    model.train()
    torch.manual_seed(0)  # the same LoRA dropout masks for both models
    loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss.detach()), grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_course_kernels_train_like_the_stock_model_on_a_right_padded_batch(checkpointing):
    batch = _batch()
    stock_loss, stock_grads = _loss_and_grads(_model(checkpointing=checkpointing), batch)
    course = _model(checkpointing=checkpointing)
    layers = SPEC.num_hidden_layers
    assert use_course_kernels(course) == {"attention": "course", "rms_norm_modules": 2 * layers + 1,
                                          "rotary_modules": layers, "swiglu_modules": layers,
                                          "nf4_modules": 7 * layers}
    loss, grads = _loss_and_grads(course, batch)
    assert loss == pytest.approx(stock_loss, rel=1e-3)
    assert grads.keys() == stock_grads.keys() and len(grads) > 0
    for name, g in grads.items():
        ref = stock_grads[name]
        assert (g - ref).norm() <= 1e-2 * ref.norm(), name


def _counting(monkeypatch, module, name: str) -> list:
    calls, fn = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or fn(*a, **k))
    return calls


def _counting_in_kernel_set(monkeypatch, part: str) -> list:
    """Count the calls of one part of ``kernel_set.COURSE`` (the definition the patched model reads)."""
    calls, fn = [], getattr(kernel_set.COURSE, part)
    counted = dataclasses.replace(kernel_set.COURSE, **{part: lambda *a, **k: calls.append(1) or fn(*a, **k)})
    monkeypatch.setattr(kernel_set, "COURSE", counted)
    return calls


def test_rotary_swap_stays_inside_the_patched_model(monkeypatch):
    calls = _counting(monkeypatch, patching, "course_rotary_pos_emb")
    course, other = _model(), _model()
    use_course_rotary(course)
    course(**_batch())
    assert len(calls) == SPEC.num_hidden_layers  # the course's function ran in every layer
    other(**_batch())
    assert len(calls) == SPEC.num_hidden_layers  # and an unpatched model kept transformers' function


def test_swiglu_swap_runs_the_kernel_and_refuses_another_activation(monkeypatch):
    calls = _counting_in_kernel_set(monkeypatch, "swiglu")
    model = _model()
    assert use_course_swiglu(model) == SPEC.num_hidden_layers
    model(**_batch())
    assert len(calls) == SPEC.num_hidden_layers
    model = _model()
    mlps = [layer.mlp for layer in model.get_base_model().model.layers]
    mlps[-1].act_fn = torch.nn.GELU()
    with pytest.raises(ValueError, match="GELU"):
        use_course_swiglu(model)
    assert all("forward" not in vars(m) for m in mlps)  # refused before any swap


def test_nf4_swap_runs_the_kernel_and_refuses_another_quant_type(monkeypatch):
    import bitsandbytes as bnb

    calls = _counting_in_kernel_set(monkeypatch, "nf4_linear")
    model = _model()
    assert use_course_nf4(model) == 7 * SPEC.num_hidden_layers
    model(**_batch())
    assert len(calls) == 7 * SPEC.num_hidden_layers
    model = _model()
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    layers[-1].weight.quant_state.quant_type = "fp4"
    with pytest.raises(ValueError, match="only nf4"):
        use_course_nf4(model)
    assert all("forward" not in vars(m) for m in layers)  # refused before any swap


def test_left_padding_is_refused():
    model = _model()
    use_attention(model)
    batch = _batch()
    batch["attention_mask"] = batch["attention_mask"].flip(1)
    with pytest.raises(ValueError, match="left padding"):
        model(**batch)


def test_rms_norm_swap_shares_the_weights():
    model = _model()
    before = [m.weight for n, m in model.named_modules() if n.endswith("norm")]
    assert use_course_rms_norm(model) == len(before) == 2 * SPEC.num_hidden_layers + 1
    after = [m.weight for n, m in model.named_modules() if n.endswith("norm")]
    assert all(a is b for a, b in zip(after, before))


def test_bf16_sdpa_baseline_trains_like_the_stock_model():
    batch = _batch()
    stock_loss, stock_grads = _loss_and_grads(_model(), batch)
    model = _model()
    use_attention(model, "sdpa_bf16")
    loss, grads = _loss_and_grads(model, batch)
    assert loss == pytest.approx(stock_loss, rel=1e-3)
    for name, g in grads.items():
        assert (g - stock_grads[name]).norm() <= 1e-2 * stock_grads[name].norm(), name
    with pytest.raises(ValueError, match="attention must be one of"):
        use_attention(model, "flash")
