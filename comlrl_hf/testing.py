"""Tiny random models and in-process tokenizers: no hub, no network, well under a second.

These helpers back the test suite, and examples and users may use them to try the
trainers without downloading anything::

    >>> from comlrl_hf.testing import save_tiny_model
    >>> path = save_tiny_model("/tmp/tiny-llama", arch="llama", tokenizer_kind="bpe")
    >>> # AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)

Two architectures (Llama- and Qwen2-shaped) and two tokenizers with different
vocabularies (byte-level BPE and a SentencePiece-style Unigram) make the
heterogeneous code paths real.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

__all__ = ["CORPUS", "build_tokenizer", "build_tiny_model", "save_tiny_model", "TOKENIZER_KINDS", "ARCHITECTURES"]

CORPUS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Design a playground on Mars:",
    "The quick brown fox jumps over the lazy dog.",
    "Two agents write together; one plans and the other writes the answer.",
    "A short answer is fine, but a longer answer explains more about the city.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 and symbols like ( ) [ ] { } + - * / = < > ! ?",
    "def add(a, b):\n    return a + b\n",
    "Once upon a time a small dragon lived on a cloud above a busy market.",
    "user: hello\nassistant: hi there, how can I help you today?",
    "The reward is high when the second answer is two to three times longer.",
]

_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

TOKENIZER_KINDS = ("bpe", "unigram")
ARCHITECTURES = ("llama", "qwen2")
# AutoTokenizer reloads a Qwen2 folder as Qwen2Tokenizer (chosen by model_type), which
# rebuilds a byte-level pipeline: right for BPE, wrong for Unigram. Llama folders reload
# the tokenizer as saved, so the Unigram tokenizer pairs with Llama.
_DEFAULT_TOKENIZER = {"llama": "unigram", "qwen2": "bpe"}


def _unigram_vocab() -> list[tuple[str, float]]:
    counts: dict[str, int] = {}
    for text in CORPUS:
        for word in text.split():
            for piece in ("\u2581" + word, *word, "\u2581" + word[0]):
                counts[piece] = counts.get(piece, 0) + 1
    for char in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?()[]{}+-*/=<>'\"_\u2581":
        counts.setdefault(char, 1)
    total = sum(counts.values())
    scored = sorted(((piece, math.log(n / total)) for piece, n in counts.items()), key=lambda x: (-x[1], x[0]))
    return [("</s>", 0.0), ("<pad>", 0.0), ("<s>", 0.0), ("<unk>", 0.0)] + scored


@lru_cache(maxsize=None)
def _trained_backend(kind: str) -> str:
    """Train once per process and cache the serialized tokenizer (training is deterministic)."""
    texts = CORPUS * 20
    if kind == "bpe":
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=384,
            special_tokens=["<|endoftext|>", "<|pad|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    elif kind == "unigram":
        # tokenizers' UnigramTrainer is not reproducible across processes (hash-map order), so the
        # vocabulary is built here from corpus counts: words and characters scored by log-frequency.
        tk = Tokenizer(models.Unigram(_unigram_vocab(), unk_id=3, byte_fallback=False))
        tk.normalizer = normalizers.NFKC()
        tk.pre_tokenizer = pre_tokenizers.Metaspace()
        tk.decoder = decoders.Metaspace()
        return tk.to_str()
    else:
        raise ValueError(f"tokenizer_kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
    tk.train_from_iterator(texts, trainer)
    return tk.to_str()


def build_tokenizer(kind: str = "bpe") -> PreTrainedTokenizerFast:
    """A fast tokenizer trained in-process; `kind` is "bpe" (byte-level) or "unigram"."""
    backend = Tokenizer.from_str(_trained_backend(kind))
    if kind == "bpe":
        special = dict(eos_token="<|endoftext|>", pad_token="<|pad|>", bos_token="<|endoftext|>")
    else:
        special = dict(eos_token="</s>", pad_token="<pad>", bos_token="<s>", unk_token="<unk>")
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **special)
    tok.chat_template = _CHAT_TEMPLATE
    return tok


def build_tiny_model(
    arch: str = "llama",
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int | None = 0,
) -> torch.nn.Module:
    """A randomly initialised causal LM (~0.1 M parameters) sized to `tokenizer`'s vocabulary."""
    tokenizer = tokenizer or build_tokenizer(_DEFAULT_TOKENIZER.get(arch, "bpe"))
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    if seed is not None:
        torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(
    path: str | os.PathLike, arch: str = "llama", tokenizer_kind: str | None = None, *, seed: int | None = 0, **kwargs
) -> str:
    """Build a tiny model and its tokenizer and save both to `path`, loadable with `from_pretrained`."""
    tokenizer = build_tokenizer(tokenizer_kind or _DEFAULT_TOKENIZER.get(arch, "bpe"))
    model = build_tiny_model(arch, tokenizer, seed=seed, **kwargs)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
