import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)

import pytest
import torch

from helpers.finetune.lora import LoraSettings, attach_lora
from helpers.finetune.models import ModelSpec, build_random
from helpers.patching import use_attention, use_course_kernels, use_course_rms_norm

SPEC = ModelSpec("head64", 128, 192, 2, 2, 1, vocab_size=96)  # head_dim 64, GQA 2:1


def _model(seed=0):
    model = build_random(SPEC, "cpu", seed=seed, attn="sdpa")
    torch.manual_seed(seed)
    return attach_lora(model, LoraSettings(), gradient_checkpointing=False)


def _batch():
    ids = torch.randint(3, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # right padding
    ids[1, 17:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _loss_and_grads(model, batch):
    model.train()
    torch.manual_seed(0)  # the same LoRA dropout masks for both models
    loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss.detach()), grads


def test_course_kernels_train_like_the_stock_model_on_a_right_padded_batch():
    batch = _batch()
    stock_loss, stock_grads = _loss_and_grads(_model(), batch)
    course = _model()
    assert use_course_kernels(course) == {"attention": "course", "rms_norm_modules": 2 * SPEC.num_hidden_layers + 1}
    loss, grads = _loss_and_grads(course, batch)
    assert loss == pytest.approx(stock_loss, rel=1e-3)
    assert grads.keys() == stock_grads.keys() and len(grads) > 0
    for name, g in grads.items():
        ref = stock_grads[name]
        assert (g - ref).norm() <= 1e-2 * ref.norm(), name


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
