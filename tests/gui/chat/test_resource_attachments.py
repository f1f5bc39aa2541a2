"""MCP resources attached to a message (issue 25 item 3): a chip above the prompt while it
is read (never text pasted into the editor), stored with the message when it is sent, shown
as a chip on it, sent to the model after its text, and kept by export/import."""
from __future__ import annotations

import asyncio

from core.history.export import export_json, import_json
from core.tools.mcp_shapes import McpResource, ResourceText
from gui.chat import attached_resources
from gui.chat.column import ChatColumn
from tests.gui.chat.test_attachments import chats  # noqa: F401  (fixture)
from tests.gui.ui_helpers import loop, run, until  # noqa: F401  (fixtures)

README = McpResource("local", "note://readme", "readme", "The project's readme")
GONE = McpResource("other", "note://gone", "gone")


async def read(resource):
    await asyncio.sleep(0)
    if resource is GONE:
        raise LookupError("MCP server 'other' is no longer connected")
    return ResourceText(resource.uri, "hello from the server\n```py\nx = 1\n```", "text/markdown")


def test_a_resource_is_a_chip_stored_with_its_message_and_sent_after_it(loop, chats, qtbot):  # noqa: F811
    c = chats
    col = ChatColumn()
    qtbot.addWidget(col)
    col.attach(c)
    col.resize(760, 520)
    col.show()
    c.attachments.add_resource(README, read)
    c.attachments.add_resource(GONE, read)
    assert "readme · local" in col.attach_bar.chips.text() and "reading…" in col.attach_bar.chips.text()
    run(loop, until(lambda: all(r.state != "reading" for r in c.attachments.resources), 10, "the reads"))
    chips = col.attach_bar.chips.text()
    assert "37 characters" in chips and "no longer connected" in chips and col.prompt.text() == ""
    col.grab().save("/tmp/tools2-resource-chips.png")
    assert c.send("Summarise it")
    run(loop, until(lambda: not c.busy and len(c.conversation.path()) == 2, 20, "the reply"))
    sent = c.reply.bridge.requests[-1].messages[-1]["content"]
    assert sent == "Summarise it\n\nreadme (note://readme):\n~~~~\nhello from the server\n```py\nx = 1\n```\n~~~~"
    user = c.conversation.path()[0]
    assert user.text == "Summarise it" and [r["uri"] for r in attached_resources.resources_of(user.meta)] == [
        "note://readme"]  # the one that could not be read is left out
    assert c.conversation.view_messages()[0]["documents"] == ["readme · local"]
    assert not c.attachments.pending
    run(loop, until(lambda: "readme · local" in col.chat.widget_for(user.id).chips.text(), 5, "the message's chip"))
    col.grab().save("/tmp/tools2-resource-sent.png")
    conv = import_json(c.conversation.history, export_json(c.conversation.history, c.conversation.conv_id))
    c.conversation.open(conv.id)
    assert c.conversation.view_messages()[0]["documents"] == ["readme · local"]
    assert c.conversation.request_messages()[0]["content"] == sent  # a regenerated reply reads the same text


def test_only_unreadable_resources_hand_the_text_back_with_the_reason(loop, chats):  # noqa: F811
    c = chats
    back, notices = [], []
    c.handBack.connect(lambda text, editing: back.append(text))
    c.attachments.notice.connect(notices.append)
    c.attachments.add_resource(GONE, read)
    assert c.send("What does it say?")  # sent while it is still being read: the send waits for it
    run(loop, until(lambda: back, 10, "the text handed back"))
    assert back == ["What does it say?"] and "gone: MCP server 'other' is no longer connected" in notices[-1]
    assert c.conversation.path() == [] and c.attachments.pending
    c.attachments.remove("note://gone")
    assert not c.attachments.pending
