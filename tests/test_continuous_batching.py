"""Many requests decoded together over a paged cache, against each decoded alone; continuous batching."""
import pytest
import torch

import helpers  # noqa: F401  (first: sets the Triton interpreter up on a machine without a GPU)
from helpers.llama.decoding import Decoder
from helpers.llama.memory_caps import GiB, context_bytes
from helpers.llama.models import build_model
from helpers.llama.kernel_set import torch_paged_attention
from helpers.llama.paged_decoding import PagedDecoder, course_kernels
from helpers.studies.continuous_batching import (batch_decode_sweep, batched_logits_check, dataset_requests,
                                                 measured_capacity, poisson_arrivals, serve)
from helpers.llama.page_pool import OutOfPages

# bf16 activations, a prompt's forward at once against one token at a time: about 1e-2 of the largest logit;
# a step attending one position short is off by 0.13 to 0.3
TOL = 3e-2


@pytest.fixture(scope="module")
def model():
    model, _ = build_model("tiny", "cpu", vocab_size=256, seed=1)
    return model.eval()


def _prompt(n, seed):
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed))


def _alone(model, prompt, answer):
    """The Decoder's logits (batch 1, one token at a time) at the prompt's last token and at each answer token
    but the last, fed ``prompt`` then ``answer``."""
    tokens = torch.cat([prompt, torch.tensor(answer[:-1], dtype=torch.long)])[None]
    return Decoder(model, max_len=tokens.shape[1]).teacher_forced(tokens)[0, len(prompt) - 1:]


def _close(ours, ref):
    return ((ours - ref).abs() / ref.abs().amax(-1, keepdim=True)).max().item() < TOL


def _decode(dec, requests, steps, max_new=None):
    """Add ``requests`` {id: prompt}, step ``steps`` times; each request's logits and greedy tokens."""
    logits = {r: [dec.add(r, p, max_new or steps + 1)] for r, p in requests.items()}
    tokens = {r: [int(lg[0].argmax())] for r, lg in logits.items()}
    for _ in range(steps):
        nxt = dec.step()
        for row, r in enumerate(dec.requests):
            logits[r].append(dec.logits[row])
            tokens[r].append(nxt[r])
    return {r: torch.stack(lg) for r, lg in logits.items()}, tokens


def test_a_ragged_batch_matches_each_request_decoded_alone(model):
    """Four prompt lengths (one page, a page and a bit, three pages) in one batch, through the Triton kernel;
    two requests cross a page boundary mid-decode (lengths 8 -> 9 and 16 -> 17 with pages of 8)."""
    prompts = {"a": _prompt(3, 0), "b": _prompt(8, 1), "c": _prompt(17, 2), "d": _prompt(14, 3)}
    dec = PagedDecoder(model, num_pages=16, page_tokens=8, max_len=32)
    logits, tokens = _decode(dec, prompts, steps=4)
    assert [len(dec.pool.pages(r)) for r in prompts] == [1, 2, 3, 3]  # b and d took a page mid-decode
    for r, prompt in prompts.items():
        assert _close(logits[r], _alone(model, prompt, tokens[r])), r
    for r in prompts:  # greedy: every token the argmax of the logits before it
        assert tokens[r] == logits[r].argmax(-1).tolist(), r


def test_pages_are_freed_on_finish_and_reused(model):
    dec = PagedDecoder(model, num_pages=6, page_tokens=4, max_len=16, attention=torch_paged_attention)
    _decode(dec, {"a": _prompt(7, 0), "b": _prompt(4, 1)}, steps=2, max_new=8)
    held = dec.pool.pages("a")
    dec.finish("a")
    assert dec.requests == ["b"] and dec.pool.free_pages == 6 - 2
    prompt = _prompt(9, 2)  # three pages, as a held
    logits = [dec.add("c", prompt, 4)]
    assert sorted(dec.pool.pages("c")) == sorted(held)  # a's pages, with a's keys and values in them still
    tokens = [int(logits[0].argmax())]
    for _ in range(3):
        tokens.append(dec.step()["c"])
        logits.append(dec.logits[dec.requests.index("c")])
    assert _close(torch.stack(logits), _alone(model, prompt, tokens))
    dec.finish("b")
    dec.finish("c")
    assert dec.pool.free_pages == 6 and dec.requests == []


def test_never_fits_and_out_of_pages_leave_running_requests_intact(model):
    dec = PagedDecoder(model, num_pages=4, page_tokens=4, attention=torch_paged_attention)
    assert dec.max_len == 16
    prompt = _prompt(4, 0)
    first = dec.add("a", prompt, 9)
    with pytest.raises(ValueError, match="'big': 10 prompt \\+ 7 new tokens can never fit; a request holds at most 16"):
        dec.add("big", _prompt(10, 1), 7)
    dec.add("b", _prompt(8, 2), 4)  # a: 1 page, b: 2 pages; one free
    with pytest.raises(OutOfPages, match="request 'c'"):
        dec.add("c", _prompt(5, 3), 1)  # two pages: not now
    assert dec.requests == ["a", "b"] and dec.pool.free_pages == 1
    before = {r: (dec.pool.pages(r), dec.pool.length(r)) for r in dec.requests}
    with pytest.raises(OutOfPages, match="2 requests need a new page and 1 of the pool's 4 are free"):
        dec.step()  # a (4 tokens) and b (8) both cross into a new page
    assert {r: (dec.pool.pages(r), dec.pool.length(r)) for r in dec.requests} == before
    dec.finish("b")
    logits, tokens = [first], [int(first.argmax())]
    for _ in range(3):
        tokens.append(dec.step()["a"])
        logits.append(dec.logits[0])
    assert _close(torch.stack(logits), _alone(model, prompt, tokens))


def test_bad_input_is_a_clear_error(model):
    dec = PagedDecoder(model, num_pages=4, page_tokens=4, attention=torch_paged_attention)
    with pytest.raises(ValueError, match="no running requests"):
        dec.step()
    with pytest.raises(ValueError, match="non-empty 1-D"):
        dec.add("a", [], 1)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        dec.add("a", torch.zeros(1, 3, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        dec.add("a", [5, 6], 0)
    assert dec.pool.free_pages == 4
    dec.add("a", [5, 6], 2)
    with pytest.raises(ValueError, match="already running"):
        dec.add("a", [5], 1)
    with pytest.raises(ValueError, match="unknown request 'x'; running: \\['a'\\]"):
        dec.finish("x")
    with pytest.raises(ValueError, match="unknown request 'x'"):
        dec.step({"x": 3})
    dec.step()
    dec.step()
    with pytest.raises(ValueError, match="'a' holds 4 tokens, its limit"):
        dec.step()
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        PagedDecoder(torch.nn.Linear(2, 2), num_pages=4)


class FakeClock:
    """Time that moves only when the decoder works (a prefill 4 ms, a step 10 ms) or the loop sleeps."""

    def __init__(self, dec, prefill_s=0.004, step_s=0.010):
        self.now, self.sleeps = 100.0, []
        add, step = dec.add, dec.step

        def timed(fn, seconds):
            def run(*args):
                self.now += seconds
                return fn(*args)
            return run
        dec.add, dec.step = timed(add, prefill_s), timed(step, step_s)

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_continuous_batching_with_a_fake_clock(model):
    """Five requests; the pool (5 pages of 4) holds the first two with their growth reserved, so the third
    (2 pages) waits for the first to finish and the fourth (1 page) waits behind it; a gap in the arrivals
    leaves the loop idle, waiting."""
    dec = PagedDecoder(model, num_pages=5, page_tokens=4, attention=torch_paged_attention)
    clock = FakeClock(dec)
    arrivals = [(0.0, _prompt(5, 0).tolist(), 3), (0.0, _prompt(3, 1).tolist(), 5), (0.005, _prompt(6, 2).tolist(), 2),
                (0.006, _prompt(2, 3).tolist(), 1), (1.0, _prompt(4, 4).tolist(), 4)]
    served = serve(dec, arrivals, arrival_rate=5.0, clock=clock, sleep=clock.sleep)
    assert [len(a) for a in served.answers] == [3, 5, 2, 1, 4]
    assert dec.requests == [] and dec.pool.free_pages == 5
    first = served.requests[0]
    assert first["ttft_s"] == pytest.approx(0.004)  # arrived with nothing ahead: its prefill
    assert served.requests[1]["ttft_s"] == pytest.approx(0.008)  # after the first one's prefill
    # a finishes after two steps (t = 0.028 s): c joins (prefill to 0.032, arrived at 0.005), then d (to 0.036)
    assert [r["ttft_s"] for r in served.requests[2:4]] == pytest.approx([0.027, 0.030])
    last = served.requests[4]
    assert last["ttft_s"] == pytest.approx(0.004) and last["tpot_s"] == pytest.approx(0.010)  # alone by then
    assert len(clock.sleeps) == 1 and clock.sleeps[0] > 0.5  # idle until t = 1 s
    for r in served.requests:
        assert r["ttft_s"] >= 0.004 and (r["tpot_s"] is None) == (r["tokens"] == 1)
        if r["tpot_s"] is not None:
            assert 0.010 <= r["tpot_s"] <= 0.010 + 0.004 * len(arrivals)  # a step, plus prefills in between
    s = served.summary
    assert s["what"] == "continuous" and s["arrival_rate"] == 5.0 and s["tokens"] == 15
    assert s["seconds"] == pytest.approx(clock.now - 100.0)
    assert s["tokens_per_s"] == pytest.approx(15 / s["seconds"])
    assert s["ttft_ms"] > 0 and s["tpot_ms"] >= 10.0
    with pytest.raises(ValueError, match="arrival 0: a 30-token prompt and a 3-token answer never fit"):
        serve(dec, [(0.0, [5] * 30, 3)], clock=clock, sleep=clock.sleep)


def test_batch_decode_sweep_records(model):
    ticks = iter(range(100))
    records = batch_decode_sweep(model, [1, 3], context=5, steps=2, page_tokens=4, clock=lambda: next(ticks),
                                 attention=torch_paged_attention)
    assert [(r["what"], r["batch"], r["context"]) for r in records] == [("batch_decode", 1, 5), ("batch_decode", 3, 5)]
    assert [r["tokens_per_s"] for r in records] == [1.0, 3.0]  # one fake second a step: the batch's tokens a second
    assert [r["step_ms"] for r in records] == [1000.0, 1000.0]


def test_padding_rows_change_no_request_and_write_only_the_spare_page(model):
    """A graphed step pads the batch up to its bucket; here the padding runs without a graph (on the CPU)."""
    prompts = {"a": _prompt(5, 0), "b": _prompt(9, 1)}
    plain = PagedDecoder(model, num_pages=8, page_tokens=4, max_len=16, attention=torch_paged_attention)
    padded = PagedDecoder(model, num_pages=8, page_tokens=4, max_len=16, attention=torch_paged_attention)
    padded._rows = lambda batch: batch + 3
    for dec in (plain, padded):
        for r, p in prompts.items():
            dec.add(r, p, 4)
    for _ in range(3):
        assert plain.step() == padded.step()
        assert padded.logits.shape == plain.logits.shape and _close(padded.logits, plain.logits)
    spare = padded.spare
    assert torch.equal(padded.k_pages[:, :spare], plain.k_pages[:, :spare])
    assert padded.k_pages[:, spare].abs().sum() > 0 and plain.k_pages[:, spare].abs().sum() == 0


def test_batched_check_covers_the_wide_path_and_holds(model):
    """Past ``max_rows`` rows every projection goes through the dequantised weight (here: past one row)."""
    record = batched_logits_check(model, [3, 5], 8, page_tokens=4, **{**course_kernels(), "max_rows": 1})
    assert record["ok"] and (record["largest_batch"], record["smallest_batch"]) == (2, 1)
    assert record["max_rel_error_wide_steps"] is not None and record["max_rel_error_steps"] is not None
    with pytest.raises(ValueError, match="prompt lengths from 1 to total - 1 = 7"):
        batched_logits_check(model, [3, 8], 8)


def test_a_wrong_wide_path_fails_the_batched_check(model):
    wrong = {"max_rows": 1, "wide_linear": lambda x, module: 1.1 * module(x)}

    assert not batched_logits_check(model, [3, 5], 8, page_tokens=4, **wrong)["ok"]


def test_poisson_arrivals_and_dataset_requests():
    pairs = dataset_requests([2, 3, 4, 5] * 100, [9, 10, 12, 20] * 100, 400, seed=3)
    assert sorted(pairs) == sorted([(2, 7), (3, 7), (4, 8), (5, 15)] * 100)  # every text once, prompt + answer = length
    arrivals = poisson_arrivals(pairs, rate=20.0, vocab_size=50, seed=1)
    times = [t for t, _, _ in arrivals]
    assert times == sorted(times) and 0.8 < len(times) / times[-1] / 20.0 < 1.2  # about 20 a second
    assert [(len(p), a) for _, p, a in arrivals] == pairs and max(max(p) for _, p, _ in arrivals) < 50
    assert {t for t, _, _ in poisson_arrivals(pairs[:5], None, 50)} == {0.0}
    for bad in (0.0, float("inf")):
        with pytest.raises(ValueError, match="rate must be > 0 and finite"):
            poisson_arrivals(pairs, bad, 50)
    with pytest.raises(ValueError, match="1 <= n <= 4"):
        dataset_requests([1, 2, 3, 4], [5, 6, 7, 8], 5)


def test_graphs_need_a_gpu(model):
    """The fixture's model is on the CPU, whatever the machine has."""
    with pytest.raises(ValueError, match="graph=True needs the model on a CUDA device"):
        PagedDecoder(model, num_pages=4, graph=True)


@pytest.fixture(scope="module")
def gpu_model():
    model, _ = build_model("tiny", "cuda", vocab_size=256, seed=1)
    return model.eval()


@pytest.mark.gpu
def test_graphed_steps_equal_eager_steps_across_buckets(gpu_model):
    """Five requests (bucket 8, three padding rows), then one finishes (bucket 4), then a new one joins."""
    decoders = [PagedDecoder(gpu_model, num_pages=40, page_tokens=4, max_len=32, graph=g, **course_kernels())
                for g in (False, True)]
    for dec in decoders:
        for r in range(5):
            dec.add(r, _prompt(3 + 2 * r, r).cuda(), 12)
    for step in range(8):
        if step == 3:
            for dec in decoders:
                dec.finish(0)
        if step == 5:
            for dec in decoders:
                dec.add("late", _prompt(6, 9).cuda(), 6)
        eager, graphed = (dec.step() for dec in decoders)
        assert eager == graphed
        assert _close(decoders[1].logits, decoders[0].logits)
    assert sorted(decoders[1]._graphs) == [4, 8]


@pytest.mark.gpu
def test_measured_capacity_fills_the_pool_under_the_cap(gpu_model):
    cfg = gpu_model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    page_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 4 * head_dim * gpu_model.dtype.itemsize  # K, V
    # a headroom that leaves about 300 pages (50 requests of 24 tokens, 6 pages each) for the pool
    headroom = (2 * GiB - context_bytes() - torch.cuda.memory_allocated() - 300 * page_bytes) / GiB
    record = measured_capacity(gpu_model, 2.0, context=20, steps=3, page_tokens=4, headroom_gib=headroom)
    assert record["measured"] and record["requests"] == record["pages"] // 6 and 40 <= record["requests"] <= 60
    assert record["peak_reserved_gib"] <= 2.0 and record["tokens_per_s"] > 0
