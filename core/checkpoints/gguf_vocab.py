"""GGUF vocabularies as tokenizers: a SentencePiece ModelProto or a byte-level BPE built
from the arrays a GGUF file stores (``tokenizer.ggml.tokens``/``scores``/``token_type``/``merges``).
"""
from __future__ import annotations

import json
import re
import struct

from core.errors import TokenizerError
from core.tokenizer import HFTokenizer, SentencePieceTokenizer
from core.tokenizer.base import BYTE_TO_UNICODE, LLAMA3_PATTERN, read_tokenizer_file
from core.tokenizer.tiktoken_bpe import parse_ranks

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


# Short lengths and small ints, encoded once: a 128k vocabulary writes ~400k of them.
_SMALL = [_pb_varint(i) for i in range(1 << 14)]


def _pb_int(field: int, value: int) -> bytes:
    return _pb_varint(field << 3) + _pb_varint(value)


def _pb_bytes(field: int, value: bytes) -> bytes:
    return _pb_varint(field << 3 | 2) + _pb_varint(len(value)) + value


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
    types, unk_id = _sentencepiece_types(tokens, token_types, bos_id, eos_id, unk_id)
    parts = _pieces(tokens, scores, types)

    def piece_of(i: int | None, default: str) -> bytes:
        return (tokens[i] if i is not None else default).encode("utf-8")

    trainer = b"".join(
        [
            _pb_int(3, 2),  # model_type = BPE
            _pb_int(4, n),  # vocab_size
            _pb_int(35, int(_SP_BYTE in types)),  # byte_fallback
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


def _pieces(tokens: list[str], scores: list[float], types: list[int]) -> list[bytes]:
    """The ModelProto ``pieces`` entries (field 1: piece, score, type unless normal), written
    with precomputed tags and lengths: the general helpers took ~1 s on a 32k vocabulary."""
    packed = struct.pack(f"<{len(scores)}f", *map(float, scores))
    piece_tag, score_tag, type_tag, entry_tag = _SMALL[1 << 3 | 2], _SMALL[2 << 3 | 5], _SMALL[3 << 3], _SMALL[1 << 3 | 2]
    small = _SMALL
    out = []
    for i, (piece, t) in enumerate(zip(tokens, types)):
        raw = piece.encode("utf-8")
        n = len(raw)
        body = piece_tag + (small[n] if n < 16384 else _pb_varint(n)) + raw + score_tag + packed[4 * i:4 * i + 4]
        if t != _SP_NORMAL:
            body += type_tag + small[t]
        m = len(body)
        out.append(entry_tag + (small[m] if m < 16384 else _pb_varint(m)) + body)
    return out


def _sentencepiece_types(tokens: list[str], token_types: list[int], bos_id: int | None, eos_id: int | None,
                         unk_id: int | None) -> tuple[list[int], int]:
    """(each token's SentencePiece type, the unknown token's id): BOS/EOS and chat markers
    are control symbols."""
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
    return types, unk_id


def hf_byte_level_from_vocab(
    tokens: list[str],
    merges: list[str],
    token_types: list[int],
    *,
    bos_id: int | None,
    eos_id: int | None,
    pre: object = None,
) -> HFTokenizer:
    """A byte-level BPE tokenizer (Llama 3 style) from GGUF "gpt2" vocabulary arrays.

    ``tokens`` are in GPT-2's byte-to-unicode spelling, ``merges`` are ``"left right"``.
    Control tokens (type 3) become special added tokens. ``pre`` is the file's
    tokenizer.ggml.pre: only Llama 3's split is rebuilt here, so a file naming another
    is refused rather than read with the wrong text splitting (wrong ids, no error).
    """
    if pre is not None and (not isinstance(pre, str) or pre not in LLAMA3_PRE_NAMES):
        raise TokenizerError(f"its text splitting (tokenizer.ggml.pre) is {str(pre)[:40]!r}; only Llama 3's "
                             f"('{LLAMA_BPE}') is supported")
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
    tok = HFTokenizer(json.dumps(_byte_level_spec(tokens, merges, added), ensure_ascii=False))
    # Explicit ids win over the name-based guess made from the usual spellings.
    tok.bos_id, tok.eos_id = bos_id, eos_id
    tok.stop_ids = tok.collect_stop_ids()
    return tok


def _byte_level_spec(tokens: list[str], merges: list[str], added: list[dict]) -> dict:
    """A tokenizer.json of Llama 3's byte-level BPE over these tokens and merges."""
    # Built as JSON so the 128k-entry vocabulary and merges are handled by C/Rust code,
    # not by a long Python loop that would hold the GIL.
    return {
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
            "vocab": dict(zip(tokens, range(len(tokens)))),
            "merges": list(merges),
        },
    }


def byte_level_vocab_from_ranks(ranks: dict[bytes, int]) -> tuple[list[str], list[str]]:
    """Tokens (GPT-2 byte-level spelling, in rank order) and merges for a tiktoken ranks table.

    tiktoken merges any adjacent pair whose concatenation is a token, lowest rank first;
    listing every such pair, ordered by the rank of the result, makes a BPE that agrees.
    """
    by_rank = sorted(ranks, key=ranks.__getitem__)
    spell = [("".join(BYTE_TO_UNICODE[b] for b in tok)) for tok in by_rank]
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


# --------------------------------------------------------------------------- writing "gpt2" vocabularies

#: The pre-tokenizer name llama.cpp gives Llama 3's split pattern (the one ``hf_byte_level_from_vocab``
#: rebuilds); a GGUF "gpt2" vocabulary is written under this name.
LLAMA_BPE = "llama-bpe"
#: The names llama.cpp reads as that same split. A file without the key (written before
#: llama.cpp recorded it, spring 2024: Llama 3's own vocabulary) is read with it too.
LLAMA3_PRE_NAMES = frozenset({LLAMA_BPE, "llama3", "llama-v3"})
_UNUSED = _SP_UNUSED
# Texts both tokenizers must split alike before a vocabulary is written: words, contractions,
# digit runs, punctuation runs, whitespace runs and line breaks, non-Latin scripts, emoji.
_SAME_IDS_TEXTS = (
    "Hello world", "This is a test sentence.", "  leading spaces and trailing   ", "they're I'LL we've 's",
    "numbers 1234567890 3.14159 -42 1e10", "line one\nline two\r\n\n\nafter blank lines\t\ttabs",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n", "Grüße, naïve café — 日本語のテキスト",
    "Ελληνικά, русский, עברית, العربية, हिन्दी, 한국어", "emoji 🤖🦙✨ family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "<|begin_of_text|> <|eot_id|> <s> [INST]", "\u200b\u00a0 zero-width and no-break",
)


def byte_level_vocab(tok, size: int) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types): a Llama 3-kind tokenizer (a byte-level BPE
    tokenizer.json, or Meta's tiktoken ranks with its 256 special tokens) as the arrays of a
    GGUF "gpt2" vocabulary of ``size`` entries (the model's embedding rows; ids no token
    has are "[PAD<id>]", unused, as llama.cpp's converter writes them).

    Raises TokenizerError for a tokenizer whose text splitting is not Llama 3's: llama.cpp
    knows a "gpt2" vocabulary's pre-tokenizer by name only, and the loader here by this one.
    """
    if tok.kind == "tiktoken":
        ranks = parse_ranks(read_tokenizer_file(tok.source), tok.source)
        tokens, merges = byte_level_vocab_from_ranks(ranks)
        by_id = dict(enumerate(tokens))
        types = {i: _SP_NORMAL for i in by_id}
        for name, i in tok.special_tokens.items():
            by_id[i], types[i] = name, _SP_CONTROL
    elif tok.kind == "hf":
        by_id, merges, types = _hf_byte_level_arrays(tok)
    else:
        raise TokenizerError(f"a '{tok.kind}' tokenizer is not a byte-level BPE vocabulary")
    n = max(size, max(by_id) + 1)
    return ([by_id.get(i, f"[PAD{i}]") for i in range(n)], merges,
            [types.get(i, _UNUSED) for i in range(n)])


def _hf_byte_level_arrays(tok) -> tuple[dict[int, str], list[str], dict[int, int]]:
    doc = json.loads(tok.backend.to_str())
    model = doc.get("model") or {}
    if model.get("type") != "BPE" or doc.get("normalizer") is not None or not _splits_like_llama3(doc):
        raise TokenizerError(f"{tok.source} is not Llama 3's byte-level BPE (model {model.get('type')}, its own "
                             "normalizer or pre-tokenizer): a GGUF file names its text splitting, and only "
                             f"'{LLAMA_BPE}' is written here (convert to hf instead)")
    by_id = {int(i): t for t, i in model["vocab"].items()}
    types = {i: _SP_NORMAL for i in by_id}
    for i, added in tok.backend.get_added_tokens_decoder().items():
        by_id[int(i)] = added.content
        types[int(i)] = _SP_CONTROL if added.special else _SP_USER
    # tokenizers writes a merge as "left right" (older files) or ["left", "right"].
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return by_id, merges, types


def _splits_like_llama3(doc: dict) -> bool:
    """Whether a tokenizer.json's pre-tokenizer is Llama 3's: its regex split, then bytes
    mapped to GPT-2's alphabet with no second split."""
    pre = doc.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or len(steps) != 2:
        return False
    split, byte_level = steps
    return (split.get("type") == "Split" and (split.get("pattern") or {}).get("Regex") == LLAMA3_PATTERN
            and split.get("behavior") == "Isolated" and not split.get("invert")
            and byte_level.get("type") == "ByteLevel" and byte_level.get("use_regex") is False
            and not byte_level.get("add_prefix_space"))


def check_same_ids(tok, tokens: list[str], merges: list[str], types: list[int]) -> None:
    """Raise TokenizerError unless the tokenizer these arrays rebuild (as the GGUF loader
    will) gives ``tok``'s ids for a set of texts that exercise every part of splitting."""
    rebuilt = hf_byte_level_from_vocab(tokens, merges, types, bos_id=tok.bos_id, eos_id=tok.eos_id)
    for text in _SAME_IDS_TEXTS:
        want, got = tok.encode(text), rebuilt.encode(text)
        if want != got:
            raise TokenizerError(f"the vocabulary written from {tok.source} would not give its token ids back "
                                 f"(for {text!r}: {want[:8]} but {got[:8]})")
