"""A Hugging Face ``tokenizer.json`` (byte-level BPE or SentencePiece-style)."""
from __future__ import annotations

import re
from typing import Iterable

from core import limits
from core.errors import TokenizerError
from core.tokenizer.base import (UNICODE_TO_BYTE, TokenizerBase, native_call, read_tokenizer_file, readable,
                                 valid_text)

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Encoded once at load: letters, digits, punctuation, spaces, a line break and non-ASCII
# reach the normalizer, pre-tokenizer and model, so one that can never encode is refused
# there, not on the first message.
_PROBE = "Hello, world! 123 \u00e9t\u00e9 \u65e5\u672c\n\tx  y"


class HFTokenizer(TokenizerBase):
    """A Hugging Face ``tokenizer.json`` (path, JSON text, or a ``tokenizers.Tokenizer``).

    ``bos_token``/``eos_token`` name the BOS/EOS tokens when the usual spellings
    (``<|begin_of_text|>``/``<s>``, ``<|end_of_text|>``/``</s>``) are not the right ones;
    ``extra_stop_tokens`` adds token texts that end generation (e.g. from
    ``generation_config.json``).
    """

    kind = "hf"

    def __init__(
        self,
        tokenizer_json_path_or_str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        extra_stop_tokens: Iterable[str] = (),
        source: str | None = None,
    ):
        from tokenizers import Tokenizer as _HFTok  # why: 0.1 s at start-up, only for tokenizer.json models

        src = tokenizer_json_path_or_str
        if isinstance(src, _HFTok):
            tok, where = src, "tokenizers.Tokenizer"
        elif isinstance(src, str) and src.lstrip().startswith("{"):
            where = source or "tokenizer.json text"
            tok = _hf_from(lambda: _HFTok.from_str(src), where)
        else:
            where = str(src)
            # Read here (bounded, regular files only, nesting-limited), parsed from text:
            # tokenizers' from_file would read anything, and cannot open non-UTF-8 names.
            data = read_tokenizer_file(src)
            limits.parse_json(data, file=where, error=TokenizerError)
            text = data.decode("utf-8")
            tok = _hf_from(lambda: _HFTok.from_str(text), where)
        # The one switch that keeps added *special* tokens from being matched inside input
        # text: they are then tokenized like any other characters. Splitting the text
        # around special spellings instead would still hand them to the added-token matcher.
        tok.encode_special_tokens = True
        self._tok = tok
        self.source = where
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        added = tok.get_added_tokens_decoder()
        self.special_tokens = {t.content: i for i, t in added.items() if t.special}
        self._special_set = set(self.special_tokens.values())
        self._added_text = {i: t.content for i, t in added.items() if not t.special}
        self._byte_level = "ByteLevel" in repr(tok.decoder) or "ByteLevel" in repr(tok.pre_tokenizer)
        self.bos_id = self._find(bos_token, ("<|begin_of_text|>", "<s>", "<bos>"))
        self.eos_id = self._find(eos_token, ("<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"))
        self.pad_id = self._find(None, ("<pad>", "[PAD]"))
        extra = set()
        for text in extra_stop_tokens:
            i = tok.token_to_id(text)
            if i is None:
                raise TokenizerError(f"stop token {text!r} is not in {where}")
            extra.add(i)
        self.stop_ids = self.collect_stop_ids(extra)
        native_call(lambda: tok.encode(_PROBE, add_special_tokens=False),
                    f"the tokenizer in {where} cannot encode text", quiet=True)
        if not self._byte_level:
            probe = native_call(lambda: tok.encode("a", add_special_tokens=False).tokens,
                                f"not a valid tokenizer.json: {where}", quiet=True)
            self.add_dummy_prefix = bool(probe) and probe[0].startswith("\u2581")
        self._bytes_cache: dict[int, bytes] = {}

    @property
    def backend(self):
        """The ``tokenizers.Tokenizer`` (its tokenizer.json, for writers)."""
        return self._tok

    def _find(self, explicit: str | None, candidates: tuple[str, ...]) -> int | None:
        if explicit is not None:
            i = self._tok.token_to_id(explicit)
            if i is None:
                raise TokenizerError(f"token {explicit!r} is not in {self.source}")
            return i
        for text in candidates:
            i = self._tok.token_to_id(text)
            if i is not None:
                return i
        return None

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        text = valid_text(text)
        ids = native_call(lambda: self._tok.encode(text, add_special_tokens=False).ids,
                          "the tokenizer failed on this text", quiet=True) if text else []
        return self._wrap(ids, bos, eos)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self, id: int) -> bytes:
        cached = self._bytes_cache.get(id)
        if cached is not None:
            return cached
        if id in self._special_set:
            out = b""
        elif id in self._added_text:
            out = self._added_text[id].encode("utf-8")  # added tokens are stored as raw text
        else:
            piece = self._tok.id_to_token(id)
            if piece is None:
                raise IndexError(f"token id {id} out of range for a vocabulary of {self.vocab_size}")
            if self._byte_level:
                try:
                    out = bytes(UNICODE_TO_BYTE[c] for c in piece)
                except KeyError:
                    out = piece.encode("utf-8")
            else:
                m = _BYTE_PIECE.fullmatch(piece)
                out = bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode("utf-8")
        self._bytes_cache[id] = out
        return out

    def id_to_piece(self, id: int) -> str:
        if self._byte_level and id not in self._special_set and id not in self._added_text:
            return readable(self.token_bytes(id))
        piece = self._tok.id_to_token(id)
        if piece is None:
            raise IndexError(f"token id {id} out of range for a vocabulary of {self.vocab_size}")
        return piece


def _hf_from(build, where: str):
    return native_call(build, f"not a valid tokenizer.json: {where}")
