"""Tokenizers for LLaMA-family models behind one small interface (:class:`Tokenizer`).

Three kinds, one module each:

* ``sentencepiece`` — Llama 1/2 ``tokenizer.model`` files and GGUF "llama" vocabularies;
* ``tiktoken_bpe`` — Llama 3's BPE ranks file with Meta's 256 special tokens;
* ``hf`` — a Hugging Face ``tokenizer.json`` (byte-level BPE or SentencePiece-style).

:func:`load_tokenizer` recognises a file's kind by content; :class:`StreamDecoder` turns
generated ids into text one token at a time. GGUF vocabularies are built into these kinds
by ``core.checkpoints.gguf_vocab``.
"""
from core.tokenizer.base import LLAMA3_PATTERN, LLAMA3_SPECIAL_TOKENS, Tokenizer, bytes_to_unicode
from core.tokenizer.hf import HFTokenizer
from core.tokenizer.loading import load_tokenizer
from core.tokenizer.sentencepiece import SentencePieceTokenizer
from core.tokenizer.stream import StreamDecoder
from core.tokenizer.tiktoken_bpe import TiktokenTokenizer

__all__ = [
    "LLAMA3_PATTERN",
    "LLAMA3_SPECIAL_TOKENS",
    "Tokenizer",
    "SentencePieceTokenizer",
    "TiktokenTokenizer",
    "HFTokenizer",
    "StreamDecoder",
    "load_tokenizer",
    "bytes_to_unicode",
]
