import re
import statistics

import pytest
import torch

from helpers.llama import data

CHAT = re.compile(r"^<s>\[INST\] \S.* \[/INST\] \S.* </s>$", re.S)


@pytest.fixture(scope="module")
def texts():
    return data.standin_texts()


def test_target_lengths_span_the_original_range():
    lengths = data.target_lengths(1000, seed=3)
    assert len(lengths) == 1000
    assert min(lengths) == data.MIN_CHARS == 58 and max(lengths) == data.MAX_CHARS == 11_400
    assert 500 < statistics.median(lengths) < 1500  # right-skewed: most texts short, a long tail
    assert statistics.mean(lengths) > statistics.median(lengths)
    assert sorted(lengths) == sorted(data.target_lengths(1000, seed=4))  # the seed only shuffles


def test_standin_has_the_chat_format_and_the_target_lengths(texts):
    targets = data.target_lengths()
    assert len(texts) == 1000
    assert all(CHAT.match(t) for t in texts)
    assert [len(t) for t in texts] == targets  # exactly, whatever the Python version's docstrings
    assert (min(map(len, texts)), max(map(len, texts))) == (58, 11_400)


def test_offline_load_falls_back_to_the_standin(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    texts, source = data.load_texts(50)
    assert "stand-in" in source and len(texts) == 50


def test_local_tokenizer_matches_llama_token_lengths(texts):
    tok = data.train_tokenizer(texts, 32000)
    assert len(tok) <= 32000
    assert tok.convert_tokens_to_ids(["<unk>", "<s>", "</s>"]) == [data.PAD_ID, data.BOS_ID, data.EOS_ID]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    chars_per_token = sum(map(len, texts)) / sum(map(len, ids))
    assert 3.4 < chars_per_token < 4.2  # Llama-2 on English: about 3.8
    assert 2600 < max(map(len, ids)) < 3400  # the longest text: about 3,000 tokens
    assert tok.decode(ids[0]) == texts[0]


def test_batches_pad_to_the_longest_and_start_with_the_longest_texts():
    ids = [[5] * n for n in (3, 9, 4, 7, 2, 6)]
    batches = data.make_batches(ids, batch_size=2, steps=3)
    first = batches[0]
    assert first["input_ids"].shape == (2, 9)
    assert sorted(first["attention_mask"].sum(1).tolist()) == [7, 9]
    for b in batches:
        pad = b["attention_mask"] == 0
        assert (b["labels"][pad] == -100).all() and (b["input_ids"][pad] == data.PAD_ID).all()
        assert b["input_ids"].shape[1] == int(b["attention_mask"].sum(1).max())
    again = data.make_batches(ids, batch_size=2, steps=3)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again))
    assert data.make_batches(ids, 2, 1, max_len=4)[0]["input_ids"].shape == (2, 4)


@pytest.mark.parametrize("kwargs,match", [({"batch_size": 0}, "batch_size"), ({"steps": 0}, "steps"),
                                          ({"max_len": 1}, "max_len"), ({"batch_size": 7}, "larger than")])
def test_bad_batch_arguments(kwargs, match):
    args = {"batch_size": 2, "steps": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        data.make_batches([[1, 2, 3]] * 6, **args)


def test_prompt_lengths_count_the_tokens_up_to_the_end_of_the_prompt(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prepared = data.prepare(60, vocab_size=2000)
    texts, _ = data.load_texts(60)
    tok = data.train_tokenizer(texts, 2000)
    for ids, p, text in zip(prepared.token_ids, prepared.prompt_lengths, texts):
        assert 1 <= p < len(ids)
        assert tok.decode(ids[:p]).endswith(data.END_OF_PROMPT) and data.END_OF_PROMPT not in tok.decode(ids[p:])
