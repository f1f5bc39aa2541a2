"""ConversationController without a window: the rules of a chat against a scripted bridge.

The controller decides what the conversation becomes (send, regenerate, continue, branch,
retry, delete and undo, versions, drafts); these tests drive it with no widget at all."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from PySide6.QtCore import QObject, Signal

from core.engine.events import Done, Prefilled, Stats
from core.history.store import History
from core.worker.protocol import Error
from gui.chat.controller import INSPECT_TOP, ConversationController
from tests.gui.chat.test_reply import Settings, chunk, hello, until_stopped
from tests.gui.ui_helpers import ScriptedBridge, loop, run, until  # noqa: F401 (fixtures)


class Models(QObject):
    """What the controller reads of the model controller."""
    modelChanged = Signal(object)
    backendChanged = Signal(object)

    def __init__(self):
        super().__init__()
        self.info = None
        self.backend = None

    def set_model(self, info):
        self.info = info
        self.modelChanged.emit(info)

    def set_backend(self, remote):
        self.backend = remote
        self.backendChanged.emit(remote)


class AnyBackendBridge(ScriptedBridge):
    """Plays the script for the local model and for a server alike."""

    def generate(self, request, backend=None):
        return self._stream(request)


@pytest.fixture
def history(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    yield h
    h.close()


def make(history, script=hello, model=True):
    models = Models()
    bridge = AnyBackendBridge(script)
    c = ConversationController(bridge=bridge, history=history, models=models, settings=Settings())
    if model:
        models.set_model({"name": "tiny", "context_length": 512})
    seen = []
    for name in ("status", "error", "editRequested", "retryOffered", "undoOffered", "undoEnded"):
        getattr(c, name).connect(lambda *args, name=name: seen.append((name, *args)))
    return c, bridge, models, seen


async def finished(c):
    await until(lambda: not c.busy, 10, "the reply")


def texts(c):
    return [(m.role, m.text) for m in c.conversation.path()]


def test_nothing_is_sent_without_a_model(loop, history):
    c, bridge, models, _ = make(history, model=False)
    assert not c.send("hello") and bridge.requests == [] and c.conversation.conv_id is None
    models.set_model({"name": "tiny", "context_length": 512})
    assert c.send("hello")
    run(loop, finished(c))
    assert texts(c) == [("user", "hello"), ("assistant", "Hello world")]
    assert c.reply.model_id == "tiny" and c.reply.context_length == 512


def test_record_probs_decides_what_a_reply_records(loop, history):
    c, bridge, _, _ = make(history)
    c.send("one")
    run(loop, finished(c))
    c.record_probs = True
    assert c.regenerate()
    run(loop, finished(c))
    assert [r.inspect for r in bridge.requests] == [0, INSPECT_TOP]
    versions = c.conversation.view_messages()[-1]["version"]
    assert versions == (2, 2)  # a regenerated reply is a new version beside the old one


def test_a_server_cannot_continue_or_branch_and_says_why(loop, history):
    c, bridge, models, seen = make(history)
    c.send("hi")
    run(loop, finished(c))
    reply = c.last_reply()
    models.set_backend(SimpleNamespace(url="http://127.0.0.1:9/v1"))
    assert c.reply.backend is models.backend
    assert not c.continue_reply(reply.id) and not c.branch(reply.id, 0, 5)
    assert [s[0] for s in seen] == ["status", "status"] and not c.can_continue
    assert seen[0][1] == "Continue needs the local model" and "needs the local model" in seen[1][1]
    assert len(bridge.requests) == 1


def test_message_actions_wait_for_the_reply_on_screen(loop, history):
    c, bridge, _, seen = make(history, until_stopped)
    c.send("question")
    user = c.conversation.path()[0]
    assert c.busy
    for name in ("prev", "next", "edit", "delete"):
        c.message_action(name, user.id)
    assert seen == [] and len(c.conversation.path()) == 1  # nothing happened mid-reply
    c.stop()
    run(loop, finished(c))
    c.message_action("edit", user.id)
    assert seen == [("editRequested", user.id, "question")]


def test_delete_offers_undo_and_undo_restores_the_branch(loop, history, qtbot):
    c, _, _, seen = make(history)
    c.send("first")
    run(loop, finished(c))
    c.send("second")
    run(loop, finished(c))
    before = texts(c)
    c.message_action("delete", c.conversation.path()[1].id)  # the first reply and the turn below it
    assert texts(c) == [("user", "first")]
    assert seen[-1] == ("undoOffered", "Message and 2 below it deleted")
    c.undo_delete()
    assert texts(c) == before and ("undoEnded",) in seen and seen[-1] == ("status", "Message restored", 3000)
    c.undo_ms = 30
    c.delete_message(c.conversation.path()[-1].id)
    qtbot.waitUntil(lambda: seen[-1] == ("undoEnded",), timeout=3000)
    c.undo_delete()  # nothing offered any more: nothing comes back
    assert len(texts(c)) == 3


def test_each_chat_keeps_its_own_draft(loop, history):
    c, _, _, _ = make(history)
    c.send("chat a")
    run(loop, finished(c))
    a = c.conversation.conv_id
    assert c.open(None, draft="half a thought") == ""  # a new chat: an empty editor
    assert c.open(a, draft="") == "half a thought"  # back in chat a: its draft again
    assert c.open(a, draft="same chat") is None  # nothing switched: the editor stays
    assert c.open(None, draft="an edit", editing=True) == ""  # an edited message is no draft
    assert c.open(a) == ""


def test_a_failed_server_reply_offers_retry_as_a_new_version(loop, history):
    calls = []

    async def cut_then_fine(request, stream):
        calls.append(request)
        if len(calls) == 1:
            yield chunk("Par")
            yield Error(1, "the connection broke", kind="cut")
            return
        yield Prefilled(5, 0, 0.01)
        yield chunk("Whole")
        yield Done(0, "stop", [7], "Whole", [-0.5], request.params.resolved(), Stats(generated_tokens=1))

    c, _, models, seen = make(history, cut_then_fine)
    models.set_backend(SimpleNamespace(url="http://127.0.0.1:9/v1"))
    assert not c.can_retry
    c.send("ask")
    run(loop, finished(c))
    offered = [s for s in seen if s[0] == "retryOffered"]
    assert len(offered) == 1 and offered[0][2] == "cut" and c.can_retry
    assert c.retry()
    run(loop, finished(c))
    replies = c.conversation.history.children(c.conversation.path()[0].id)
    assert [m.text for m in replies] == ["Par", "Whole"]  # the cut reply stays as a version
