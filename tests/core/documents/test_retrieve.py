"""BM25, dense through a pluggable embedder (cached by passage), hybrid by RRF."""
import hashlib
import importlib.util
import re

import numpy as np
import pytest

from core.documents.embedders import load_embedder
from core.documents.extract import DocumentError
from core.documents.retrieve import Retriever, rrf


class WordHashEmbedder:
    """Deterministic: a bag of hashed words (synonyms share a bucket via ``alias``)."""
    name = "test:wordhash"

    def __init__(self, alias=None):
        self.alias, self.calls = alias or {}, 0

    def embed(self, texts):
        self.calls += len(texts)
        out = np.zeros((len(texts), 64), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                w = self.alias.get(w, w)
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % 64] += 1
        return out


@pytest.fixture
def zoo(ix, tmp_path):
    p = tmp_path / "zoo.md"
    p.write_text("# Llamas\n\nLlamas hum when calm.\n\n# Otters\n\nOtters hold hands while asleep.\n\n"
                 "# Birds\n\nParrots mimic human speech.")
    blob, _ = ix.attach(p, max_tokens=12)
    return blob


def test_rrf_matches_the_formula():
    fused = dict(rrf([[1, 2, 3], [3, 1]], k=60))
    assert fused[1] == pytest.approx(1 / 61 + 1 / 62) and fused[3] == pytest.approx(1 / 63 + 1 / 61)
    assert fused[2] == pytest.approx(1 / 62) and [c for c, _ in rrf([[1, 2, 3], [3, 1]])][:2] == [1, 3]


def test_dense_finds_what_words_miss_and_caches(ix, zoo):
    emb = WordHashEmbedder(alias={"talk": "speech", "fowl": "parrots"})
    r = Retriever(ix, emb)
    assert r.search("which fowl talk", blobs=[zoo.id], k=1, mode="bm25") == []  # no shared word
    hit = r.search("which fowl talk", blobs=[zoo.id], k=1, mode="dense")[0]
    assert hit.heading == "Birds"
    calls = emb.calls
    r2 = Retriever(ix, emb)
    r2.search("otters", blobs=[zoo.id], k=1, mode="dense")
    assert emb.calls == calls + 1  # only the query: passages' vectors came from the store
    assert ix.q("SELECT count(*) FROM doc_embeddings")[0][0] == zoo.chunks


def test_hybrid_fuses_both(ix, zoo):
    r = Retriever(ix, WordHashEmbedder(alias={"talk": "speech"}))
    hits = r.search("otters talk", blobs=[zoo.id], k=3, mode="hybrid")
    assert {h.heading for h in hits[:2]} == {"Otters", "Birds"} and hits[0].score > hits[-1].score


def test_modes_without_an_embedder_are_refused(ix, zoo):
    with pytest.raises(DocumentError, match="needs an embedding model"):
        Retriever(ix).search("x", blobs=[zoo.id], mode="dense")
    with pytest.raises(DocumentError, match="must be one of"):
        Retriever(ix).search("x", blobs=[zoo.id], mode="magic")


def test_the_shipped_embedding_model_finds_passages_by_meaning(ix, zoo):
    """WordLlama (weights inside its wheel, nothing downloaded): unit vectors, one cache
    name, and questions sharing no word with their passage answered by meaning."""
    pytest.importorskip("wordllama")
    emb = load_embedder("wordllama")
    assert emb is load_embedder("wordllama") and emb.name == "wordllama:l2_supercat_256"
    v = emb.embed(["a puppy", "a young dog", "income tax law"])
    assert v.shape == (3, 256) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-4)
    assert v[0] @ v[1] > v[0] @ v[2]
    r = Retriever(ix, emb)
    for question, heading in (("which animal sleeps holding paws", "Otters"), ("birds that imitate talking", "Birds")):
        assert r.search(question, blobs=[zoo.id], k=1, mode="dense")[0].heading == heading


def test_an_unknown_or_missing_embedding_model_says_so():
    with pytest.raises(DocumentError, match="must be one of wordllama, bge-small"):
        load_embedder("word2vec")
    if importlib.util.find_spec("fastembed") is None:
        with pytest.raises(DocumentError, match="install fastembed"):
            load_embedder("bge-small")
