"""The index in the history store: migration, blobs cached by hash, FTS5 BM25."""
import sqlite3

import pytest

from core.documents.extract import DocumentError
from core.documents.index import DocumentIndex, fts_query
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
