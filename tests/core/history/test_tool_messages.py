"""Tool calls and results in the history (issue 25): their own columns and messages, the
v1 -> v2 migration, export/import, and the OpenAI-shaped messages the worker is sent."""
from __future__ import annotations

import json
import sqlite3

import pytest

from core.history.export import export_json, export_markdown, import_json
from core.history.records import HistoryError
from core.history.schema import SCHEMA_V1, SCHEMA_VERSION
from core.history.store import History
from core.history.tool_messages import calls_of, openai_message, result_record, stored_calls
from core.tools.spec import ToolCall, ToolResult

CALL = ToolCall("get_weather", {"city": "Paris", "days": 2}, id="call_abc")


def tool_chat(h: History) -> int:
    """user -> reply with one call -> its result -> the reply that used it."""
    c = h.create_conversation("weather")
    u = h.add_message(c.id, role="user", text="Weather in Paris?")
    a = h.add_message(c.id, role="assistant", text="", parent_id=u.id, stop_reason="tool_calls",
                      tool_calls=stored_calls([CALL], {"get_weather": "mcp:weather"}))
    res = ToolResult.bounded(CALL, "sunny, 21 C")
    t = h.add_message(c.id, role="tool", text=res.content, parent_id=a.id,
                      tool_result=result_record(res, "mcp:weather"))
    h.add_message(c.id, role="assistant", text="It is sunny.", parent_id=t.id, stop_reason="eos")
    return c.id


def test_a_reply_with_calls_and_a_tool_message_become_openai_messages():
    with History(":memory:") as h:
        cid = tool_chat(h)
        msgs = [openai_message(m) for m in h.current_path(cid)]
    assert msgs == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "name": "get_weather", "content": "sunny, 21 C"},
        {"role": "assistant", "content": "It is sunny."},
    ]


def test_calls_read_back_as_tool_calls_with_their_source():
    with History(":memory:") as h:
        cid = tool_chat(h)
        reply = h.current_path(cid)[1]
        tool = h.current_path(cid)[2]
    assert calls_of(reply) == [CALL]
    assert reply.tool_calls[0]["source"] == "mcp:weather"
    assert tool.tool_result == {"call_id": "call_abc", "name": "get_weather", "source": "mcp:weather",
                                "truncated": False, "is_error": False}


def test_arguments_that_do_not_parse_keep_their_text_and_say_why():
    bad = {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1'}}
    with History(":memory:") as h:
        c = h.create_conversation()
        m = h.add_message(c.id, role="assistant", text="", tool_calls=[bad])
        (call,) = calls_of(m)
    assert call.raw == '{"a": 1' and call.arguments == {} and "not valid JSON" in call.error


def test_a_version_1_store_is_migrated_and_keeps_its_messages(tmp_path):
    path = tmp_path / "history.sqlite3"
    con = sqlite3.connect(path)  # a store exactly as the version-1 schema made it
    con.executescript(SCHEMA_V1)
    con.execute("INSERT INTO conversations (title, created_at, updated_at, current_leaf_id) VALUES ('old', 1, 1, 1)")
    con.execute("INSERT INTO messages (conversation_id, role, text, created_at, meta)"
                " VALUES (1, 'user', 'from before tools', 1, '{}')")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    with History(path) as h:
        (old,) = h.current_path(1)
        assert old.text == "from before tools" and old.tool_calls is None and old.tool_result is None
        cid = tool_chat(h)  # the migrated store holds tool messages
        assert [m.role for m in h.current_path(cid)] == ["user", "assistant", "tool", "assistant"]
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 2  # 3: documents
    con.close()


def test_export_and_import_keep_calls_and_results():
    with History(":memory:") as h:
        cid = tool_chat(h)
        data = json.loads(json.dumps(export_json(h, cid)))
        new = import_json(h, data)
        before = [openai_message(m) for m in h.current_path(cid)]
        after = [openai_message(m) for m in h.current_path(new.id)]
        assert after == before
        assert [m.tool_result for m in h.current_path(new.id)] == [m.tool_result for m in h.current_path(cid)]


@pytest.mark.parametrize("field,value", [("tool_calls", {"id": "x"}), ("tool_calls", ["x"]), ("tool_result", [1])])
def test_an_import_with_malformed_tool_fields_is_refused_whole(field, value):
    with History(":memory:") as h:
        data = export_json(h, tool_chat(h))
        data["messages"][1][field] = value
        n = len(h.conversations())
        with pytest.raises(HistoryError, match=field):
            import_json(h, data)
        assert len(h.conversations()) == n


def test_markdown_shows_the_call_and_the_result():
    with History(":memory:") as h:
        md = export_markdown(h, tool_chat(h))
    assert "**Tool call** `get_weather` · mcp:weather" in md
    assert '"city": "Paris"' in md
    assert "## Tool result · get_weather" in md and "sunny, 21 C" in md


def test_delete_and_undo_keep_the_tool_columns():
    with History(":memory:") as h:
        cid = tool_chat(h)
        reply = h.current_path(cid)[1]
        snap = h.subtree_snapshot(reply.id)
        h.delete_message(reply.id)
        h.restore_subtree(snap)
        path = h.current_path(cid)
    assert calls_of(path[1]) == [CALL] and path[2].tool_result["call_id"] == "call_abc"


def test_a_damaged_tool_calls_value_opens_marked_damaged():
    with History(":memory:") as h:
        cid = tool_chat(h)
        reply = h.current_path(cid)[1]
        h._conn.execute("UPDATE messages SET tool_calls = '{\"not\": \"a list\"}' WHERE id = ?", (reply.id,))
        m = h.message(reply.id)
    assert m.tool_calls is None and "tool_calls" in m.meta["damaged"]
