"""The course's kernels enter a Llama through one definition, ``kernel_set.COURSE``: swap one of its entries
and the batch-1 decoder (the decoding ladder's top rung), the paged decoder and the training patch all call
the new one."""
import dataclasses

import pytest
import torch

from helpers.llama import kernel_set
from helpers.llama.decoding import torch_rms_norm
from helpers.llama.models import build_model
from helpers.llama.paged_decoding import PagedDecoder, course_kernels
from helpers.llama.patching import use_course_kernels
from helpers.studies import decoding_ladder


@pytest.fixture
def model():
    model, _ = build_model("tiny", "cpu", vocab_size=256, seed=1)
    return model.eval()


@pytest.fixture
def norm_calls(monkeypatch):
    """``COURSE`` with PyTorch's parts (they run on plain CPU weights) and a norm that counts its calls."""
    calls = []

    def counting_norm(x, weight, eps):
        calls.append(tuple(x.shape))
        return torch_rms_norm(x, weight, eps)

    swapped = dataclasses.replace(kernel_set.STOCK, norm=counting_norm)
    monkeypatch.setattr(kernel_set, "COURSE", swapped)
    return calls


def test_the_ladders_top_rung_takes_every_part_from_the_kernel_set(norm_calls):
    top = decoding_ladder.rung_kernels(decoding_ladder.VARIANTS[-1])
    assert top == kernel_set.COURSE.decoder_hooks()
    first = decoding_ladder.rung_kernels(decoding_ladder.VARIANTS[1])
    assert first == kernel_set.STOCK.decoder_hooks()


def test_one_swapped_entry_reaches_all_three_paths(model, norm_calls):
    layers = len(model.model.layers)
    prompt = torch.randint(3, 256, (1, 5), generator=torch.Generator().manual_seed(0))

    decoder = decoding_ladder.decoder(model, decoding_ladder.VARIANTS[-1], max_len=16)
    decoder.prefill(prompt)  # one token at a time
    per_forward = 2 * layers + 1  # two norms a layer and the final one
    assert len(norm_calls) == prompt.shape[1] * per_forward
    norm_calls.clear()

    paged = PagedDecoder(model, num_pages=8, page_tokens=4, max_len=16, **course_kernels())
    paged.add("a", prompt[0], max_new_tokens=2)  # the prompt in one forward
    assert len(norm_calls) == per_forward
    norm_calls.clear()

    done = use_course_kernels(model, attention=False, rotary=False, swiglu=False, nf4=False)
    with torch.no_grad():
        model(prompt)
    assert done["rms_norm_modules"] == per_forward and len(norm_calls) == per_forward


def test_paged_hooks_refuse_more_rows_than_the_nf4_kernels_take():
    with pytest.raises(ValueError, match="max_rows must be 1"):
        kernel_set.COURSE.paged_hooks(max_rows=10_000)
