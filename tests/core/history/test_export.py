"""core.history.export: Markdown export, JSON export that imports back, bad files refused."""
from __future__ import annotations

import json

import pytest

from core.history.export import EXPORT_FORMAT, export_json, export_markdown, import_json
from core.errors import LlamaDeskError
from core.history.records import HistoryError
from tests.helpers import greetings_chat as chat, texts
from core.history.export import export_file_name, read_export


def test_export_markdown(h):
    c, u, a1, a2 = chat(h)
    h.select(a1.id)
    md = export_markdown(h, c.id)
    assert md.startswith("# Greetings\n")
    assert "## User\n\nHello there" in md and "## Assistant\n\nHi! v1" in md
    assert "Hi! v2" not in md  # only the branch on screen
    line = next(l for l in md.splitlines() if l.startswith("> "))
    for part in ("version 1 of 2", "temperature 0.7", "top_p 0.9", "seed 11", "model tiny",
                 "4 tokens", "stop: eos"):
        assert part in line


def test_export_import_round_trip(h):
    c, u, a1, a2 = chat(h)
    h.add_message(c.id, role="user", text="follow-up", parent_id=a1.id,
                  meta={"note": "ü"})
    h.select(a2.id)
    data = export_json(h, c.id)
    assert data["format"] == EXPORT_FORMAT and data["version"] == 1
    data = json.loads(json.dumps(data))  # it really is JSON
    c2 = import_json(h, data)
    assert c2.id != c.id and c2.title == "Greetings"
    old, new = h.messages(c.id), h.messages(c2.id)
    assert {m.id for m in old}.isdisjoint({m.id for m in new})

    def shape(msgs):
        index = {m.id: i for i, m in enumerate(msgs)}
        return [(index.get(m.parent_id), m.role, m.text, m.settings, m.seed, m.model_id, m.stats,
                 m.stop_reason, m.created_at, m.meta) for m in msgs]

    assert shape(old) == shape(new)
    assert texts(h.current_path(c2.id)) == texts(h.current_path(c.id))
    exported_again = export_json(h, c2.id)
    for d in (data, exported_again):
        d.pop("exported_at")
        d["conversation"].pop("current_leaf_id")
        for m in d["messages"]:
            m.pop("id"), m.pop("parent_id")
    assert exported_again == data


@pytest.mark.parametrize("data, match", [
    ([], "JSON object"),
    ({"format": "something.else", "version": 1}, "format"),
    ({"format": EXPORT_FORMAT, "version": 99, "conversation": {"title": "x"}}, "newer"),
    ({"format": EXPORT_FORMAT, "version": "1"}, "version"),
    ({"format": EXPORT_FORMAT, "version": 1}, "conversation"),
    ({"format": EXPORT_FORMAT, "version": 1, "conversation": {"title": 3}}, "title"),
    ({"format": EXPORT_FORMAT, "version": 1, "conversation": {"title": "x", "kind": "poem"}}, "kind"),
    ({"format": EXPORT_FORMAT, "version": 1, "conversation": {"title": "x"}, "messages": {}}, "list"),
    ({"format": EXPORT_FORMAT, "version": 1, "conversation": {"title": "x"},
      "messages": [{"id": 1, "role": "user"}]}, "text"),
    ({"format": EXPORT_FORMAT, "version": 1, "conversation": {"title": "x"},
      "messages": [{"id": 2, "parent_id": 7, "role": "user", "text": "a"}]}, "parent_id"),
    ({"format": EXPORT_FORMAT, "version": 1, "conversation": {"title": "x"},
      "messages": [{"id": 1, "role": "user", "text": "a"}, {"id": 1, "role": "user", "text": "b"}]},
     "repeats"),
    ({"format": EXPORT_FORMAT, "version": 1, "conversation": {"title": "x", "current_leaf_id": 5},
      "messages": []}, "current_leaf_id"),
    ({"format": EXPORT_FORMAT, "version": 1, "conversation": {"title": "x"},
      "messages": [{"id": 1, "role": "user", "text": "a", "settings": [1]}]}, "settings"),
])
def test_bad_import_raises_history_error(h, data, match):
    before = len(h.conversations())
    with pytest.raises(HistoryError, match=match) as err:
        import_json(h, data)
    assert isinstance(err.value, LlamaDeskError)
    assert len(h.conversations()) == before  # nothing half-written


def test_read_export_refuses_non_json_in_the_users_words(tmp_path):
    (tmp_path / "a.json").write_text('{"format": "llamadesk.conversation"}', encoding="utf-8")
    assert read_export(tmp_path / "a.json") == {"format": "llamadesk.conversation"}
    for name, data, words in [("notes.txt", b"hello", "not JSON"), ("img.json", b"\xff\xd8\xff\xe0", "not a text file")]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(HistoryError) as e:
            read_export(tmp_path / name)
        assert f"{name} is not a LlamaDesk conversation file" in str(e.value) and words in str(e.value)
        assert "Expecting value" not in str(e.value) and "codec" not in str(e.value)
    with pytest.raises(HistoryError, match="cannot read missing.json"):
        read_export(tmp_path / "missing.json")


@pytest.mark.parametrize("title, name", [("What is 2+2?", "What is 2 2"), ("Hello!", "Hello"),
                                         ("Tell me a story.", "Tell me a story"), ("***", "chat"),
                                         ("a/b\\c: d", "a b c d")])
def test_export_file_name_never_ends_in_punctuation(title, name):
    assert export_file_name(title, "md") == f"{name}.md"
