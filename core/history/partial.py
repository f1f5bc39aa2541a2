"""A streaming reply saved while it grows, so a crash loses at most a moment of it."""
from __future__ import annotations

import time

from core.history.records import HistoryError, Message
from core.history.store import History


INCOMPLETE = "incomplete"  # stop_reason of a reply still streaming, or cut short by a crash


class PartialReply:
    """A streaming reply saved as it grows: the first text creates the message with stop
    reason ``incomplete``; then it is rewritten at most every ``every_s`` seconds or
    ``every_chars`` characters, so a crash loses at most that much; :meth:`finish` writes
    the final text and stop reason. Writes happen on the caller's thread (the UI's), never
    the generating one.
    """

    def __init__(self, history: "History", conv_id: int, parent_id: int, *, every_s: float = 0.5,
                 every_chars: int = 200, **fields):
        self.history, self.conv_id, self.parent_id = history, conv_id, parent_id
        self.fields = fields
        self.every_s, self.every_chars = every_s, every_chars
        self.text = ""
        self.msg_id: int | None = None
        self._saved_len = 0
        self._saved_at = 0.0
        self.error: str | None = None  # the last failed save, if any

    def append(self, text: str) -> None:
        self.text += text
        now = time.monotonic()
        if self.msg_id is None or len(self.text) - self._saved_len >= self.every_chars or now - self._saved_at >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.text == "" or (self.msg_id is not None and len(self.text) == self._saved_len):
            return
        try:
            if self.msg_id is None:
                self.msg_id = self.history.add_message(self.conv_id, role="assistant", text=self.text,
                                                       parent_id=self.parent_id, stop_reason=INCOMPLETE,
                                                       **self.fields).id
            else:
                self.history.update_message(self.msg_id, text=self.text)
            self.error = None
        except HistoryError as e:  # full disk, read-only folder: keep streaming, retry at the next piece
            self.error = str(e)
            return
        self._saved_len, self._saved_at = len(self.text), time.monotonic()

    def finish(self, text: str, **fields) -> Message:
        """The final reply: updates the partial message (or adds it) and makes it current."""
        merged = {**self.fields, **fields}
        if self.msg_id is None:
            return self.history.add_message(self.conv_id, role="assistant", text=text,
                                            parent_id=self.parent_id, **merged)
        m = self.history.update_message(self.msg_id, text=text, **merged)
        self.history.set_current_leaf(self.conv_id, self.msg_id)
        return m
