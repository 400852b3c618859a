"""The matmul part's two classes (``step_model.matmul_flops``): which products of a QLoRA step run in bf16 and
which in fp32, checked on the model itself (``GemmCount``), and each class at its own datasheet rate."""
import pytest
import torch

from helpers import datasheets
from helpers.finetune import step_model
from helpers.finetune.gemm_count import GemmCount
from helpers.llama.lora import LoraSettings, attach_lora
from helpers.llama.models import MODELS, build_model

H200, A100, ADA = (datasheets.by_name(n) for n in ("H200", "A100 40GB SXM", "RTX 6000 Ada"))


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


def test_each_class_runs_at_its_own_rate():
    assert step_model.rate(ADA, "matmul") == pytest.approx(364.2e12)  # no classes: the bf16 tensor rate
    assert step_model.rate(ADA, "matmul", {"bf16": 1.0}) == pytest.approx(364.2e12)
    assert step_model.rate(ADA, "matmul", {"fp32": 1.0}) == pytest.approx(91.1e12)
    # a tenth of the FLOPs in fp32: the time adds up, 0.9 / 364.2 + 0.1 / 91.1 seconds per 1e12 FLOPs
    blended = step_model.rate(ADA, "matmul", {"bf16": 0.9, "fp32": 0.1})
    assert blended == pytest.approx(1e12 / (0.9 / 364.2 + 0.1 / 91.1))
    with pytest.raises(ValueError, match="gemm_class"):
        step_model.class_rate(ADA, "int8")


def test_the_fp32_class_moves_the_tie_between_the_a100_and_the_ada():
    """The Ada has 4.7x the A100's fp32 rate and 1.17x its bf16 tensor rate: with a few per cent of the FLOPs in
    fp32, the bandwidth parts must take a larger share of the step for the A100's bandwidth to win."""
    flops = step_model.matmul_flops(MODELS["7b"], 4, 500.0)
    assert step_model.tie_share(H200, A100, ADA) == pytest.approx(0.24, abs=0.01)
    assert step_model.tie_share(H200, A100, ADA, flops) == pytest.approx(0.69, abs=0.01)


def test_the_clock_branch_scales_by_the_sms_times_their_clock():
    assert step_model.clock_rate(ADA) / step_model.clock_rate(A100) == pytest.approx(142 * 2505 / (108 * 1410))
