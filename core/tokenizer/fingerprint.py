"""A tokenizer's fingerprint: two models whose fingerprints match tokenize alike, so their
token ids can be compared (comparison lanes across models, a draft model's vocabulary)."""
from __future__ import annotations

import hashlib
import threading
import weakref

from core.tokenizer.base import Tokenizer

# Hashing every token's bytes takes a while at a 128k vocabulary, and lanes ask for each
# model's fingerprint often: remembered per tokenizer object (and vocabulary size), beside
# the object rather than on it, and forgotten with it.
_known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def tokenizer_fingerprint(tokenizer: Tokenizer, vocab_size: int) -> str:
    """A short hash of the bytes of each of the first ``vocab_size`` tokens."""
    with _lock:
        try:
            cached = _known.get(tokenizer, {}).get(vocab_size)
        except TypeError:  # an object that cannot be weakly referenced: measured each time
            cached = None
    if cached:
        return cached
    h = hashlib.sha256()
    for i in range(vocab_size):
        try:
            b = tokenizer.token_bytes(i)
        except Exception:
            b = b"\xff<none>"
        h.update(len(b).to_bytes(4, "little") + b)
    fp = h.hexdigest()[:16]
    with _lock:
        try:
            _known.setdefault(tokenizer, {})[vocab_size] = fp
        except TypeError:
            pass
    return fp
