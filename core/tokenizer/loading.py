"""Open a tokenizer file and recognise its kind by content."""
from __future__ import annotations

import re
from pathlib import Path

from core import limits
from core.errors import TokenizerError
from core.tokenizer.base import Tokenizer, read_tokenizer_file
from core.tokenizer.hf import HFTokenizer
from core.tokenizer.sentencepiece import SentencePieceTokenizer
from core.tokenizer.tiktoken_bpe import TiktokenTokenizer


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
    data = read_tokenizer_file(p)
    head = data[:4096]
    if head.lstrip()[:1] == b"{":
        doc = limits.parse_json(data, file=str(p), error=TokenizerError)
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            raise TokenizerError(f"JSON file is not a Hugging Face tokenizer.json: {p}")
        return HFTokenizer(data.decode("utf-8"), source=str(p))
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
