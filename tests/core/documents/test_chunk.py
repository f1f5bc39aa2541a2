"""Passages along headings and paragraphs, sized in tokens, with their line ranges."""
import pytest

from core.documents.chunk import approx_tokens, chunk_document
from core.documents.extract import Document, Section

TEXT = """# Intro

Llamas are camelids.
They hum.

Second paragraph here.

## Care

Feed them hay.
"""


def _doc(text, **kw):
    return Document("/d/notes.md", "markdown", [Section(text, **kw)], size=len(text), sha256="x")


def test_headings_start_passages_and_lines_are_exact():
    chunks = chunk_document(_doc(TEXT), max_tokens=64)
    assert [c.heading for c in chunks] == ["Intro", "Care"]
    assert chunks[0].text == "# Intro\n\nLlamas are camelids.\nThey hum.\n\nSecond paragraph here."
    assert (chunks[0].line_start, chunks[0].line_end) == (1, 6)
    assert (chunks[1].line_start, chunks[1].line_end) == (8, 10)
    lines = TEXT.split("\n")
    assert lines[chunks[1].line_end - 1] == "Feed them hay."
    assert chunks[1].where() == "notes.md, lines 8-10"


def test_every_chunk_fits_the_token_budget_and_nothing_is_lost():
    words = [f"w{i}" for i in range(3000)]
    text = "\n\n".join(" ".join(words[i:i + 37]) + "." for i in range(0, 3000, 37))
    text += "\n\n" + " ".join(words)  # one paragraph far over the budget
    count = lambda s: len(s.split())  # noqa: E731 — a tokenizer that counts words
    chunks = chunk_document(_doc(text), count, max_tokens=50)
    assert all(count(c.text) <= 50 for c in chunks), max(count(c.text) for c in chunks)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert " ".join(c.text for c in chunks).split() == text.split()


def test_pdf_pages_keep_their_numbers():
    doc = Document("/d/p.pdf", "pdf", [Section("one\n\ntwo", page=1), Section("three", page=4)], 1, "x", pages=4)
    chunks = chunk_document(doc, max_tokens=16)
    assert [(c.page, c.line_start, c.line_end) for c in chunks] == [(1, 1, 3), (4, 1, 1)]
    assert chunks[1].where() == "p.pdf, p. 4, line 1"


def test_token_counter_is_the_one_given():
    seen = []
    chunk_document(_doc("alpha beta\n\ngamma"), lambda s: seen.append(s) or len(s), max_tokens=100)
    assert "alpha beta" in seen
    assert approx_tokens("Hello, world!") == 4
    with pytest.raises(ValueError):
        chunk_document(_doc("x"), max_tokens=2)
