"""Typed errors that carry a message a user can read."""
from __future__ import annotations


class LlamaDeskError(Exception):
    """Base class: ``str(err)`` is one line a user can act on."""


class SettingsError(LlamaDeskError, ValueError):
    """An invalid generation or load setting (negative temperature, top-p above 1, ...)."""


class TokenizerError(LlamaDeskError):
    """A tokenizer file that cannot be read or does not fit the model."""


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


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (its type name when empty), for a user."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]
