"""`python -m core documents …` and `generate --attach/--collection`: results on stdout,
bad input exit 2 with one line."""
import json

import pytest

from tests.core.cli.helpers import run_cli


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "zoo.md").write_text("# Llamas\n\nLlamas hum when calm.\n\n# Otters\n\nOtters hold hands while asleep.\n")
    (root / "sub" / "story.txt").write_text("Lily went to the park with her dog.")
    (root / "bad.txt").write_bytes(b"\x00\x01bin")
    return root


def test_index_search_list_remove(capsys, tmp_path, folder):
    store = ["--store", tmp_path / "h.sqlite3"]
    rc, out, err = run_cli(capsys, "documents", "index", folder, "--json", *store)
    obj = json.loads(out)
    assert rc == 0 and (obj["files"], obj["read"], obj["passages"]) == (3, 2, 3)
    assert obj["skipped"] == [{"path": str(folder / "bad.txt"), "reason": "it holds NUL bytes: a binary file, not text"}]
    rc, out, _ = run_cli(capsys, "documents", "search", "do otters sleep", "--json", "-k", "2", *store)
    hits = json.loads(out)["hits"]
    assert rc == 0 and hits[0]["where"] == "zoo.md, lines 5-7" and hits[0]["source"] == str(folder / "zoo.md")
    rc, out, _ = run_cli(capsys, "documents", "list", *store)
    assert rc == 0 and out.startswith(f"{folder}\tdone\t3 files\t1 skipped\t3 passages")
    rc, out, _ = run_cli(capsys, "documents", "remove", folder, *store)
    assert rc == 0 and run_cli(capsys, "documents", "list", "--json", *store)[1].strip() == '{"collections": []}'


def test_dense_and_hybrid_search_with_the_shipped_embedding_model(capsys, tmp_path, folder):
    """WordLlama's weights ship in its wheel: dense retrieval with no download; a question
    that shares no word with the passage (BM25 finds nothing) still finds it."""
    pytest.importorskip("wordllama")
    store = ["--store", tmp_path / "h.sqlite3"]
    run_cli(capsys, "documents", "index", folder, *store)
    question = "which animal sleeps holding paws"
    assert json.loads(run_cli(capsys, "documents", "search", question, "--json", *store)[1])["hits"] == []
    for mode in ("dense", "hybrid"):
        rc, out, err = run_cli(capsys, "documents", "search", question, "--mode", mode, "-k", "1", "--json", *store)
        obj = json.loads(out)
        assert rc == 0 and obj["embedder"] == "wordllama" and obj["hits"][0]["where"] == "zoo.md, lines 5-7", err


@pytest.mark.parametrize("argv,msg", [
    (["documents", "index", "/no/such/folder"], "is not a folder"),
    (["documents", "remove", "/no/such/folder"], "is not an indexed collection"),
    (["documents", "search", "q", "--collection", "/no/such"], "is not an indexed collection"),
    (["documents", "search", "q", "-k", "0"], "-k must be at least 1"),
    (["documents", "search", "q", "--mode", "dense", "--embedder", "bge-small"], "needs an embedding model"),
    (["documents", "search", "q", "--mode", "dense", "--embedder", "nope"], "invalid choice: 'nope'"),
    (["documents", "index", ".", "--chunk-tokens", "2"], "--chunk-tokens must be at least 8"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, msg):
    rc, out, err = run_cli(capsys, *argv, "--store", tmp_path / "h.sqlite3")
    assert rc == 2 and out == "" and err.count("\n") == 1 and msg in err


def test_generate_with_attachments_and_a_collection(capsys, tmp_path, folder, fixtures):
    model, store = fixtures / "stories260K.gguf", ["--store", tmp_path / "h.sqlite3"]
    base = ["generate", model, "--prompt", "Where did Lily go?", "--max-new-tokens", "3", "--temperature", "0", *store]
    rc, out, err = run_cli(capsys, *base, "--attach", folder / "sub" / "story.txt", folder / "zoo.md")
    assert rc == 0 and err.startswith("documents: read in full\n  [1] story.txt\n  [2] zoo.md\n")
    rc, out, err = run_cli(capsys, *base, "--attach", folder / "zoo.md", "--json")
    doc = json.loads(out)["documents"]
    assert doc["summary"] == "read in full" and doc["prompt"].endswith("Question: Where did Lily go?")
    run_cli(capsys, "documents", "index", folder, *store)
    rc, out, err = run_cli(capsys, *base, "--collection", folder, "--json")
    doc = json.loads(out)["documents"]
    assert rc == 0 and doc["mode"] == "retrieved" and doc["sources"][0]["source"] == str(folder / "sub" / "story.txt")
    a, b = doc["sources"][0]["span"]
    assert doc["prompt"][a:b] == "Lily went to the park with her dog."


@pytest.mark.parametrize("extra,msg", [
    (["--attach", "BAD"], "binary file"),
    (["--doc-budget", "100"], "--doc-budget needs --attach or --collection"),
    (["--collection", "/no/such"], "is not an indexed collection"),
    (["--attach", "ZOO", "--doc-budget", "3"], "--doc-budget must be at least 16"),
])
def test_generate_bad_documents_exit_2(capsys, tmp_path, folder, fixtures, extra, msg):
    extra = [str(folder / "bad.txt") if e == "BAD" else str(folder / "zoo.md") if e == "ZOO" else e for e in extra]
    rc, out, err = run_cli(capsys, "generate", fixtures / "stories260K.gguf", "--prompt", "q", "--max-new-tokens", "2",
                           "--store", tmp_path / "h.sqlite3", *extra)
    assert rc == 2 and err.count("\n") == 1 and msg in err
