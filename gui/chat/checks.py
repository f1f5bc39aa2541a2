"""What can be known about a draft model before a message is sent, from its files' headers
alone (never its weights): that it is there, that it reads as a model, and that its
vocabulary is as large as the model's. A draft model that passes may still be refused when
its token texts differ; the worker says so, and the controller keeps that reason."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from core.checkpoints.gguf_header import header_args, read_header
from core.errors import LlamaDeskError
from core.library.library import read_entry

CHOOSE = "choose another, or turn speculative decoding off"


def draft_problem(path: str, info: dict | None) -> str:
    """Why the draft model at ``path`` cannot draft for the model ``info`` describes ("" when
    nothing here says so)."""
    p = Path(path).expanduser()
    try:
        stat = p.stat()
    except OSError:
        return f"Draft model not found: {path} ({CHOOSE})"
    want = (info or {}).get("vocab_size")
    return _checked(str(p), stat.st_mtime_ns, stat.st_size, int(want) if isinstance(want, int) else 0)


@lru_cache(maxsize=16)
def _checked(path: str, _mtime_ns: int, _size: int, want: int) -> str:
    # Keyed by the file's time and size too: a draft model replaced on disk is read again.
    entry = read_entry(path)
    if entry.error:
        return f"Draft model cannot be used: {entry.error} ({CHOOSE})"
    vocab = header_vocab(Path(path))
    if want and vocab and vocab != want:
        return (f"Draft model {entry.name} has a {vocab:,}-token vocabulary, the model {want:,}: "
                "a draft model needs the model's own tokenizer")
    return ""


def header_vocab(path: Path) -> int | None:
    """The vocabulary size a model's header or config states (None when it does not say)."""
    try:
        if path.is_file():
            meta, tensors = read_header(path)
            return header_args(meta, tensors, str(path)).vocab_size
        for name in ("config.json", "params.json"):
            if (path / name).is_file():
                v = json.loads((path / name).read_text(encoding="utf-8")).get("vocab_size")
                return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    except (OSError, ValueError, AttributeError, LlamaDeskError):  # unreadable: read_entry said so already
        return None
    return None
