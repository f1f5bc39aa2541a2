"""Streaming detokenization: generated ids to text, never half of a UTF-8 character."""
from __future__ import annotations

import codecs

from core.tokenizer.base import Tokenizer


class StreamDecoder:
    """Incremental detokenizer: push ids one by one, get text that never splits a character.

    ``strip_leading_space=True`` drops the single leading space of the first text emitted
    (SentencePiece's dummy prefix at the start of a reply).
    """

    def __init__(self, tokenizer: Tokenizer, *, strip_leading_space: bool = False):
        self._tok = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = strip_leading_space

    def push(self, token_id: int) -> str:
        """Text completed by ``token_id`` ("" while a UTF-8 character is still incomplete)."""
        data = self._tok.token_bytes(token_id)
        if not data:
            return ""
        return self._emit(self._utf8.decode(data))

    def flush(self) -> str:
        """Whatever is held back; bytes that never completed a character become U+FFFD."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if self._strip and text:
            self._strip = False
            if text[0] == " ":
                text = text[1:]
        return text
