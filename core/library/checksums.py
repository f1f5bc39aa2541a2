"""Checksums of downloaded files, as the Hub reports them: an LFS file's sha256 (computed
while the file is written) and a small file's git blob id."""
from __future__ import annotations

import hashlib
import queue
import threading
from pathlib import Path
from typing import Callable

CHUNK = 1 << 20  # bytes read (or received) at a time


def git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class StreamHasher:
    """sha256 of a file as it is written, on its own thread (hashlib releases the GIL), so
    hashing overlaps the transfer instead of following it (a download's sha256). ``fed`` counts the bytes given."""

    def __init__(self):
        self._start(hashlib.sha256(), 0)

    def _start(self, h, fed: int) -> None:
        self.h, self.fed = h, fed
        self.q: "queue.Queue[bytes | None]" = queue.Queue(maxsize=64)  # bounded: a few MB in flight
        self.t = threading.Thread(target=self._run, args=(self.h, self.q), name="download-hash", daemon=True)
        self.t.start()

    @staticmethod
    def _run(h, q) -> None:
        while (chunk := q.get()) is not None:
            h.update(chunk)

    def feed(self, chunk: bytes) -> None:
        self.q.put(chunk)
        self.fed += len(chunk)

    def close(self) -> None:
        if self.t.is_alive():
            self.q.put(None)
            self.t.join()

    def hexdigest(self) -> str:
        self.close()
        return self.h.hexdigest()

    def restart(self, part: Path, have: int, check: Callable[[], None]) -> None:
        """Start over from the first ``have`` bytes of the partial file (a resumed download)."""
        self.close()
        h, left = hashlib.sha256(), have
        if have:
            with open(part, "rb") as f:
                while left > 0:
                    chunk = f.read(min(CHUNK, left))
                    if not chunk:
                        break
                    h.update(chunk)
                    left -= len(chunk)
                    check()
        self._start(h, have - left)
