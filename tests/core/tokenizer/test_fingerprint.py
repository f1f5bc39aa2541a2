"""core.tokenizer.fingerprint: same vocabulary, same fingerprint; remembered beside the tokenizer."""
import gc
import weakref

from core.checkpoints import load
from core.tokenizer import load_tokenizer
from core.tokenizer.fingerprint import tokenizer_fingerprint


def test_tokenizer_fingerprint_tells_vocabularies_apart(fixtures):
    story = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32").tokenizer
    again = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32").tokenizer
    assert tokenizer_fingerprint(story, 512) == tokenizer_fingerprint(again, 512)  # same vocab, separate objects
    llama2 = fixtures / "llama2-tokenizer.model"
    if llama2.exists():
        t = load_tokenizer(llama2)
        assert tokenizer_fingerprint(t, t.vocab_size) != tokenizer_fingerprint(story, 512)


class _Counting:
    """A tokenizer of 3 tokens that counts how often its bytes are read."""
    def __init__(self):
        self.reads = 0

    def token_bytes(self, i: int) -> bytes:
        self.reads += 1
        return b"abc"[i:i + 1]


def test_fingerprint_is_remembered_without_touching_the_tokenizer():
    t = _Counting()
    fp = tokenizer_fingerprint(t, 3)
    assert t.reads == 3 and vars(t) == {"reads": 3}  # nothing written onto the object
    assert tokenizer_fingerprint(t, 3) == fp and t.reads == 3  # the second ask is remembered
    assert tokenizer_fingerprint(t, 2) != fp  # per vocabulary size
    other = _Counting()
    assert tokenizer_fingerprint(other, 3) == fp  # the same bytes, the same fingerprint
    gone = weakref.ref(t)
    del t
    gc.collect()
    assert gone() is None  # remembering it does not keep the tokenizer alive


def test_objects_that_cannot_be_weakly_referenced_still_get_one():
    class Slotted:
        __slots__ = ()

        def token_bytes(self, i: int) -> bytes:
            return bytes([i])

    assert tokenizer_fingerprint(Slotted(), 4) == tokenizer_fingerprint(Slotted(), 4)
