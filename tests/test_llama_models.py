import math
import re

import pytest
import torch

from helpers.llama import lora, models


@pytest.mark.parametrize("name,params", [("7b", 6_738_415_616), ("13b", 13_015_864_320), ("70b", 68_976_648_192)])
def test_llama2_parameter_counts_match_the_published_models(name, params):
    assert models.MODELS[name].params() == params


def test_70b_nf4_weights_fit_in_about_35_gb():
    assert 34e9 < models.nf4_bytes(models.MODELS["70b"]) < 37e9


@pytest.fixture(scope="module")
def tiny():
    model, source = models.build_model("tiny", "cpu", seed=1)
    return model, source


def test_tiny_model_is_nf4_with_double_quantisation(tiny):
    import bitsandbytes as bnb

    model, source = tiny
    assert "random weights" in source
    spec = models.MODELS["tiny"]
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linears) == 7 * spec.num_hidden_layers
    for layer in linears:
        assert layer.weight.quant_type == "nf4"
        assert layer.weight.quant_state.nested  # double quantisation of the absmax
        assert layer.compute_dtype == torch.bfloat16
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.shape == (spec.vocab_size, spec.hidden_size)
    assert model.is_loaded_in_4bit
    assert not any(p.device.type == "meta" for p in model.parameters())


def test_tiny_model_runs_forward_with_a_finite_loss(tiny):
    model, _ = tiny
    ids = torch.randint(0, 32000, (2, 11))
    loss = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss)
    assert abs(loss.item() - math.log(32000)) < 1.0  # random weights: close to uniform


def test_unknown_model_and_bad_vocab_are_refused():
    with pytest.raises(ValueError, match="unknown model '7B-chat'"):
        models.build_model("7B-chat", "cpu")
    with pytest.raises(ValueError, match="vocab_size"):
        models.spec_for("tiny", vocab_size=0)


def test_lora_adapters_on_q_and_v_with_checkpointing_that_really_recomputes():
    model, _ = models.build_model("tiny", "cpu")
    peft_model = lora.attach_lora(model, lora.LoraSettings(r=8))
    spec = models.MODELS["tiny"]
    kv = spec.hidden_size * spec.num_key_value_heads // spec.num_attention_heads
    per_layer = 8 * (2 * spec.hidden_size) + 8 * (spec.hidden_size + kv)  # q: h->h, v: h->kv
    trainable, total = lora.trainable_parameters(peft_model)
    assert trainable == spec.num_hidden_layers * per_layer
    assert total > trainable
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert names and all(re.search(r"\.(q_proj|v_proj)\.lora_[AB]\.", n) for n in names)
    ids = torch.randint(0, 32000, (1, 9))
    assert lora.check_checkpointing(peft_model, ids)
    # prepare_model_for_kbit_training casts what is not 4-bit to fp32, as QLoRA recipes run
    assert peft_model.get_input_embeddings().weight.dtype == torch.float32


def test_checkpointing_check_fails_when_checkpointing_is_off():
    model, _ = models.build_model("tiny", "cpu")
    peft_model = lora.attach_lora(model, gradient_checkpointing=False)
    assert not lora.check_checkpointing(peft_model, torch.randint(0, 32000, (1, 9)))


def test_hand_quantised_model_without_the_4bit_flag_is_refused():
    model, _ = models.build_model("tiny", "cpu")
    model.is_loaded_in_4bit = False
    with pytest.raises(ValueError, match="silently skip gradient checkpointing"):
        lora.attach_lora(model)


@pytest.mark.parametrize("kwargs,match", [({"r": 0}, "rank"), ({"dropout": 1.0}, "dropout"),
                                          ({"target_modules": ()}, "target_modules")])
def test_bad_lora_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lora.LoraSettings(**kwargs)


def test_lora_on_a_module_the_model_lacks():
    model, _ = models.build_model("tiny", "cpu")
    with pytest.raises(ValueError, match="not in the model"):
        lora.attach_lora(model, lora.LoraSettings(target_modules=("qkv_proj",)))
