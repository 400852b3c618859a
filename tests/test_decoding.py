import pytest
import torch

from helpers.llama.decoding import Decoder, torch_rms_norm
from helpers.llama.models import build_model


@pytest.fixture(scope="module")
def model():
    model, _ = build_model("tiny", "cpu", vocab_size=256, seed=1)
    return model.eval()


def _tokens(batch, length, seed=0):
    return torch.randint(3, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("batch", [1, 2])
def test_teacher_forced_logits_match_the_models_own_forward(model, batch):
    tokens = _tokens(batch, 21)
    with torch.no_grad():
        ref = model(tokens).logits.float()
    ours = Decoder(model, max_len=32, batch_size=batch).teacher_forced(tokens)
    scale = ref.abs().amax(-1, keepdim=True)
    assert ((ours - ref).abs() / scale).max() < 1e-2  # bf16 activations, one token at a time vs the whole sequence


def test_greedy_generation_is_the_argmax_chain_of_its_own_logits(model):
    dec = Decoder(model, max_len=40, batch_size=2)
    prompt = _tokens(2, 7, seed=3)
    dec.prefill(prompt)
    new = dec.generate(12)
    assert new.shape == (2, 12) and int(dec.pos) == 7 + 12
    logits = dec.teacher_forced(torch.cat([prompt, new], dim=1))
    assert torch.equal(logits[:, 6:18].argmax(-1), new)


def test_the_linear_and_norm_hooks_compute_every_projection_and_norm(model):
    calls = {"linear": 0, "norm": 0}

    def linear(x, module):
        calls["linear"] += 1
        return module(x)

    def norm(x, weight, eps):
        calls["norm"] += 1
        return torch_rms_norm(x, weight, eps)

    Decoder(model, max_len=8, linear=linear, norm=norm).step(torch.tensor([5]))
    layers = model.config.num_hidden_layers
    assert calls == {"linear": 7 * layers, "norm": 2 * layers + 1}

    def group(x, modules):
        calls["group"] = calls.get("group", 0) + 1
        calls["grouped"] = calls.get("grouped", 0) + len(modules)
        return [module(x) for module in modules]

    calls.update(linear=0, norm=0)
    Decoder(model, max_len=8, linear=linear, linear_group=group, norm=norm).step(torch.tensor([5]))
    assert calls == {"linear": 2 * layers, "norm": 2 * layers + 1, "group": 2 * layers, "grouped": 5 * layers}


def test_bad_input_is_refused(model):
    dec = Decoder(model, max_len=8)
    with pytest.raises(ValueError, match="shape"):
        dec.prefill(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="do not fit"):
        dec.prefill(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.long"):
        dec.prefill(torch.zeros(1, 3, dtype=torch.int32))
    dec.prefill(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="do not fit"):
        dec.generate(6)
    with pytest.raises(ValueError, match="CUDA"):
        Decoder(model, max_len=8, graph=True)
    with pytest.raises(ValueError, match="positions"):
        Decoder(model, max_len=10**6)
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        Decoder(torch.nn.Linear(2, 2), max_len=8)
