import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)

import pytest
import torch

from helpers.finetune import kernels_step
from helpers.llama.data import PAD_ID, TokenizedData
from helpers.finetune.graphed_step import GraphedTrainStep, pad_width

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


def _state(model, optimizer) -> list[torch.Tensor]:
    """The LoRA weights and the optimizer's state tensors, in a fixed order, cloned."""
    lora = [p for p in model.parameters() if p.requires_grad]
    return [t.detach().clone() for p in lora for t in [p, *optimizer.state[p].values()] if torch.is_tensor(t)]


def _close(got: list[torch.Tensor], want: list[torch.Tensor], rtol: float) -> bool:
    return all((g.float() - w.float()).norm() <= rtol * w.float().norm() + 1e-12 for g, w in zip(got, want))


@pytest.mark.gpu
def test_replayed_steps_equal_eager_steps(course_model):
    """Two steps on batches of two captured shapes, each seeded the same: the losses, the LoRA weights and
    AdamW's moments (exp_avg is (1 - beta1) x the gradient after a first step, so the gradients themselves
    are compared, not only the sign-like first update) match the eager steps'."""
    model = course_model
    batches = [pad_width(_batch([40, 27, 64]), 64), pad_width(_batch([3, 70, 9]), 64)]  # widths 64 and 128
    lora = [p for p in model.parameters() if p.requires_grad]
    kernels_step.reset_lora(model)
    graphed = GraphedTrainStep(model)
    assert graphed.capture(batches) == 2

    eager_opt = torch.optim.AdamW(lora, lr=2e-4, capturable=True)
    kernels_step.reset_lora(model)
    want_losses = []
    for i, batch in enumerate(batches):
        torch.cuda.manual_seed(7 + i)
        loss = model(**{k: v.cuda() for k, v in batch.items()}).loss
        loss.backward()
        eager_opt.step()
        eager_opt.zero_grad(set_to_none=True)
        want_losses.append(float(loss))
    want = _state(model, eager_opt)

    kernels_step.reset_lora(model)
    for state in graphed.optimizer.state.values():
        for t in state.values():
            t.zero_()
    got_losses = []
    for i, batch in enumerate(batches):
        torch.cuda.manual_seed(7 + i)
        got_losses.append(float(graphed.step(batch)))
    got = _state(model, graphed.optimizer)
    assert got_losses == pytest.approx(want_losses, rel=1e-4)
    assert len(got) == len(want) and _close(got, want, 1e-2)
    assert all(p.grad is g for p, g in zip(graphed.params, graphed.grads))
    assert all(float(g.abs().max()) == 0 for g in graphed.grads)  # zeroed inside the graph


@pytest.mark.gpu
def test_capturing_a_new_shape_leaves_the_training_state_alone(course_model):
    model = course_model
    kernels_step.reset_lora(model)
    graphed = GraphedTrainStep(model)
    for batch in (_batch([10, 7]), _batch([30, 12])):
        graphed.step(batch)
    before = _state(model, graphed.optimizer)
    assert graphed.capture([_batch([100, 90])]) == 1  # warm-up steps, then undone
    after = _state(model, graphed.optimizer)
    assert all(torch.equal(a, b) for a, b in zip(after, before))


@pytest.mark.gpu
def test_graphs_replay_in_any_order_and_train(course_model):
    model = course_model
    kernels_step.reset_lora(model)
    graphed = GraphedTrainStep(model)
    short, long = _batch([10, 7]), _batch([100, 90])
    losses = [float(graphed.step(b)) for b in (long, short, long, short, long)]
    assert len(graphed.graphs) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert graphed.pool_bytes()[0] > graphed.pool_bytes()[1] > 0
    with pytest.raises(ValueError, match="left padding"):
        graphed.step({k: v.flip(1) for k, v in short.items()})
