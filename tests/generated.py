"""Tokenizer files made at test time, for tests that need a tokenizer of Meta's kind but not
Meta's own ids (Meta's files may not be shipped: see ../shared/fixtures/README.md).

A SentencePiece BPE model like Llama 2's (unk 0, bos 1, eos 2, byte fallback, vocabulary
32000) is trained here by the sentencepiece package on a small generated corpus; the ids
past what the corpus teaches are placeholder pieces, so a model of Llama 2's vocabulary
size pairs with it and every id it samples decodes to text.
"""
from __future__ import annotations

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
        character_coverage=1.0, num_threads=1, minloglevel=2)
    path.write_bytes(out.getvalue())
    return path


def hello_world_ids(folder: Path) -> list[int]:
    """The ids of "Hello world" (no BOS) the folder's tokenizer must give: Meta's published
    ones where it holds Meta's Llama 2 file, else the file's own encoding."""
    tok_file = folder / "tokenizer.model"
    if hashlib.sha256(tok_file.read_bytes()).hexdigest() == LLAMA2_SHA256:
        return LLAMA2_HELLO_WORLD
    return load_tokenizer(tok_file).encode("Hello world", bos=False)
