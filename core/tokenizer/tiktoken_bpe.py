"""Llama 3's tokenizer: a tiktoken BPE ranks file plus Meta's 256 special tokens."""
from __future__ import annotations

import binascii
import re
from pathlib import Path
from typing import Iterator

from core.errors import TokenizerError, one_line
from core.tokenizer.base import (LLAMA3_PATTERN, LLAMA3_SPECIAL_TOKENS, TokenizerBase, native_call,
                                 read_tokenizer_file, readable, valid_text)

# Meta cuts inputs this way because tiktoken slows down badly on huge inputs and on very
# long runs without a whitespace/non-whitespace change.
_TIKTOKEN_MAX_CHARS = 400_000
_TIKTOKEN_MAX_RUN = 25_000
_LONG_RUN = re.compile(r"\s{%d,}|\S{%d,}" % (_TIKTOKEN_MAX_RUN + 1, _TIKTOKEN_MAX_RUN + 1))


class TiktokenTokenizer(TokenizerBase):
    """Llama 3's tokenizer: a tiktoken BPE ranks file plus Meta's 256 special tokens."""

    kind = "tiktoken"

    def __init__(self, ranks_path: str | Path):
        import tiktoken  # why: 0.2 s at start-up, only for Llama 3 ranks files

        path = Path(ranks_path)
        ranks = parse_ranks(read_tokenizer_file(path), path)
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
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except BaseException as exc:  # noqa: BLE001 — tiktoken's Rust core panics on some files
            raise TokenizerError(f"cannot build a tiktoken tokenizer from {path}: {one_line(exc)}") from None
        self._names = {i: name for name, i in self.special_tokens.items()}
        self.vocab_size = self._enc.n_vocab
        self.bos_id = self.special_tokens["<|begin_of_text|>"]
        self.eos_id = self.special_tokens["<|end_of_text|>"]
        self.pad_id = None  # Meta's tokenizer has none (pad_id = -1)
        self.stop_ids = self.collect_stop_ids()

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        enc = self._enc
        ids: list[int] = []
        for chunk in _tiktoken_chunks(valid_text(text)):
            # allowed_special=set() + disallowed_special=(): special spellings are plain text.
            ids.extend(native_call(lambda: enc.encode(chunk, allowed_special=set(), disallowed_special=()),
                                   "the tokenizer failed on this text"))
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
        return name if name is not None else readable(self.token_bytes(id))


def parse_ranks(data: bytes, path: Path) -> dict[bytes, int]:
    """A tiktoken ranks file's token bytes -> rank (``path`` is named in errors)."""
    # Same format tiktoken.load.load_tiktoken_bpe reads, parsed here because that function
    # also copies every local file into a temp cache folder; map/zip keep the loop in C.
    parts = data.split()
    if not parts or len(parts) % 2:
        raise TokenizerError(f"not a tiktoken ranks file (lines of 'base64 rank'): {path}")
    try:
        ranks = dict(zip(map(binascii.a2b_base64, parts[0::2]), map(int, parts[1::2])))
    except (binascii.Error, ValueError):
        raise TokenizerError(f"not a tiktoken ranks file (lines of 'base64 rank'): {path}") from None
    # tiktoken's Rust core panics mid-encode on a file that breaks these (issue 12):
    # every byte must be a token of its own, and ranks must number the tokens 0..n-1 once each.
    n = len(ranks)
    if len(parts) // 2 != n or len(set(ranks.values())) != n or min(ranks.values()) != 0 or max(ranks.values()) != n - 1:
        raise TokenizerError(f"tiktoken ranks must number {len(parts) // 2} distinct tokens 0 to n-1, once each: {path}")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerError(f"tiktoken ranks lack {len(missing)} of the 256 single-byte tokens "
                             f"(first: byte {missing[0]}): {path}")
    return ranks


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
