import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)

import pytest
import torch

from helpers.finetune import kernels_step
from helpers.finetune.data import PAD_ID, TokenizedData, standin_texts
from helpers.finetune.graphed_step import GraphedTrainStep, pad_width

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _batch(lengths: list[int], vocab: int = 128) -> dict:
    """Right-padded rows of the given lengths."""
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD_ID)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(3, vocab, (n,))
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def test_pad_width_pads_right_to_a_multiple():
    batch = _batch([5, 9])
    padded = pad_width(batch, 8)
    assert padded["input_ids"].shape == (2, 16)
    assert torch.equal(padded["input_ids"][:, :9], batch["input_ids"])
    assert (padded["input_ids"][:, 9:] == PAD_ID).all() and (padded["attention_mask"][:, 9:] == 0).all()
    assert (padded["labels"][:, 9:] == -100).all()
    assert pad_width(padded, 8) is padded


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_graphed_step_needs_a_gpu():
    with pytest.raises(RuntimeError, match="CUDA"):
        GraphedTrainStep(torch.nn.Linear(2, 2))
    assert kernels_step.GRAPHED not in kernels_step.variants(torch.device("cpu"))


@pytest.fixture(scope="module")
def course_model():
    data = TokenizedData([[5] * 8] * 8, 128, "test", "test", [8] * 8)
    return kernels_step.build("tiny", kernels_step.GRAPHED, data, torch.device("cuda"))[0]


def _update(model, run) -> torch.Tensor:
    """The change ``run()`` makes to every LoRA weight, from the initial adapters, as one vector."""
    kernels_step.reset_lora(model)
    run()
    return torch.cat([(p.detach() - model.initial_lora[n]).float().flatten()
                      for n, p in model.named_parameters() if p.requires_grad])


@gpu
def test_a_replayed_step_equals_the_eager_step(course_model):
    model, batch = course_model, pad_width(_batch([40, 27, 64]), 64)
    on_device = {k: v.cuda() for k, v in batch.items()}

    def eager() -> None:
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4, capturable=True)
        torch.cuda.manual_seed(7)
        model(**on_device).loss.backward()
        optimizer.step()

    graphed = GraphedTrainStep(model)
    assert graphed.capture([batch, _batch([3, 70, 9])]) == 2  # widths 64 and 70 -> 128
    want = _update(model, eager)  # also leaves gradients in the graphs' buffers, then drops them

    def replay() -> None:
        for state in graphed.optimizer.state.values():
            for t in state.values():
                t.zero_()
        torch.cuda.manual_seed(7)
        graphed.step(batch)

    got = _update(model, replay)
    assert want.norm() > 0 and (got - want).norm() <= 1e-3 * want.norm()
    assert all(p.grad is g for p, g in zip(graphed.params, graphed.grads))
    assert all(float(g.abs().max()) == 0 for g in graphed.grads)  # zeroed inside the graph


@gpu
def test_graphs_replay_in_any_order_and_train(course_model):
    model = course_model
    kernels_step.reset_lora(model)
    graphed = GraphedTrainStep(model)
    short, long = _batch([10, 7]), _batch([100, 90])
    losses = [float(graphed.step(b)) for b in (long, short, long, short, long)]
    assert len(graphed.graphs) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert graphed.pool_bytes()[0] > 0
    with pytest.raises(ValueError, match="left padding"):
        graphed.step({k: v.flip(1) for k, v in short.items()})
