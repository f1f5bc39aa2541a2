"""Tokenizer files made at test time, for tests that need a tokenizer of Meta's kind but not
Meta's own ids (Meta's files may not be shipped: see ../shared/fixtures/README.md).

A tiktoken ranks file like Llama 3's has 128,000 ranks, so its special tokens get Meta's ids
(128000 on): the 256 bytes, the merges a small corpus needs for common words, then inert
placeholders that no merge can form.

A SentencePiece BPE model like Llama 2's (unk 0, bos 1, eos 2, byte fallback, vocabulary
32000) is trained here by the sentencepiece package on a small generated corpus; the ids
past what the corpus teaches are placeholder pieces, so a model of Llama 2's vocabulary
size pairs with it and every id it samples decodes to text.
"""
from __future__ import annotations

import base64
import hashlib
import io
import random
from pathlib import Path

import sentencepiece as spm

from core.tokenizer import load_tokenizer

WORDS = ("once upon a time there was a little girl named Lily she loved to play outside with her dog "
         "the quick brown fox jumps over the lazy cat Hello world hi everyone said good day story "
         "tell me about , . ! ? 0 1 2 3 4 5 6 7 8 9").split()
LEARNED = 200  # pieces the corpus teaches (well within what it can teach: the vocabulary is exact)
LLAMA2_SHA256 = "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347"  # fixtures README
LLAMA2_HELLO_WORLD = [15043, 3186]  # Meta's ids for "Hello world" (fixtures README)
SPECIALS = 3  # <unk> <s> </s>
BYTES = 256


def sentencepiece_model(path: Path, vocab_size: int = 32000, seed: int = 0) -> Path:
    """Write a Llama 2-kind SentencePiece model of exactly ``vocab_size`` pieces to ``path``."""
    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(2000)]
    placeholders = [f"<unused{i}>" for i in range(vocab_size - SPECIALS - BYTES - LEARNED)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=out, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, user_defined_symbols=placeholders, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        character_coverage=1.0, num_threads=1, minloglevel=2,
        # Llama 2's text handling: no normalization, spaces kept as typed, digits split
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        split_digits=True, allow_whitespace_only_pieces=True)
    path.write_bytes(out.getvalue())
    return path


def hello_world_ids(path: Path) -> list[int]:
    """The ids of "Hello world" (no BOS) a tokenizer file (or a model folder's
    tokenizer.model) must give: Meta's published ones for Meta's Llama 2 file, else the
    file's own encoding."""
    tok_file = path / "tokenizer.model" if path.is_dir() else path
    if hashlib.sha256(tok_file.read_bytes()).hexdigest() == LLAMA2_SHA256:
        return LLAMA2_HELLO_WORLD
    return load_tokenizer(tok_file).encode("Hello world", bos=False)


def tiktoken_ranks(path: Path, n_ranks: int = 128000) -> Path:
    """Write a Llama 3-kind ranks file ("base64 token, space, rank" lines) of ``n_ranks``."""
    tokens = [bytes([b]) for b in range(256)]
    seen = set(tokens)
    for word in WORDS:  # each word and its leading-space form, built up one byte at a time
        for text in (word.encode(), b" " + word.encode()):
            for end in range(2, len(text) + 1):
                if text[:end] not in seen:
                    seen.add(text[:end])
                    tokens.append(text[:end])
    tokens += [f"<unused{i}>".encode() for i in range(n_ranks - len(tokens))]
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)))
    return path
