"""The index in the history store: migration, blobs cached by hash, FTS5 BM25."""
import sqlite3

import pytest

from core.documents.extract import DocumentError
from core.documents.index import DocumentIndex, fts_query, fts_terms
from core.history.schema import MIGRATIONS, SCHEMA_V1, SCHEMA_VERSION
from core.history.store import History


def test_a_version_1_history_gains_the_documents_tables(tmp_path):
    path = tmp_path / "history.sqlite3"
    con = sqlite3.connect(path)
    con.executescript(SCHEMA_V1)
    con.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('kept', 0, 0)")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    with DocumentIndex(path) as ix:
        assert ix.q("SELECT count(*) FROM doc_chunks")[0][0] == 0
    with History(path) as h:
        assert [c.title for c in h.conversations()] == ["kept"]


def test_attach_is_cached_by_content(ix, tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("Llamas hum softly.\n\nAlpacas spit.")
    b.write_text(a.read_text())
    blob1, doc = ix.attach(a)
    blob2, again = ix.attach(b)
    assert blob1.id == blob2.id and blob1.chunks == 1 and doc.sha256 == blob1.sha256
    assert again is None and blob2.attached  # known by its hash: not parsed again
    assert ix.q("SELECT count(*) FROM doc_blobs")[0][0] == 1


def test_bm25_finds_the_passage_and_user_syntax_is_inert(ix, tmp_path):
    p = tmp_path / "zoo.md"
    p.write_text("# Llamas\n\nLlamas hum when calm.\n\n# Otters\n\nOtters hold hands while asleep.\n\n"
                 "# Birds\n\nParrots mimic speech.")
    blob, _ = ix.attach(p, max_tokens=12)
    hits = ix.hits([c for c, _ in ix.bm25("do otters sleep holding hands?", [blob.id])])
    assert hits[0].heading == "Otters" and hits[0].where() == "zoo.md, lines 5-7"
    assert ix.bm25('NEAR(" OR text:*', [blob.id]) == [] and fts_query('a:"b" OR c*') == '"a" OR "b" OR "or" OR "c"'


def test_deleting_a_blob_removes_its_fts_rows(ix, tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("quokka smiles")
    blob, _ = ix.attach(p)
    with ix.tx() as c:
        c.execute("DELETE FROM doc_blobs WHERE id = ?", (blob.id,))
    assert ix.q("SELECT count(*) FROM doc_chunks_fts WHERE doc_chunks_fts MATCH 'quokka'")[0][0] == 0


def test_collection_on_a_missing_folder_is_refused(ix, tmp_path):
    with pytest.raises(DocumentError, match="not a folder"):
        ix.add_collection(tmp_path / "nope")


def test_in_memory_index():
    with DocumentIndex(":memory:") as ix:
        assert ix.collections() == []


def test_a_version_2_history_with_tool_messages_gains_documents(tmp_path):
    path = tmp_path / "history.sqlite3"
    con = sqlite3.connect(path)
    con.executescript(SCHEMA_V1)
    MIGRATIONS[1](con)
    con.execute("PRAGMA user_version = 2")
    con.commit()
    con.close()
    with DocumentIndex(path) as ix:
        assert ix.q("PRAGMA user_version")[0][0] == SCHEMA_VERSION == 3
        assert {r[1] for r in ix.q("PRAGMA table_info(messages)")} >= {"tool_calls", "tool_result"}


def test_bm25_over_everything_equals_bm25_over_the_same_scope_by_join(ix, tmp_path):
    blobs = []
    for i, text in enumerate(["llamas hum and llamas spit", "otters hold hands", "llamas are camelids"]):
        (tmp_path / f"{i}.txt").write_text(text)
        blobs.append(ix.attach(tmp_path / f"{i}.txt")[0].id)
    everything = ix.bm25("llamas otters", blobs, 10)  # the join-free path
    subset = ix.bm25("llamas otters", blobs[:2], 10)  # the joined path
    third = ix.chunks(blobs[2])[0].chunk_id
    assert len(everything) == 3 and [c for c, _ in subset] == [c for c, _ in everything if c != third]
    assert dict(subset) == pytest.approx({c: s for c, s in everything if c in dict(subset)})


class _Chars:
    """A stand-in tokenizer counter: one token per 4 characters, keyed like a model's."""
    key = "chars4"

    def __call__(self, text: str) -> int:
        return -(-len(text) // 4)


def test_attach_is_cached_by_content_and_by_the_counter(ix, tmp_path):
    f = tmp_path / "long.md"
    f.write_text("\n\n".join(f"Paragraph {i} about harbours, boats, gulls and the tide." for i in range(60)))
    words, _ = ix.attach(f)
    chars, doc = ix.attach(f, _Chars(), max_tokens=64)
    assert doc is not None and chars.id != words.id  # cut again, in the other counter's tokens
    rows = ix.q("SELECT text, tokens FROM doc_chunks WHERE blob_id = ?", (chars.id,))
    assert chars.sha256 == f"{words.sha256}|chars4|64" and len(rows) == chars.chunks > words.chunks
    assert all(_Chars()(text) == n <= 64 for text, n in rows)
    assert ix.attach(f, _Chars(), max_tokens=64) == (chars, None) and ix.attach(f) == (words, None)


def _typing_corpus(ix, tmp_path):
    """Passages sharing common words, a few holding rarer ones (headings, "_", capitals)."""
    f = tmp_path / "corpus.md"
    common = "the data of the system and the value in the file"
    parts = [f"## Part {i}\n\n{common} number{i % 7} entry{i % 13} " + ("Zebra_stripes shine. " if i % 17 == 0 else "")
             + ("the the the value " * (i % 3)) for i in range(120)]
    parts.append("## Zebra notes\n\nThe zebra data file: zebra stripes in the system.")
    f.write_text("\n\n".join(parts))
    blob, _ = ix.attach(f, max_tokens=40)
    return blob


def test_python_bm25_is_fts5s_bm25(ix, tmp_path):
    """The pruned search scores candidates in Python: the same numbers FTS5's bm25() gives."""
    from core.documents import bm25
    blob = _typing_corpus(ix, tmp_path)
    terms = ["zebra", "data", "the", "stripes", "number3"]
    match = " OR ".join(f'"{t}"' for t in terms)
    fts = dict(ix.q("SELECT rowid, -bm25(doc_chunks_fts, 1.0, 0.5) FROM doc_chunks_fts WHERE doc_chunks_fts MATCH ?",
                    (match,)))
    df = ix._df(terms)
    scorer = bm25.Scorer(terms, df, *ix._averages())
    rows = ix.q("SELECT k.id, k.heading, k.text, d.sz FROM doc_chunks k JOIN doc_chunks_fts_docsize d ON d.id = k.id"
                " WHERE k.blob_id = ?", (blob.id,))
    ours = {r[0]: scorer.score(r[2], r[1], sum(bm25.varints(r[3]))) for r in rows}
    assert len(fts) > 50 and all(ours[i] == pytest.approx(s, rel=1e-9) for i, s in fts.items())


def test_pruned_bm25_ranks_as_the_full_search(ix, tmp_path, monkeypatch):
    from core.documents import bm25
    blob = _typing_corpus(ix, tmp_path)
    ix.candidate_rows = 3  # prune even this small index: "zebra"/"entry5" pick the candidates
    monkeypatch.setattr(bm25, "ROW_COST", 1)
    for q in ("the zebra data stripes", "value of the zebra file", "the system number3 entry5 data"):
        terms = fts_terms(q)
        assert bm25.rare_terms(terms, ix._df(terms), ix._averages()[0], 3) in (["zebra"], ["entry5"])
        full, pruned = ix.bm25(q, [blob.id], 5, prune=False), ix.bm25(q, [blob.id], 5)
        assert [c for c, _ in pruned] == [c for c, _ in full], q
        assert [s for _, s in pruned] == pytest.approx([s for _, s in full], rel=1e-9)
