"""Grounded prompts: whole when they fit, else retrieved passages; numbered sources whose
spans point at their text in the prompt."""
import pytest

from core.documents.collect import index_collection
from core.documents.extract import DocumentError
from core.documents.ground import Grounding, default_budget, ground


def _check_spans(g):
    for s in g.sources:
        a, b = s.span
        assert g.prompt[a - len(s.where()) - len(f"[{s.number}] ") - 1:a].startswith(f"[{s.number}] {s.where()}")
        assert b > a


def test_small_attachments_are_read_in_full(ix, tmp_path):
    a, b = tmp_path / "a.md", tmp_path / "b.txt"
    a.write_text("# Llamas\n\nLlamas hum.")
    b.write_text("Alpacas spit.")
    g = ground("Who hums?", ix, attachments=[a, b], budget_tokens=1000)
    assert g.mode == "full" and g.summary == "read in full" and [s.number for s in g.sources] == [1, 2]
    assert g.prompt.endswith("Question: Who hums?") and "[1] a.md\n# Llamas\n\nLlamas hum." in g.prompt
    assert g.prompt[slice(*g.sources[1].span)] == "Alpacas spit." and g.sources[1].whole
    _check_spans(g)


def test_too_big_retrieves_within_the_budget(ix, tmp_path):
    p = tmp_path / "big.md"
    p.write_text("\n\n".join(f"# Part {i}\n\n" + f"filler text number {i} " * 20 for i in range(40))
                 + "\n\n# Secret\n\nThe vault code is kumquat.")
    count = lambda s: len(s.split())  # noqa: E731
    g = ground("what is the vault code?", ix, attachments=[p], budget_tokens=200, count_tokens=count)
    assert g.mode == "retrieved" and g.tokens <= 200 and g.total == 41
    assert g.summary == f"{g.used} of 41 passages used" and 1 <= g.used < 41
    assert "kumquat" in g.prompt[slice(*g.sources[0].span)] and g.sources[0].where() == "big.md, lines 161-163"
    _check_spans(g)
    g3 = ground("vault code", ix, attachments=[p], budget_tokens=10_000, count_tokens=count, k=3)
    assert g3.used == 3 or g3.mode == "full"


def test_collection_and_meta_round_trip(ix, tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / "x.txt").write_text("Guanacos are wild.")
    (root / "y.txt").write_text("Vicunas are small.")
    index_collection(ix, root)
    g = ground("are vicunas small", ix, collections=[root], budget_tokens=500)
    assert g.mode == "retrieved" and g.sources[0].source == str(root / "y.txt") and g.total == 2
    assert Grounding.from_meta(g.to_meta()) == g
    with pytest.raises(DocumentError, match="not an indexed collection"):
        ground("q", ix, collections=[tmp_path], budget_tokens=100)
    assert default_budget(4096) == 2048


def test_nothing_fits(ix, tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("word " * 400)
    g = ground("word", ix, attachments=[p], budget_tokens=30)
    assert g.mode == "none" and g.used == 0 and "budget" in g.notes[-1]


def test_a_caveat_is_said_again_when_the_file_comes_from_the_cache(ix, tmp_path):
    p = tmp_path / "latin.txt"
    p.write_bytes(b"caf\xe9 au lait")
    for _ in range(2):
        g = ground("coffee", ix, attachments=[p], budget_tokens=500)
        assert g.mode == "full" and len(g.notes) == 1 and g.notes[0].startswith("latin.txt: not valid UTF-8")
