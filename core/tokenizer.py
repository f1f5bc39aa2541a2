"""Tokenizers for LLaMA-family models behind one small interface.

Three kinds share the :class:`Tokenizer` API:

* ``sentencepiece`` — Llama 1/2 ``tokenizer.model`` files and GGUF "llama" vocabularies;
* ``tiktoken`` — Llama 3's BPE ranks file with Meta's 256 special tokens;
* ``hf`` — a Hugging Face ``tokenizer.json`` (byte-level BPE or SentencePiece-style).

Whatever the kind, :meth:`Tokenizer.encode` treats its input as ordinary text: a user who
types ``<|eot_id|>`` gets the characters, never the control id. Chat formats insert
special ids themselves (see ``core.chat_format``).

:class:`StreamDecoder` turns generated ids into text one token at a time without ever
emitting half of a UTF-8 character.
"""
from __future__ import annotations

import binascii
import codecs
import json
import re
import struct
from pathlib import Path
from typing import Iterable, Iterator

from core.errors import TokenizerError

__all__ = [
    "LLAMA3_PATTERN",
    "LLAMA3_SPECIAL_TOKENS",
    "Tokenizer",
    "SentencePieceTokenizer",
    "TiktokenTokenizer",
    "HFTokenizer",
    "StreamDecoder",
    "load_tokenizer",
    "sentencepiece_from_vocab",
    "hf_byte_level_from_vocab",
    "byte_level_vocab_from_ranks",
    "bytes_to_unicode",
]

#: Meta's Llama 3 pre-tokenizer regex (the cl100k pattern).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_LLAMA3_NUM_SPECIAL = 256
# Meta's list (llama-models, Llama 3.1 onwards); ids follow from the order, from 128000.
_LLAMA3_NAMED = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
#: All 256 Llama 3 special token names, in id order (the first is id 128000).
LLAMA3_SPECIAL_TOKENS: tuple[str, ...] = tuple(
    _LLAMA3_NAMED
    + [f"<|reserved_special_token_{2 + i}|>" for i in range(_LLAMA3_NUM_SPECIAL - len(_LLAMA3_NAMED))]
)

# Control tokens that end a turn in the Llama family; stop_ids gathers those present.
_STOP_TOKEN_TEXTS = ("<|end_of_text|>", "<|eot_id|>", "<|eom_id|>")

# Meta cuts inputs this way because tiktoken slows down badly on huge inputs and on very
# long runs without a whitespace/non-whitespace change.
_TIKTOKEN_MAX_CHARS = 400_000
_TIKTOKEN_MAX_RUN = 25_000
_LONG_RUN = re.compile(r"\s{%d,}|\S{%d,}" % (_TIKTOKEN_MAX_RUN + 1, _TIKTOKEN_MAX_RUN + 1))

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_B2U = bytes_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}


def _readable(data: bytes) -> str:
    """Bytes as text for a token inspector; bytes that are not valid UTF-8 become <0xNN>."""
    out = []
    i = 0
    while i < len(data):
        # Find the longest valid UTF-8 prefix; a lone lead/continuation byte shows as hex.
        for j in range(min(len(data), i + 4), i, -1):
            try:
                out.append(data[i:j].decode("utf-8"))
                i = j
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{data[i]:02X}>")
            i += 1
    return "".join(out)


class Tokenizer:
    """What every tokenizer kind offers; the engine and chat formats use only this."""

    kind: str = ""
    vocab_size: int = 0
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    stop_ids: set[int]
    special_tokens: dict[str, int]
    #: True when encoding adds SentencePiece's dummy "▁" prefix; a reply decoded on its own
    #: then starts with a space that ``StreamDecoder(strip_leading_space=True)`` removes.
    add_dummy_prefix: bool = False

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of ``text`` taken as plain text; BOS/EOS are added when asked and known."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens are left out."""
        raise NotImplementedError

    def token_bytes(self, id: int) -> bytes:
        """Raw bytes of one token (``b""`` for special/control tokens)."""
        raise NotImplementedError

    def id_to_piece(self, id: int) -> str:
        """A readable form of one token for a token inspector."""
        raise NotImplementedError

    def special_id(self, text: str) -> int | None:
        """Id of the special token spelled ``text``, or None."""
        return self.special_tokens.get(text)

    def _wrap(self, ids: list[int], bos: bool, eos: bool) -> list[int]:
        # A model without BOS/EOS still works; asking for one it lacks adds nothing.
        if bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def _collect_stop_ids(self, extra: Iterable[int] = ()) -> set[int]:
        stops = {self.special_tokens[t] for t in _STOP_TOKEN_TEXTS if t in self.special_tokens}
        if self.eos_id is not None:
            stops.add(self.eos_id)
        stops.update(extra)
        return stops

    def __repr__(self) -> str:
        return f"<{type(self).__name__} vocab={self.vocab_size} bos={self.bos_id} eos={self.eos_id}>"


# --------------------------------------------------------------------------- SentencePiece


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model, from a ``tokenizer.model`` path or its serialized bytes."""

    kind = "sentencepiece"

    def __init__(self, model_path_or_proto: str | Path | bytes):
        import sentencepiece as spm

        if isinstance(model_path_or_proto, (bytes, bytearray)):
            data, where = bytes(model_path_or_proto), "serialized SentencePiece model"
        else:
            where = str(model_path_or_proto)
            data = _read_bytes(model_path_or_proto)
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(data)
        except Exception as exc:
            raise TokenizerError(f"not a valid SentencePiece model: {where} ({_one_line(exc)})") from None
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
        self.stop_ids = self._collect_stop_ids()
        self.add_dummy_prefix = _sp_adds_dummy_prefix(sp)
        self._bytes_cache: dict[int, bytes] = {}

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        # SentencePiece never matches control symbols in input text, so no escaping needed.
        return self._wrap(self._sp.encode(text) if text else [], bos, eos)

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


# --------------------------------------------------------------------------- tiktoken


class TiktokenTokenizer(Tokenizer):
    """Llama 3's tokenizer: a tiktoken BPE ranks file plus Meta's 256 special tokens."""

    kind = "tiktoken"

    def __init__(self, ranks_path: str | Path):
        import tiktoken

        path = Path(ranks_path)
        ranks = _parse_ranks(_read_bytes(path), path)
        self.source = str(path)
        self._n_base = len(ranks)
        self.special_tokens = {name: self._n_base + i for i, name in enumerate(LLAMA3_SPECIAL_TOKENS)}
        try:
            self._enc = tiktoken.Encoding(
                name=path.name,
                pat_str=LLAMA3_PATTERN,
                mergeable_ranks=ranks,
                special_tokens=self.special_tokens,
            )
        except Exception as exc:
            raise TokenizerError(f"cannot build a tiktoken tokenizer from {path}: {_one_line(exc)}") from None
        self._names = {i: name for name, i in self.special_tokens.items()}
        self.vocab_size = self._enc.n_vocab
        self.bos_id = self.special_tokens["<|begin_of_text|>"]
        self.eos_id = self.special_tokens["<|end_of_text|>"]
        self.pad_id = None  # Meta's tokenizer has none (pad_id = -1)
        self.stop_ids = self._collect_stop_ids()

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        enc = self._enc
        ids: list[int] = []
        for chunk in _tiktoken_chunks(text):
            # allowed_special=set() + disallowed_special=(): special spellings are plain text.
            ids.extend(enc.encode(chunk, allowed_special=set(), disallowed_special=()))
        return self._wrap(ids, bos, eos)

    def decode(self, ids: list[int]) -> str:
        n = self._n_base
        return self._enc.decode([i for i in ids if i < n])

    def token_bytes(self, id: int) -> bytes:
        if id >= self._n_base:
            if id >= self.vocab_size:
                raise IndexError(f"token id {id} out of range for a vocabulary of {self.vocab_size}")
            return b""
        return self._enc.decode_single_token_bytes(id)

    def id_to_piece(self, id: int) -> str:
        name = self._names.get(id)
        return name if name is not None else _readable(self.token_bytes(id))


def _parse_ranks(data: bytes, path: Path) -> dict[bytes, int]:
    # Same format tiktoken.load.load_tiktoken_bpe reads, parsed here because that function
    # also copies every local file into a temp cache folder; map/zip keep the loop in C.
    parts = data.split()
    if not parts or len(parts) % 2:
        raise TokenizerError(f"not a tiktoken ranks file (lines of 'base64 rank'): {path}")
    try:
        return dict(zip(map(binascii.a2b_base64, parts[0::2]), map(int, parts[1::2])))
    except (binascii.Error, ValueError):
        raise TokenizerError(f"not a tiktoken ranks file (lines of 'base64 rank'): {path}") from None


def _tiktoken_chunks(text: str) -> Iterator[str]:
    if len(text) <= _TIKTOKEN_MAX_RUN:
        yield text
        return
    cuts = set(range(_TIKTOKEN_MAX_CHARS, len(text), _TIKTOKEN_MAX_CHARS))
    for m in _LONG_RUN.finditer(text):
        cuts.update(range(m.start() + _TIKTOKEN_MAX_RUN, m.end(), _TIKTOKEN_MAX_RUN))
    start = 0
    for cut in sorted(cuts):
        yield text[start:cut]
        start = cut
    yield text[start:]


# --------------------------------------------------------------------------- Hugging Face


class HFTokenizer(Tokenizer):
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
    ):
        from tokenizers import Tokenizer as _HFTok

        src = tokenizer_json_path_or_str
        if isinstance(src, _HFTok):
            tok, where = src, "tokenizers.Tokenizer"
        elif isinstance(src, str) and src.lstrip().startswith("{"):
            where = "tokenizer.json text"
            tok = _hf_from(lambda: _HFTok.from_str(src), where)
        else:
            where = str(src)
            if not Path(src).is_file():
                raise TokenizerError(f"tokenizer file not found: {where}")
            tok = _hf_from(lambda: _HFTok.from_file(str(src)), where)
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
        self.stop_ids = self._collect_stop_ids(extra)
        if not self._byte_level:
            probe = tok.encode("a", add_special_tokens=False).tokens
            self.add_dummy_prefix = bool(probe) and probe[0].startswith("\u2581")
        self._bytes_cache: dict[int, bytes] = {}

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
        ids = self._tok.encode(text, add_special_tokens=False).ids if text else []
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
                    out = bytes(_U2B[c] for c in piece)
                except KeyError:
                    out = piece.encode("utf-8")
            else:
                m = _BYTE_PIECE.fullmatch(piece)
                out = bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode("utf-8")
        self._bytes_cache[id] = out
        return out

    def id_to_piece(self, id: int) -> str:
        if self._byte_level and id not in self._special_set and id not in self._added_text:
            return _readable(self.token_bytes(id))
        piece = self._tok.id_to_token(id)
        if piece is None:
            raise IndexError(f"token id {id} out of range for a vocabulary of {self.vocab_size}")
        return piece


def _hf_from(build, where: str):
    try:
        return build()
    except Exception as exc:
        raise TokenizerError(f"not a valid tokenizer.json: {where} ({_one_line(exc)})") from None


# --------------------------------------------------------------------------- loading


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Open a tokenizer file, recognising its kind by content (not by name).

    A folder is searched for ``tokenizer.json`` then ``tokenizer.model``.
    Raises TokenizerError for a missing, unreadable or unknown file.
    """
    p = Path(path)
    if p.is_dir():
        for name in ("tokenizer.json", "tokenizer.model"):
            if (p / name).is_file():
                return load_tokenizer(p / name)
        raise TokenizerError(f"no tokenizer.json or tokenizer.model in {p}")
    data = _read_bytes(p)
    head = data[:4096]
    if head.lstrip()[:1] == b"{":
        try:
            text = data.decode("utf-8")
            if not isinstance(json.loads(text).get("model"), dict):
                raise ValueError
        except (UnicodeDecodeError, ValueError, AttributeError):
            raise TokenizerError(f"JSON file is not a Hugging Face tokenizer.json: {p}") from None
        return HFTokenizer(p)
    if _looks_like_ranks(head):
        return TiktokenTokenizer(p)
    if head[:4] == b"GGUF":
        raise TokenizerError(f"{p} is a GGUF model; its vocabulary is read by the GGUF checkpoint loader")
    if head[:1] == b"\x0a":  # ModelProto field 1 (pieces), length-delimited
        try:
            tok = SentencePieceTokenizer(data)
        except TokenizerError:
            pass
        else:
            tok.source = str(p)
            return tok
    raise TokenizerError(f"unrecognised tokenizer file (not tokenizer.json, tiktoken ranks or SentencePiece): {p}")


_RANKS_LINE = re.compile(rb"[A-Za-z0-9+/]+=*[ \t]+\d+\r?\n")


def _looks_like_ranks(head: bytes) -> bool:
    lines = head.split(b"\n")[:-1]  # the last may be cut mid-line
    return bool(lines) and all(_RANKS_LINE.fullmatch(line + b"\n") for line in lines[:32])


def _read_bytes(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise TokenizerError(f"tokenizer file not found: {path}") from None
    except IsADirectoryError:
        raise TokenizerError(f"expected a tokenizer file, got a folder: {path}") from None
    except OSError as exc:
        raise TokenizerError(f"cannot read tokenizer file {path}: {exc.strerror or exc}") from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --------------------------------------------------------------------------- from GGUF vocab

# Minimal protobuf wire encoding for sentencepiece's ModelProto. The package's generated
# sentencepiece_model_pb2 needs the protobuf runtime, which this project does not depend on;
# the handful of fields written here are stable parts of sentencepiece_model.proto.


def _pb_varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32 values go on the wire as 10-byte two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _pb_int(field: int, value: int) -> bytes:
    return _pb_varint(field << 3) + _pb_varint(value)


def _pb_bytes(field: int, value: bytes) -> bytes:
    return _pb_varint(field << 3 | 2) + _pb_varint(len(value)) + value


def _pb_float(field: int, value: float) -> bytes:
    return _pb_varint(field << 3 | 5) + struct.pack("<f", value)


# llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte —
# the same numbers as SentencePiece's ModelProto.SentencePiece.Type.
_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER, _SP_UNUSED, _SP_BYTE = 1, 2, 3, 4, 5, 6
_CHAT_MARKER = re.compile(r"<\|[^|<>\s]+\|>")


def sentencepiece_from_vocab(
    tokens: list[str],
    scores: list[float],
    token_types: list[int],
    *,
    bos_id: int | None,
    eos_id: int | None,
    unk_id: int | None,
    pad_id: int | None = None,
    add_dummy_prefix: bool = True,
) -> SentencePieceTokenizer:
    """A real SentencePiece (BPE, byte fallback) model from GGUF-style vocabulary arrays."""
    n = len(tokens)
    if not (len(scores) == len(token_types) == n) or n == 0:
        raise TokenizerError(
            f"vocabulary arrays disagree: {n} tokens, {len(scores)} scores, {len(token_types)} types"
        )
    types = [int(t) if 1 <= int(t) <= 6 else _SP_NORMAL for t in token_types]
    if unk_id is None:
        unk_id = next((i for i, t in enumerate(types) if t == _SP_UNKNOWN), None)
        if unk_id is None:
            raise TokenizerError("SentencePiece vocabulary has no unknown token")
    types[unk_id] = _SP_UNKNOWN
    for i in (bos_id, eos_id):
        if i is not None:
            types[i] = _SP_CONTROL
    for i, t in enumerate(types):
        # Some converters mark chat markers like <|eot_id|> as user-defined, which
        # SentencePiece would match in user text; as control symbols they never are.
        if t == _SP_USER and _CHAT_MARKER.fullmatch(tokens[i]):
            types[i] = _SP_CONTROL
    has_bytes = _SP_BYTE in types

    parts = []
    for piece, score, t in zip(tokens, scores, types):
        body = _pb_bytes(1, piece.encode("utf-8")) + _pb_float(2, float(score))
        if t != _SP_NORMAL:
            body += _pb_int(3, t)
        parts.append(_pb_bytes(1, body))

    def piece_of(i: int | None, default: str) -> bytes:
        return (tokens[i] if i is not None else default).encode("utf-8")

    trainer = b"".join(
        [
            _pb_int(3, 2),  # model_type = BPE
            _pb_int(4, n),  # vocab_size
            _pb_int(35, int(has_bytes)),  # byte_fallback
            _pb_int(40, unk_id),
            _pb_int(41, -1 if bos_id is None else bos_id),
            _pb_int(42, -1 if eos_id is None else eos_id),
            _pb_int(43, -1 if pad_id is None else pad_id),
            _pb_bytes(45, piece_of(unk_id, "<unk>")),
            _pb_bytes(46, piece_of(bos_id, "<s>")),
            _pb_bytes(47, piece_of(eos_id, "</s>")),
            _pb_bytes(48, piece_of(pad_id, "<pad>")),
        ]
    )
    normalizer = b"".join(
        [
            _pb_bytes(1, b"identity"),
            _pb_int(3, int(add_dummy_prefix)),
            _pb_int(4, 0),  # remove_extra_whitespaces: Llama keeps whitespace runs
            _pb_int(5, 1),  # escape_whitespaces: spaces become "▁"
        ]
    )
    parts.append(_pb_bytes(2, trainer))
    parts.append(_pb_bytes(3, normalizer))
    return SentencePieceTokenizer(b"".join(parts))


def hf_byte_level_from_vocab(
    tokens: list[str],
    merges: list[str],
    token_types: list[int],
    *,
    bos_id: int | None,
    eos_id: int | None,
) -> HFTokenizer:
    """A byte-level BPE tokenizer (Llama 3 style) from GGUF "gpt2" vocabulary arrays.

    ``tokens`` are in GPT-2's byte-to-unicode spelling, ``merges`` are ``"left right"``.
    Control tokens (type 3) become special added tokens.
    """
    n = len(tokens)
    if len(token_types) != n:
        raise TokenizerError(f"vocabulary arrays disagree: {n} tokens, {len(token_types)} types")
    added = []
    for i, t in enumerate(token_types):
        if t in (_SP_CONTROL, _SP_USER):
            added.append(
                {
                    "id": i,
                    "content": tokens[i],
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": t == _SP_CONTROL,
                }
            )
    # Built as JSON so the 128k-entry vocabulary and merges are handled by C/Rust code,
    # not by a long Python loop that would hold the GIL.
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            # tiktoken takes a whole pre-token that is in the vocabulary as is; so must we.
            "ignore_merges": True,
            "vocab": dict(zip(tokens, range(n))),
            "merges": list(merges),
        },
    }
    tok = HFTokenizer(json.dumps(spec, ensure_ascii=False))
    # Explicit ids win over the name-based guess made from the usual spellings.
    tok.bos_id, tok.eos_id = bos_id, eos_id
    tok.stop_ids = tok._collect_stop_ids()
    return tok


def byte_level_vocab_from_ranks(ranks: dict[bytes, int]) -> tuple[list[str], list[str]]:
    """Tokens (GPT-2 byte-level spelling, in rank order) and merges for a tiktoken ranks table.

    tiktoken merges any adjacent pair whose concatenation is a token, lowest rank first;
    listing every such pair, ordered by the rank of the result, makes a BPE that agrees.
    """
    by_rank = sorted(ranks, key=ranks.__getitem__)
    spell = [("".join(_B2U[b] for b in tok)) for tok in by_rank]
    if ranks and (min(ranks.values()) != 0 or max(ranks.values()) != len(ranks) - 1):
        raise TokenizerError("tiktoken ranks are not the contiguous ids 0..n-1")
    merges: list[tuple[int, int, int]] = []
    for r, tok in enumerate(by_rank):
        for k in range(1, len(tok)):
            left = ranks.get(tok[:k])
            if left is None:
                continue
            right = ranks.get(tok[k:])
            if right is None:
                continue
            merges.append((r, left, right))
    merges.sort()
    return spell, [f"{spell[a]} {spell[b]}" for _, a, b in merges]


# --------------------------------------------------------------------------- streaming


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
