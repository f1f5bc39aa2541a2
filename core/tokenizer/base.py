"""The interface every tokenizer kind offers, and what the kinds share.

Whatever the kind, ``encode`` treats its input as ordinary text: a user who types
``<|eot_id|>`` gets the characters, never the control id. Chat formats insert special ids
themselves (see ``core.prompt.chat_format``).
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Protocol, runtime_checkable

from core import limits
from core.errors import TokenizerError, one_line

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


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer kind offers; the engine and chat formats use only this."""

    kind: str
    source: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    stop_ids: set[int]
    special_tokens: dict[str, int]
    #: True when encoding adds SentencePiece's dummy "▁" prefix; a reply decoded on its own
    #: then starts with a space that ``StreamDecoder(strip_leading_space=True)`` removes.
    add_dummy_prefix: bool

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of ``text`` taken as plain text; BOS/EOS are added when asked and known."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens are left out."""
        ...

    def token_bytes(self, id: int) -> bytes:
        """Raw bytes of one token (``b""`` for special/control tokens)."""
        ...

    def id_to_piece(self, id: int) -> str:
        """A readable form of one token for a token inspector."""
        ...

    def special_id(self, text: str) -> int | None:
        """Id of the special token spelled ``text``, or None."""
        ...


class TokenizerBase:
    """Shared plumbing of the concrete kinds (BOS/EOS wrapping, stop ids, lookups)."""

    kind: str = ""
    source: str = ""
    vocab_size: int = 0
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    add_dummy_prefix: bool = False
    stop_ids: set[int]
    special_tokens: dict[str, int]

    def special_id(self, text: str) -> int | None:
        return self.special_tokens.get(text)

    def _wrap(self, ids: list[int], bos: bool, eos: bool) -> list[int]:
        # A model without BOS/EOS still works; asking for one it lacks adds nothing.
        if bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def collect_stop_ids(self, extra: Iterable[int] = ()) -> set[int]:
        stops = {self.special_tokens[t] for t in _STOP_TOKEN_TEXTS if t in self.special_tokens}
        if self.eos_id is not None:
            stops.add(self.eos_id)
        stops.update(extra)
        return stops

    def __repr__(self) -> str:
        return f"<{type(self).__name__} vocab={self.vocab_size} bos={self.bos_id} eos={self.eos_id}>"


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


#: Byte-level BPE's spelling of each byte, and back.
BYTE_TO_UNICODE = bytes_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in BYTE_TO_UNICODE.items()}


def readable(data: bytes) -> str:
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


def read_tokenizer_file(path: str | Path) -> bytes:
    """A tokenizer file's bytes: a regular file (never a FIFO or device), size-limited."""
    return limits.read_limited(path, limits.MAX_TOKENIZER_BYTES, error=TokenizerError)


def valid_text(text: str) -> str:
    """``text`` with lone surrogates (invalid UTF-8 from argv, broken clipboard data)
    replaced by U+FFFD: native tokenizers refuse or panic on them."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    # Bytes Python escaped while decoding (argv, file names) decode as a UTF-8 decoder would;
    # any other lone surrogate is one U+FFFD.
    text = re.sub(r"[\udc80-\udcff]+",
                  lambda m: m.group().encode("utf-8", "surrogateescape").decode("utf-8", "replace"), text)
    return re.sub(r"[\ud800-\udfff]", "\ufffd", text)


def native_call(build, what: str, *, quiet: bool = False):
    """``build()`` with any third-party failure (Rust panics included: they are
    BaseExceptions) turned into a TokenizerError saying ``what`` failed.

    ``quiet``: a Rust panic's own report (several lines, a backtrace with RUST_BACKTRACE)
    is written straight to file descriptor 2 by the panic hook, which Python cannot
    replace; the call then runs with that descriptor caught (see :func:`_stderr_caught`)."""
    try:
        if quiet:
            with _stderr_caught():
                return build()
        return build()
    except (KeyboardInterrupt, SystemExit, MemoryError, TokenizerError):
        raise
    except BaseException as exc:  # noqa: BLE001
        raise TokenizerError(f"{what} ({one_line(exc)})") from None


_STDERR_LOCK = threading.RLock()
_caught_depth = 0


class _stderr_caught:
    """Within the block, what is written to descriptor 2 goes to a temporary file; when the
    block ends normally it is passed on to the real stderr (other threads' output arrives
    late, never lost), when it raises (a native panic) it is dropped: the error the caller
    raises says what failed, in one line."""

    def __enter__(self):
        global _caught_depth
        _STDERR_LOCK.acquire()
        _caught_depth += 1
        self.saved = self.sink = None
        if _caught_depth > 1:
            return self
        try:
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        try:
            self.sink = tempfile.TemporaryFile()
            self.saved = os.dup(2)
            os.dup2(self.sink.fileno(), 2)
        except OSError:  # no descriptor 2 (a windowed app on Windows): nothing to catch
            if self.sink is not None:
                self.sink.close()
            self.saved = self.sink = None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        global _caught_depth
        try:
            if self.saved is not None:
                os.dup2(self.saved, 2)
                os.close(self.saved)
                if exc_type is None:
                    self.sink.seek(0)
                    data = self.sink.read()
                    while data:
                        data = data[os.write(2, data):]
                self.sink.close()
        finally:
            _caught_depth -= 1
            _STDERR_LOCK.release()
