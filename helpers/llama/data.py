"""The fine-tuning data: mlabonne/guanaco-llama2-1k when reachable, else an offline stand-in.

The stand-in has the original's shape: 1,000 texts in the Llama-2 chat format
``<s>[INST] question [/INST] answer </s>``, from 58 to 11,400 characters, the lengths spread
log-normally over that range (the original's own histogram is not available offline). The words
come from the docstrings of Python's standard library, which ship with every Python. Token lengths
matter more than the words: the batch that holds the longest text sets a step's peak memory,
because a batch is padded to its longest text.

The tokenizer is Llama-2's when reachable, else a byte-level BPE trained here on the same texts,
allowed up to Llama-2's vocabulary size (32,000; the model's embeddings and logits always have
that size). A tokenizer trained on the very texts it encodes compresses them better than
Llama-2's does English (about 3.8 characters a token, so 11,400 characters are about 3,000
tokens); capping its tokens at 8 bytes brings it back to that ratio, so the stand-in's token
lengths, which set the memory, match the original's.
"""
from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import results
from ..device import SCALE

DATASET = "mlabonne/guanaco-llama2-1k"
TOKENIZER = "meta-llama/Llama-2-7b-chat-hf"
N_TEXTS = 1000
MIN_CHARS, MAX_CHARS = 58, 11_400  # the original's shortest and longest text
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2  # <unk> doubles as padding, as in Llama-2 recipes
_MODULES = ("argparse", "asyncio", "base64", "bisect", "calendar", "collections", "configparser", "contextlib",
            "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fractions",
            "functools", "gzip", "hashlib", "heapq", "html.parser", "http.client", "http.server", "inspect",
            "io", "ipaddress", "itertools", "json", "logging", "mailbox", "math", "multiprocessing", "os",
            "pathlib", "pickle", "pprint", "random", "re", "shutil", "smtplib", "socket", "sqlite3",
            "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "typing",
            "unittest", "urllib.parse", "urllib.request", "uuid", "wave", "zipfile")
_QUESTIONS = ("What does {name} do?", "Explain {name} from the Python standard library.",
              "How do I use {name}?", "Describe the purpose of {name}.", "Tell me about {name}.")


def target_lengths(n: int = N_TEXTS, seed: int = 0) -> list[int]:
    """``n`` text lengths in characters: log-normal quantiles stretched to span 58..11,400 exactly."""
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    normal = statistics.NormalDist()
    z = [normal.inv_cdf((i + 0.5) / n) for i in range(n)]
    lo, hi = math.log(MIN_CHARS), math.log(MAX_CHARS)
    lengths = [round(math.exp(lo + (hi - lo) * (v - z[0]) / (z[-1] - z[0]))) for v in z]
    random.Random(seed).shuffle(lengths)
    return lengths


def docstring_pool() -> list[tuple[str, str]]:
    """(qualified name, docstring) of the public modules, classes and functions in ``_MODULES``."""
    pool: list[tuple[str, str]] = []
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        members = [(module_name, module)] + [(f"{module_name}.{n}", obj) for n, obj in sorted(vars(module).items())
                                             if not n.startswith("_")
                                             and (inspect.isclass(obj) or inspect.isfunction(obj))
                                             and obj.__module__ == module_name]
        for name, obj in members:
            doc = inspect.getdoc(obj)
            if doc and len(doc) >= 40:
                pool.append((name, " ".join(doc.split())))
    return pool


END_OF_PROMPT = "[/INST]"  # where a chat text's prompt ends and its answer begins


def _chat(question: str, answer: str) -> str:
    return f"<s>[INST] {question} {END_OF_PROMPT} {answer} </s>"


def standin_texts(n: int = N_TEXTS, seed: int = 0) -> list[str]:
    """The offline stand-in: ``n`` chat-format texts with the lengths of ``target_lengths``."""
    pool = docstring_pool()
    rng = random.Random(seed)
    texts = []
    for i, length in enumerate(target_lengths(n, seed)):
        name, doc = pool[i % len(pool)]
        question = rng.choice(_QUESTIONS).format(name=name)
        room = length - len(_chat(question, ""))
        if room < 8:  # the shortest texts: a one-word question
            question = name.rsplit(".", 1)[-1] + "?"
            room = length - len(_chat(question, ""))
        answer, j = doc, i
        while len(answer) < room:  # long answers continue with the next docstrings
            j += 1
            answer += " " + pool[j % len(pool)][1]
        cut = answer[:room].rstrip()  # a cut that ends in spaces is padded back to the target length
        texts.append(_chat(question, cut + "." * (room - len(cut))))
    return texts


def hub_reachable(host: str = "huggingface.co") -> bool:
    """Whether the Hugging Face hub answers (False at once when HF_HUB_OFFLINE is set)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        return False
    import socket

    try:
        socket.create_connection((host, 443), timeout=2).close()
        return True
    except OSError:
        return False


def load_texts(n: int = N_TEXTS, seed: int = 0) -> tuple[list[str], str]:
    """The training texts and where they came from: the original dataset when reachable, else the stand-in."""
    if hub_reachable():
        try:
            from datasets import load_dataset

            texts = list(load_dataset(DATASET, split="train")["text"])[:n]
            return texts, DATASET
        except Exception as error:  # no `datasets`, or the download failed: the stand-in is the documented fallback
            print(f"{DATASET} not loadable ({type(error).__name__}: {error}); using the offline stand-in")
    return standin_texts(n, seed), "offline stand-in (standard-library docstrings)"


def train_tokenizer(texts: list[str], vocab_size: int = 32000, max_token_bytes: int = 8):
    """A byte-level BPE tokenizer trained on ``texts``, with Llama-2's special tokens and ids.

    ``vocab_size`` is an upper bound (the texts may hold fewer merges); ``max_token_bytes`` caps a
    token's length, which sets how many characters a token covers (8: about 3.8, as Llama-2's).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials + merges), got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
                                  max_token_length=max_token_bytes)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<unk>")


def load_tokenizer(texts: list[str], vocab_size: int = 32000):
    """(tokenizer, where it came from): Llama-2's when reachable, else one trained on ``texts``."""
    if vocab_size == 32000 and hub_reachable():
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(TOKENIZER)
            tok.pad_token = tok.unk_token
            return tok, TOKENIZER
        except (OSError, ValueError) as error:
            print(f"{TOKENIZER} tokenizer not loadable ({type(error).__name__}); training one locally")
    return train_tokenizer(texts, vocab_size), f"byte-level BPE trained here, vocabulary {vocab_size}"


@dataclass(frozen=True)
class TokenizedData:
    """Token ids of every text, and where texts and tokenizer came from: what a sweep point reads."""

    token_ids: list[list[int]]
    vocab_size: int  # the model's (Llama-2's 32,000); every id is below it
    text_source: str
    tokenizer_source: str
    char_lengths: list[int]
    prompt_lengths: list[int] | None = None  # tokens of each text's "<s>[INST] ... [/INST]" (None: not counted)

    def save(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: Path) -> "TokenizedData":
        return cls(**json.loads(Path(path).read_text()))

    def token_lengths(self) -> list[int]:
        return [len(t) for t in self.token_ids]


def prepare(n: int = N_TEXTS, vocab_size: int = 32000, seed: int = 0) -> TokenizedData:
    """Load the texts and a tokenizer, and tokenize every text (no truncation: see ``make_batches``)."""
    texts, text_source = load_texts(n, seed)
    tokenizer, tokenizer_source = load_tokenizer(texts, vocab_size)
    # the texts carry their own "<s>"; Llama-2's tokenizer would add a second one
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    if max(max(t) for t in ids) >= vocab_size:
        raise ValueError(f"the tokenizer produced ids >= vocab_size {vocab_size}")
    prompts = tokenizer([t[:t.index(END_OF_PROMPT) + len(END_OF_PROMPT)] if END_OF_PROMPT in t else t for t in texts],
                        add_special_tokens=False)["input_ids"]
    return TokenizedData(ids, vocab_size, text_source, tokenizer_source, [len(t) for t in texts],
                         [min(len(p), len(t) - 1) for p, t in zip(prompts, ids)])


def make_batches(token_ids: list[list[int]], batch_size: int, steps: int, max_len: int | None = None,
                 seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``steps`` batches, each padded to its longest text (truncated to ``max_len`` if given).

    The first batch holds the ``batch_size`` longest texts: the batch of the epoch that holds the
    longest text is padded to it, so this one has the epoch's peak shape and its memory. The others
    are consecutive slices of one seeded shuffle: the same texts for every card and cap.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if max_len is not None and max_len < 2:
        raise ValueError(f"max_len must be >= 2 or None, got {max_len}")
    n = len(token_ids)
    if n < batch_size:
        raise ValueError(f"batch_size {batch_size} is larger than the data set ({n} texts)")
    longest = sorted(range(n), key=lambda i: -len(token_ids[i]))[:batch_size]
    order = list(range(n))
    random.Random(seed).shuffle(order)
    picks = [longest] + [[order[(s * batch_size + k) % n] for k in range(batch_size)] for s in range(steps - 1)]
    batches = []
    for idx in picks:
        seqs = [token_ids[i][:max_len] if max_len else token_ids[i] for i in idx]
        width = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, seq in enumerate(seqs):
            input_ids[row, :len(seq)] = torch.tensor(seq)
            mask[row, :len(seq)] = 1
        labels = input_ids.masked_fill(mask == 0, -100)
        batches.append({"input_ids": input_ids, "attention_mask": mask, "labels": labels})
    return batches


def data_file(scale: str = SCALE) -> Path:
    """The tokenized data every point reads; prepared once, then reused (prepared again if it predates the
    prompts' lengths)."""
    path = results.REPO_ROOT / "build" / "finetune-data" / f"{scale}.json"
    if not path.exists() or TokenizedData.load(path).prompt_lengths is None:
        prepare().save(path)
    return path
