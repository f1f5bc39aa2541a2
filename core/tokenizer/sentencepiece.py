"""SentencePiece tokenizers: Llama 1/2 ``tokenizer.model`` files and GGUF "llama" vocabularies."""
from __future__ import annotations

from pathlib import Path

from core.errors import TokenizerError, one_line
from core.tokenizer.base import TokenizerBase, native_call, read_tokenizer_file, valid_text


class SentencePieceTokenizer(TokenizerBase):
    """A SentencePiece model, from a ``tokenizer.model`` path or its serialized bytes."""

    kind = "sentencepiece"

    def __init__(self, model_path_or_proto: str | Path | bytes):
        import sentencepiece as spm  # why: 0.1 s at start-up, only for SentencePiece models

        if isinstance(model_path_or_proto, (bytes, bytearray)):
            data, where = bytes(model_path_or_proto), "serialized SentencePiece model"
        else:
            where = str(model_path_or_proto)
            data = read_tokenizer_file(model_path_or_proto)
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(data)
        except Exception as exc:
            raise TokenizerError(f"not a valid SentencePiece model: {where} ({one_line(exc)})") from None
        self._sp = sp
        self.source = where
        self.vocab_size = sp.get_piece_size()
        self.bos_id = _none_if_negative(sp.bos_id())
        self.eos_id = _none_if_negative(sp.eos_id())
        self.pad_id = _none_if_negative(sp.pad_id())
        n = self.vocab_size
        self.special_tokens = {
            sp.id_to_piece(i): i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)
        }
        self._control = {i for i in self.special_tokens.values() if sp.is_control(i)}
        self.stop_ids = self.collect_stop_ids()
        self.add_dummy_prefix = _sp_adds_dummy_prefix(sp)
        self._bytes_cache: dict[int, bytes] = {}

    @property
    def processor(self):
        """The ``sentencepiece.SentencePieceProcessor`` (its model proto and piece types, for writers)."""
        return self._sp

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        # SentencePiece never matches control symbols in input text, so no escaping needed.
        text = valid_text(text)
        return self._wrap(native_call(lambda: self._sp.encode(text), "the tokenizer failed on this text")
                          if text else [], bos, eos)

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode(list(ids))

    def token_bytes(self, id: int) -> bytes:
        cached = self._bytes_cache.get(id)
        if cached is not None:
            return cached
        sp = self._sp
        if id < 0 or id >= self.vocab_size:
            raise IndexError(f"token id {id} out of range for a vocabulary of {self.vocab_size}")
        if sp.is_control(id) or sp.is_unused(id):
            out = b""
        elif sp.is_unknown(id):
            out = " \u2047 ".encode()  # what SentencePiece's decode prints for <unk>
        elif sp.is_byte(id):
            out = bytes([int(sp.id_to_piece(id)[3:5], 16)])
        else:
            out = sp.id_to_piece(id).replace("\u2581", " ").encode("utf-8")
        self._bytes_cache[id] = out
        return out

    def id_to_piece(self, id: int) -> str:
        return self._sp.id_to_piece(id)


def _sp_adds_dummy_prefix(sp) -> bool:
    try:
        pieces = sp.encode("a", out_type=str)
    except Exception:
        return False
    return bool(pieces) and pieces[0].startswith("\u2581")


def _none_if_negative(i: int) -> int | None:
    return None if i is None or i < 0 else int(i)
