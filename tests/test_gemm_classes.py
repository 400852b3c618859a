"""The matmul part's two classes (``step_model.matmul_flops``): which products of a QLoRA step run in bf16 and
which in fp32, checked on the model itself (``GemmCount``)."""
import pytest
import torch

from helpers.finetune import step_model
from helpers.finetune.gemm_count import GemmCount
from helpers.llama.lora import LoraSettings, attach_lora
from helpers.llama.models import MODELS, build_model


def test_gemm_count_counts_each_product_by_its_data_type():
    with GemmCount() as count:
        torch.mm(torch.ones(3, 4, dtype=torch.bfloat16), torch.ones(4, 5, dtype=torch.bfloat16))
        torch.addmm(torch.zeros(3, 5), torch.ones(3, 4), torch.ones(4, 5))
        torch.bmm(torch.ones(2, 3, 4), torch.ones(2, 4, 5))
        torch.ones(3) + 1  # not a product
    assert count.flops == {"bf16": 2 * 3 * 4 * 5, "fp32": 2 * 3 * 4 * 5 + 2 * 2 * 3 * 4 * 5}


def test_a_qlora_step_multiplies_the_frozen_linears_in_bf16_and_the_rest_in_fp32():
    """As ``matmul_flops`` assumes: peft keeps the norms, embeddings and lm_head in fp32, so the hidden states, q, k
    and v are fp32, and with them attention's products; the adapters are fp32; only the nf4 linears run in bf16."""
    rank, vocab = 4, 1000
    model, _ = build_model("tiny", "cpu", vocab_size=vocab, attn="eager")
    model = attach_lora(model, LoraSettings(r=rank), gradient_checkpointing=True)
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with GemmCount() as count:
        model(input_ids=ids, labels=ids).loss.backward()
    roles = {}
    for dtype, a, b in count.products:
        dims = set(a[-2:]) | set(b[-2:])
        role = "attention" if len(a) == 3 else "lm_head" if vocab in dims else "lora" if rank in dims else "frozen"
        roles.setdefault(role, set()).add(dtype)
    assert roles == {"attention": {"fp32"}, "lm_head": {"fp32"}, "lora": {"fp32"}, "frozen": {"bf16"}}


def test_matmul_flops_by_hand_and_in_total():
    spec, batch, padded = MODELS["7b"], 4, 500.0
    tokens, h = batch * padded, spec.hidden_size
    flops = step_model.matmul_flops(spec, batch, padded)
    assert flops["bf16"] == pytest.approx(6 * spec.linear_params() * tokens)
    lora = 6 * spec.num_hidden_layers * 2 * 16 * 2 * h * tokens
    assert flops["fp32"] == pytest.approx(lora + 4 * spec.vocab_size * h * tokens
                                          + 4 * spec.num_hidden_layers * 4 * padded * h * tokens)
    assert step_model.work(spec, batch, padded)["matmul"] == pytest.approx(sum(flops.values()))
