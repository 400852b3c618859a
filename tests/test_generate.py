"""Generation is timed the way a user generates: with the KV cache, so each new token is one forward pass
over one position, not a pass over the whole sequence so far."""
import torch

from helpers.finetune.generate import _generate
from helpers.llama.lora import LoraSettings, attach_lora
from helpers.llama.models import build_model


def test_generate_feeds_one_new_position_per_token():
    model, _ = build_model("tiny", torch.device("cpu"), vocab_size=320, attn="sdpa")
    model = attach_lora(model, LoraSettings(r=4)).eval()
    widths = []
    decoder = model.get_base_model().model
    decoder.register_forward_pre_hook(lambda _, args, kwargs: widths.append(
        (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs["inputs_embeds"]).shape[1]),
        with_kwargs=True)
    prompt = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = _generate(model, prompt, 5)
    assert out.shape == (1, 15)
    assert widths == [10, 1, 1, 1, 1], f"positions fed per forward pass: {widths} (no KV cache if they grow)"
