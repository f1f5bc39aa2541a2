"""core.history.store: message trees, search, comparisons, durability across a killed process."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.history.export import export_json, export_markdown, import_json
from core.history.records import HistoryError
from core.history.schema import SCHEMA_VERSION
from core.history.store import History
from tests.helpers import greetings_chat as chat, texts

ROOT = Path(__file__).resolve().parents[3]


def test_creates_folders_schema_and_wal(tmp_path):
    path = tmp_path / "a" / "b" / "h.sqlite3"
    with History(path):
        pass
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()
    History(path).close()  # reopening an existing file is fine


def test_newer_schema_or_foreign_db_is_refused(tmp_path):
    newer = tmp_path / "newer.sqlite3"
    History(newer).close()
    con = sqlite3.connect(newer)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(HistoryError, match="newer"):
        History(newer)
    foreign = tmp_path / "foreign.sqlite3"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE x (y)")
    con.close()
    with pytest.raises(HistoryError, match="not a LlamaDesk"):
        History(foreign)


def test_memory_database():
    with History(":memory:") as h:
        c = h.create_conversation()
        assert c.title == "New chat" and c.kind == "chat" and c.current_leaf_id is None
        assert h.current_path(c.id) == []


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "d"))
    assert History.default_path() == tmp_path / "d" / "history.sqlite3"
    monkeypatch.delenv("LLAMADESK_DATA_DIR")
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        assert History.default_path() == tmp_path / "xdg" / "LlamaDesk" / "history.sqlite3"
        monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
        assert History.default_path() == Path.home() / ".local/share/LlamaDesk/history.sqlite3"


def test_tree_versions_and_current_path(h):
    c, u, a1, a2 = chat(h)
    assert h.conversation(c.id).current_leaf_id == a2.id
    assert texts(h.current_path(c.id)) == ["Hello there", "Hi! v2"]
    assert texts(h.siblings(a1.id)) == ["Hi! v1", "Hi! v2"]
    assert texts(h.siblings(u.id)) == ["Hello there"]
    assert len(h.messages(c.id)) == 3

    h.select(a1.id)
    assert texts(h.current_path(c.id)) == ["Hello there", "Hi! v1"]
    m = h.current_path(c.id)[1]
    assert m.settings == {"temperature": 0.7, "top_p": 0.9} and m.seed == 11
    assert m.stats == {"tokens": 4, "tokens_per_s": 12.5} and m.stop_reason == "eos"
    assert m.model_id == "tiny" and m.parent_id == u.id

    # Continue under v1, then edit-and-resend the first user message: a new root branch.
    u2 = h.add_message(c.id, role="user", text="More?", parent_id=a1.id)
    a3 = h.add_message(c.id, role="assistant", text="Sure", parent_id=u2.id)
    e = h.add_message(c.id, role="user", text="Hello (edited)")
    h.add_message(c.id, role="assistant", text="Edited reply", parent_id=e.id)
    assert texts(h.current_path(c.id)) == ["Hello (edited)", "Edited reply"]
    assert texts(h.siblings(u.id)) == ["Hello there", "Hello (edited)"]

    # Switching back to the old user version descends to its newest leaf.
    h.select(u.id)
    assert texts(h.current_path(c.id)) == ["Hello there", "Hi! v1", "More?", "Sure"]
    h.select(a2.id)
    assert texts(h.current_path(c.id)) == ["Hello there", "Hi! v2"]
    h.set_current_leaf(c.id, a3.id)
    assert h.current_path(c.id)[-1].id == a3.id
    assert texts(h.children(u.id)) == ["Hi! v1", "Hi! v2"]
    assert texts(h.children(None, c.id)) == ["Hello there", "Hello (edited)"]

    # make_current=False leaves the screen alone (a lane or draft stored on the side).
    h.add_message(c.id, role="assistant", text="side", parent_id=u2.id, make_current=False)
    assert h.current_path(c.id)[-1].id == a3.id


def test_update_and_delete_message(h):
    c, u, a1, a2 = chat(h)
    m = h.update_message(a2.id, text="Hi! v2, continued", stop_reason="length",
                         stats={"tokens": 9})
    assert (m.text, m.stop_reason, m.stats) == ("Hi! v2, continued", "length", {"tokens": 9})
    with pytest.raises(HistoryError, match="parent_id"):
        h.update_message(a2.id, parent_id=None)

    u2 = h.add_message(c.id, role="user", text="next", parent_id=a2.id)
    h.add_message(c.id, role="assistant", text="deep", parent_id=u2.id)
    h.delete_message(a2.id)  # its subtree goes too; the leaf moves to the parent
    assert texts(h.messages(c.id)) == ["Hello there", "Hi! v1"]
    assert h.conversation(c.id).current_leaf_id == u.id
    assert texts(h.siblings(a1.id)) == ["Hi! v1"]

    h.select(a1.id)
    h.delete_message(u.id)  # the root: the conversation empties
    assert h.messages(c.id) == [] and h.conversation(c.id).current_leaf_id is None

    with pytest.raises(HistoryError):
        h.delete_message(123456)
    other = h.create_conversation()
    x = h.add_message(other.id, role="user", text="x")
    with pytest.raises(HistoryError):
        h.add_message(c.id, role="assistant", text="y", parent_id=x.id)  # wrong conversation
    with pytest.raises(HistoryError):
        h.set_current_leaf(c.id, x.id)


def test_delete_keeps_leaf_when_outside_subtree(h):
    c, u, a1, a2 = chat(h)
    h.delete_message(a1.id)  # not on screen
    assert h.conversation(c.id).current_leaf_id == a2.id


def test_list_search_rename_delete(h):
    c1 = h.create_conversation("Cooking pasta")
    h.add_message(c1.id, role="user", text="How long to boil SPAGHETTI?")
    c2 = h.create_conversation("Rust lifetimes")
    h.add_message(c2.id, role="user", text="Explain 'a in Größe terms")
    c3 = h.create_conversation("Empty")
    assert [c.id for c in h.conversations()] == [c3.id, c2.id, c1.id]  # newest first
    assert [c.id for c in h.conversations(search="spaghetti")] == [c1.id]  # message text
    assert [c.id for c in h.conversations(search="LIFETIMES")] == [c2.id]  # title
    assert [c.id for c in h.conversations(search="GRÖSSE")] == [c2.id]  # beyond ASCII
    assert [c.id for c in h.conversations(search="100%_")] == []  # no wildcards
    assert h.conversations(search="") == h.conversations()

    h.add_message(c1.id, role="assistant", text="About 10 minutes.")
    assert h.conversations()[0].id == c1.id  # activity bumps it to the top
    h.rename(c2.id, "Borrow checker")
    assert h.conversation(c2.id).title == "Borrow checker"
    assert h.conversations(search="borrow")[0].id == c2.id
    h.delete_conversation(c1.id)
    assert c1.id not in [c.id for c in h.conversations()]
    with pytest.raises(HistoryError):
        h.conversation(c1.id)
    with pytest.raises(HistoryError):
        h.rename(c1.id, "x")
    n = h._q("SELECT count(*) FROM messages WHERE conversation_id = ?", (c1.id,))[0][0]
    assert n == 0


def test_comparison_store_export_search(h):
    prompt = {"messages": [{"role": "user", "content": "Name a colour"}], "chat_format": "llama3"}
    lanes = [
        {"settings": {"temperature": 0.0}, "seed": 1, "text": "Blue", "tokens": [5, 6],
         "logprobs": [-0.1, -0.5], "stop_reason": "eos", "stats": {"tokens": 2}},
        {"settings": {"temperature": 1.2}, "seed": 2, "text": "Vermilion", "tokens": (7,),
         "logprobs": [-2.0], "stop_reason": "length", "stats": {"tokens": 1}},
    ]
    c = h.save_comparison("Colours", prompt, lanes)
    assert c.kind == "comparison"
    got = h.comparison(c.id)
    assert got["prompt"] == prompt and got["lanes"][1]["tokens"] == [7]
    assert got["lanes"][0]["logprobs"] == [-0.1, -0.5]
    assert [x.id for x in h.conversations(kind="comparison")] == [c.id]
    assert h.conversations(kind="chat") == []
    assert [x.id for x in h.conversations(search="vermilion")] == [c.id]
    md = export_markdown(h, c.id)
    assert "Name a colour" in md and "## Lane 2" in md and "Vermilion" in md
    assert "temperature 1.2" in md and "stop: length" in md
    c2 = import_json(h, json.loads(json.dumps(export_json(h, c.id))))
    assert h.comparison(c2.id) == got
    assert c2.id in [x.id for x in h.conversations(search="vermilion")]
    plain = h.create_conversation()
    with pytest.raises(HistoryError, match="not a comparison"):
        h.comparison(plain.id)


_WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from core.history.store import History
    h = History(sys.argv[1])
    c = h.create_conversation("crash test")
    parent = None
    for i in range(100000):
        m = h.add_message(c.id, role="user" if i % 2 == 0 else "assistant",
                          text=f"message {i}", parent_id=parent, stats={"i": i})
        parent = m.id
        print(c.id, m.id, flush=True)  # printed only after the commit returned
""")


def test_committed_messages_survive_sigkill(tmp_path):
    if not hasattr(signal, "SIGKILL"):
        pytest.skip("no SIGKILL on this platform")
    path = tmp_path / "h.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(ROOT)],
                            stdout=subprocess.PIPE, text=True)
    committed = []
    try:
        for line in proc.stdout:
            committed.append(tuple(map(int, line.split())))
            if len(committed) == 25:
                break
        # Killed mid-stream: it is still writing more messages as we kill it.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(committed) == 25
    with History(path) as h:
        conv_id = committed[0][0]
        ids = [m.id for m in h.messages(conv_id)]
        assert ids[:25] == [mid for _, mid in committed]  # every committed message is there
        path_ = h.current_path(conv_id)
        assert [m.text for m in path_] == [f"message {i}" for i in range(len(path_))]
        assert len(path_) == len(ids)  # current leaf and tree agree (no torn write)
        assert h._q("PRAGMA integrity_check")[0][0] == "ok"


def test_a_deleted_subtree_is_restored_with_its_ids_or_refused_cleanly(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    c = h.create_conversation("t")
    u = h.add_message(c.id, role="user", text="q")
    a1 = h.add_message(c.id, role="assistant", text="a1", parent_id=u.id, stats={"n": 1}, meta={"k": "é"})
    a2 = h.add_message(c.id, role="assistant", text="a2", parent_id=u.id)
    h.select(a1.id)
    follow = h.add_message(c.id, role="user", text="more", parent_id=a1.id)
    before = h.messages(c.id)
    snap = h.subtree_snapshot(a1.id)
    h.delete_message(a1.id)
    assert [m.id for m in h.messages(c.id)] == [u.id, a2.id]
    h.restore_subtree(snap)
    assert h.messages(c.id) == before
    assert h.conversation(c.id).current_leaf_id == follow.id
    h.delete_message(a1.id)
    h.add_message(c.id, role="user", text="took an id", parent_id=a2.id)  # may reuse a freed id
    h.delete_conversation(c.id)
    with pytest.raises(HistoryError):
        h.restore_subtree(snap)
    h.close()
