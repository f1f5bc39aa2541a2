"""Typed errors that carry a message a user can read."""
from __future__ import annotations

import re

# Terminal control sequences (CSI, OSC, other ESC forms) and the C0/C1 controls a message
# could smuggle from a file name or a third-party exception into a terminal or a dialog.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_MESSAGE = 600  # characters; longer messages end at a word with "…"


def plain_text(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as one printable line: escape sequences and control characters removed,
    lines joined, lone surrogates (undecodable file names) shown as U+FFFD, and cut at a
    word boundary when longer than ``limit``."""
    text = str(text).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    text = _CONTROLS.sub(" ", _ESCAPES.sub("", text))
    text = " ".join(text.split())
    if len(text) > limit:
        cut = text.rfind(" ", 0, limit)
        text = text[: cut if cut > limit // 2 else limit].rstrip() + " …"
    return text


class LlamaDeskError(Exception):
    """Base class: ``str(err)`` is one line a user can act on."""

    def __init__(self, *args):
        if args and isinstance(args[0], str):
            args = (plain_text(args[0]),) + args[1:]
        super().__init__(*args)


class SettingsError(LlamaDeskError, ValueError):
    """An invalid generation or load setting (negative temperature, top-p above 1, ...)."""


class TokenizerError(LlamaDeskError):
    """A tokenizer file that cannot be read or does not fit the model."""


class DraftModelError(SettingsError):
    """A draft model that cannot draft for the model it serves (another vocabulary)."""


class CheckpointError(LlamaDeskError):
    """A checkpoint that cannot be loaded.

    Args:
        message: what is wrong.
        file: the file at fault, when known.
        tensor: the tensor at fault, when known.
    """

    def __init__(self, message: str, *, file: str | None = None, tensor: str | None = None):
        self.file = file
        self.tensor = tensor
        parts = [message]
        if tensor:
            parts.append(f"tensor '{tensor}'")
        if file:
            parts.append(f"in {file}")
        super().__init__(" — ".join(parts) if len(parts) > 1 else message)


class ResourceError(LlamaDeskError):
    """A model or request that needs more memory than is available (checked before allocating).

    ``needed`` and ``available`` are in bytes.
    """

    def __init__(self, message: str, *, needed: int = 0, available: int = 0):
        self.needed = needed
        self.available = available
        super().__init__(message)


class DataFolderError(LlamaDeskError):
    """A folder LlamaDesk keeps files in cannot be one (a file stands where it or a
    parent should be)."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (its type name when empty), for a user:
    plain text (see :func:`plain_text`), cut at a word boundary. Works for third-party
    exceptions and Rust panics too."""
    text = str(exc).strip().splitlines()
    return plain_text(text[0] if text else type(exc).__name__, limit)


class HubError(LlamaDeskError):
    """The Hugging Face Hub could not answer as asked. ``kind`` names the cause for a UI:
    'auth' (gated or private: a token is needed), 'not_found' (the repository or file is
    gone), 'network' (no connection), 'checksum', 'disk', or 'hub' (anything else)."""
    kind = "hub"


class HubAuthError(HubError):
    """401/403: a gated or private repository, and no token (or one without access)."""
    kind = "auth"


class HubNotFoundError(HubError):
    """404: the repository (or the file) does not exist, or no longer does."""
    kind = "not_found"


class HubNetworkError(HubError):
    """The Hub cannot be reached (no network, DNS, a dropped connection, a timeout)."""
    kind = "network"


class DownloadError(HubError):
    """A download that cannot finish: ``kind`` is 'checksum' or 'disk' (or a HubError's kind)."""

    def __init__(self, message: str, *, kind: str = "hub"):
        self.kind = kind
        super().__init__(message)

class ConstraintError(SettingsError):
    """A JSON schema, regular expression or grammar that cannot be compiled (or used)."""
