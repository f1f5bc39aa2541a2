"""Conversation integrity (issue 22): never show or store the wrong thing.

The conversation controller and the chat column (transcript + prompt, wired as in the
window) against a scripted bridge: each test plays the replies it needs."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from core.engine.constraint import Constraint
from core.engine.events import Done, Prefilled, Stats
from core.history.store import History
from core.worker.protocol import Error
from gui.chat.column import ChatColumn
from gui.chat.controller import ConversationController
from tests.gui.chat.test_controller import AnyBackendBridge, Models
from tests.gui.chat.test_reply import Settings, chunk, until_stopped
from tests.gui.ui_helpers import bridge, data_dir, load, loop, run, settings, snapshot, until, window  # noqa: F401
from tests.gui.ui_helpers import send as window_send

DEMO = Path(__file__).resolve().parents[3] / "assets" / "models" / "llamadesk-demo"
SCHEMA = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'


def replies(*plays):
    """A script that answers each request with the next play: a text (a reply that stops
    on length), an Exception (the worker's refusal before any text) or a script."""
    calls = []

    async def script(request, stream):
        play = plays[min(len(calls), len(plays) - 1)]
        calls.append(request)
        if isinstance(play, Exception):
            yield Error(1, str(play))
            return
        if callable(play):
            async for ev in play(request, stream):
                yield ev
            return
        yield Prefilled(20, 0, 0.01)
        yield chunk(play)
        yield Done(0, "length", [7, 7], play, [-0.5, -0.5], request.params.resolved(),
                   Stats(prompt_tokens=20, generated_tokens=2))
    return script


@pytest.fixture
def history(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    yield h
    h.close()


def chat(qtbot, history, script, **params):
    """A controller on ``script`` and the chat column showing it (a model loaded)."""
    models = Models()
    bridge = AnyBackendBridge(script)
    settings = Settings(**params)
    c = ConversationController(bridge=bridge, history=history, models=models, settings=settings)
    column = ChatColumn()
    qtbot.addWidget(column)
    column.attach(c)
    column.chat.set_can_generate(True)
    column.prompt.set_model_ready(True)
    models.set_model({"name": "tiny", "context_length": 512, "vocab_size": 512})
    column.resize(720, 640)
    column.show()
    errors = []
    c.error.connect(lambda *a: errors.append(a))
    c.reply.failed.connect(lambda *a: errors.append(a))
    return SimpleNamespace(c=c, col=column, bridge=bridge, models=models, settings=settings, errors=errors)


def send(loop, t, text):
    """Type ``text`` and press Send, as the window does; wait for the reply to end."""
    t.col.prompt.set_text(text)
    assert t.col.prompt.can_send(), t.col.prompt.hint.text()
    if t.c.send(t.col.prompt.text()):
        t.col.prompt.clear()
    run(loop, until(lambda: not t.c.busy, 10, "the reply"))


def offered(w):
    """Whether the message widget ``w`` shows its » (Continue) button."""
    return w.buttons["continue"].isVisibleTo(w)


def finish(loop, t):
    run(loop, until(lambda: not t.c.busy, 10, "the reply"))


def shown(t):
    """The transcript as shown: (role, text, version) per message widget."""
    return [(w.message["role"], w.message["text"], tuple(w.message.get("version") or ())) for w in t.col.chat.widgets]


# ---- 1. Continue on an earlier reply

def test_continue_on_an_earlier_reply_is_a_new_version_of_it_in_place(qtbot, loop, history):
    t = chat(qtbot, history, replies("Once", "Twice", " more"))
    send(loop, t, "first")
    send(loop, t, "second")
    first, second = t.c.conversation.path()[1], t.c.conversation.path()[3]
    w = t.col.chat.widget_for(first.id)
    assert offered(w)  # it stopped on length: » is offered
    w.buttons["continue"].click()
    assert t.c.busy and t.bridge.requests[-1].continue_reply == "Once"
    assert [m["content"] for m in t.bridge.requests[-1].messages] == ["first"]  # only what came before it
    # Streamed where the first reply stands (its branch ends there), not below the second turn.
    assert [(r, x) for r, x, _ in shown(t)] == [("user", "first"), ("assistant", "Once")]
    assert t.col.chat.widgets[-1] is t.col.chat._stream
    finish(loop, t)
    new = t.c.conversation.path()[-1]
    assert shown(t) == [("user", "first", (1, 1)), ("assistant", "Once more", (2, 2))]
    assert new.parent_id == first.parent_id and new.id != first.id
    assert new.stats["generated_tokens"] == 4  # one reply in two runs
    # The stored first reply is untouched, and ‹ brings it back with the turn below it.
    assert history.message(first.id).text == "Once" and history.message(second.id).text == "Twice"
    t.col.chat.widget_for(new.id).prev_button.click()
    assert [(r, x) for r, x, _ in shown(t)] == [("user", "first"), ("assistant", "Once"), ("user", "second"),
                                                 ("assistant", "Twice")]
    assert shown(t)[1][2] == (1, 2) and t.errors == []
    t.col.chat.widget_for(first.id).next_button.click()
    QApplication.processEvents()  # the new transcript's widgets show (not inside a coroutine)
    snapshot(t.col, "issue22_continue_earlier_reply")


def test_continue_on_the_last_reply_extends_it(qtbot, loop, history):
    t = chat(qtbot, history, replies("Once", " more"))
    send(loop, t, "first")
    reply = t.c.conversation.path()[-1]
    assert t.c.continue_reply(reply.id)
    finish(loop, t)
    assert shown(t) == [("user", "first", (1, 1)), ("assistant", "Once more", (1, 1))]
    assert len(t.col.chat.widgets) == 2


# ---- 2. A failed regenerate never hides the versions

def test_a_failed_regenerate_keeps_every_version_in_view(qtbot, loop, history):
    bad = Exception("the draft model x.gguf has another vocabulary than the model it would draft for")
    t = chat(qtbot, history, replies("Good", "Better", bad, "Other"))
    send(loop, t, "ask")
    assert t.c.regenerate()
    finish(loop, t)
    assert shown(t)[-1] == ("assistant", "Better", (2, 2))
    assert t.c.regenerate()
    finish(loop, t)
    # The failed attempt left the versions as they were: on screen, arrows and all.
    assert shown(t) == [("user", "ask", (1, 1)), ("assistant", "Better", (2, 2))]
    assert t.col.chat.widgets[-1].prev_button.isVisible() and not t.col.chat.streaming
    assert t.errors == []  # no dialog: the reason is said once, inline
    assert "another vocabulary" in t.col.prompt.hint.text() and not t.col.prompt.send_button.isEnabled()
    conv = t.c.conversation.conv_id
    t.c.open(None)  # another chat, and back: the versions are still there
    t.c.open(conv)
    assert [(r, x) for r, x, _ in shown(t)] == [("user", "ask"), ("assistant", "Better")]
    assert len(history.children(t.c.conversation.path()[0].id)) == 2


# ---- 3. Errors once; a refused message is not stored

def test_a_refused_message_is_not_stored_and_comes_back_to_the_editor(qtbot, loop, history):
    too_long = Exception("the last message is 900 tokens, but only 500 fit in the prompt: "
                         "shorten the message or lower max tokens")
    t = chat(qtbot, history, replies("Fine", too_long, "Short"))
    send(loop, t, "hello")
    before = [(m.role, m.text) for m in t.c.conversation.path()]
    send(loop, t, "a very long message")
    assert [(m.role, m.text) for m in t.c.conversation.path()] == before  # nothing of it stored
    assert [(r, x) for r, x, _ in shown(t)] == before
    assert t.col.prompt.text() == "a very long message"  # the text is back, not lost
    assert not t.col.prompt.send_button.isEnabled() and "900 tokens" in t.col.prompt.hint.text()
    assert t.errors == [] and not t.c.send("a very long message")  # said once, in place
    assert len(t.bridge.requests) == 2
    t.col.prompt.set_text("short")  # the cause is fixed: Send again
    assert t.col.prompt.send_button.isEnabled()
    send(loop, t, "short")
    assert [m.text for m in t.c.conversation.path()] == ["hello", "Fine", "short", "Short"]


def test_a_refused_first_message_leaves_no_chat_behind(qtbot, loop, history):
    t = chat(qtbot, history, replies(Exception("no draft model")))
    send(loop, t, "hi")
    assert t.c.conversation.conv_id is None and history.conversations() == []
    assert t.col.prompt.text() == "hi" and t.col.chat.widgets == []


def test_what_can_be_checked_before_sending_disables_send(qtbot, loop, history, tmp_path, fixtures):
    t = chat(qtbot, history, replies("ok"))
    t.settings.p = replace(t.settings.p, constraint=Constraint("json_schema", "{nope"))
    t.c.clear_refusal()  # the panel's changed()
    t.col.prompt.set_text("hi")
    assert "Output format" in t.col.prompt.hint.text() and not t.col.prompt.can_send()
    assert not t.c.send("hi") and t.bridge.requests == [] and history.conversations() == []
    t.settings.p = replace(t.settings.p, constraint=None, draft=str(tmp_path / "gone.gguf"))
    t.c.clear_refusal()
    assert "Draft model not found" in t.col.prompt.hint.text() and not t.col.prompt.can_send()
    (tmp_path / "notes.gguf").write_text("not a model")
    t.settings.p = replace(t.settings.p, draft=str(tmp_path / "notes.gguf"))
    t.c.clear_refusal()
    assert "Draft model cannot be used" in t.col.prompt.hint.text() and not t.col.prompt.can_send()
    # Another vocabulary, from the header alone: the demo model's 2,048 tokens, the model's 512.
    t.settings.p = replace(t.settings.p, draft=str(DEMO))
    t.c.clear_refusal()
    assert "2,048-token vocabulary, the model 512" in t.col.prompt.hint.text() and not t.col.prompt.can_send()
    assert not t.c.send("hi") and t.bridge.requests == [] and history.conversations() == []
    t.settings.p = replace(t.settings.p, draft=str(fixtures / "stories260K.gguf"))  # the same tokenizer
    t.c.clear_refusal()
    assert t.col.prompt.can_send()
    t.settings.p = replace(t.settings.p, draft="")
    t.c.clear_refusal()
    assert t.col.prompt.can_send() and t.errors == []


def test_a_failure_after_text_is_said_on_the_reply_only(qtbot, loop, history):
    async def breaks(request, stream):
        yield chunk("Half")
        yield Error(1, "out of memory while generating")

    t = chat(qtbot, history, replies(breaks))
    send(loop, t, "go")
    w = t.col.chat.widgets[-1]
    assert w.message["text"] == "Half" and "out of memory" in w.footer.text()
    assert t.errors == [] and t.col.prompt.problem == ""


# ---- 5. Continue after Stop; not offered for a server's reply

def test_continue_after_stop(qtbot, loop, history):
    t = chat(qtbot, history, replies(until_stopped, " and more"))
    t.col.prompt.set_text("tell")
    t.c.send("tell")

    async def stop_once_streaming():  # Stop inside the running loop: stopped outside it, the
        await until(lambda: t.col.chat.stream_text, 5, "text")  # Qt events it sends could wake
        t.c.stop()  # the script's sleep with no loop running ("no running event loop")
    run(loop, stop_once_streaming())
    finish(loop, t)
    w = t.col.chat.widgets[-1]
    assert w.message["stop_reason"] == "cancelled" and offered(w), (w.message, t.errors)
    w.buttons["continue"].click()
    finish(loop, t)
    assert t.bridge.requests[-1].continue_reply == "Part" and shown(t)[-1][1] == "Part and more"


def test_a_servers_reply_is_not_offered_continue(qtbot, loop, history):
    t = chat(qtbot, history, replies("Once"))
    send(loop, t, "hi")
    w = t.col.chat.widgets[-1]
    assert offered(w)
    seen = []
    t.c.status.connect(lambda text, ms: seen.append(text))
    t.models.set_backend(SimpleNamespace(url="http://127.0.0.1:9/v1"))
    assert not t.c.can_continue and not offered(w)
    t.col.show_transcript()  # a transcript shown anew offers it no more either
    assert not offered(t.col.chat.widgets[-1])
    assert not t.c.continue_reply() and len(t.bridge.requests) == 1
    # Asked anyway (a shortcut): a few words, which fit a status bar at 800 px.
    assert seen and t.col.fontMetrics().horizontalAdvance(seen[-1]) < 400
    t.models.set_backend(None)
    assert offered(t.col.chat.widgets[-1])


# ---- 6. A JSON reply cut by the token limit says so, and offers Continue

def test_a_json_reply_cut_at_the_token_limit_says_incomplete(qtbot, loop, history):
    t = chat(qtbot, history, replies('{"name": "Ma'), constraint=Constraint("json_schema", SCHEMA))
    send(loop, t, "name?")
    m = t.c.conversation.path()[-1]
    assert m.meta["incomplete"] == "incomplete: stopped at the token limit"
    w = t.col.chat.widgets[-1]
    assert "incomplete: stopped at the token limit" in w.footer.text()
    assert offered(w)
    snapshot(t.col, "issue22_json_incomplete")


def test_a_failed_continue_leaves_the_reply_as_it_was(qtbot, loop, history):
    t = chat(qtbot, history, replies("Once", Exception("the reply to continue does not match the JSON schema")))
    send(loop, t, "go")
    before = t.c.conversation.path()[-1]
    assert t.c.continue_reply(before.id)
    finish(loop, t)
    after = history.message(before.id)
    assert (after.text, after.stop_reason, after.meta.get("error")) == ("Once", "length", None)
    assert shown(t)[-1] == ("assistant", "Once", (1, 1)) and not t.col.chat.streaming
    assert "does not match" in t.col.prompt.hint.text() and t.errors == []


def test_continue_completes_a_cut_json_reply_on_the_real_worker(qtbot, loop, history, fixtures):
    """Through the bridge and worker on the fixture model: the continued reply is one
    valid object, and its "incomplete" note is gone."""
    import json

    from gui.bridge import Bridge
    bridge = Bridge(torch_threads=1)
    models = Models()
    person = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
    settings = Settings(max_new_tokens=4, temperature=1.0, seed=3,
                        constraint=Constraint("json_schema", json.dumps(person)))
    c = ConversationController(bridge=bridge, history=history, models=models, settings=settings)

    async def go():
        models.set_model(await bridge.load(fixtures / "stories260K.gguf"))
        assert c.send("Once upon a time")
        await until(lambda: not c.busy, 30, "the cut reply")
        cut = c.conversation.path()[-1]
        assert cut.stop_reason == "length" and cut.meta.get("incomplete")
        settings.p = replace(settings.p, max_new_tokens=40)
        assert c.continue_reply(cut.id)
        await until(lambda: not c.busy, 30, "the continued reply")
        await bridge.shutdown()
        return cut
    cut = run(loop, go())
    whole = c.conversation.path()[-1]
    assert whole.id == cut.id and whole.text.startswith(cut.text) and whole.stop_reason == "eos"
    assert set(json.loads(whole.text)) == {"name", "age"} and "incomplete" not in whole.meta


def test_the_window_disables_send_with_the_reason_inline(qtbot, window, loop, fixtures):
    """In the window: an output format that cannot compile, typed in the real panel,
    disables Send with the reason under the prompt; no dialog, nothing stored."""
    run(loop, load(window, str(fixtures / "stories260K.gguf")))
    window.resize(800, 600)
    panel = window.panel
    panel.constraintCombo.setCurrentIndex(panel.constraintCombo.findData("json_schema"))
    panel.constraintText.setPlainText('{"type": "objectx"}')
    qtbot.keyClicks(window.prompt.editor, "hello")
    assert not window.prompt.send_button.isEnabled() and "Output format" in window.prompt.hint.text()
    qtbot.keyClick(window.prompt.editor, Qt.Key_Return, Qt.ControlModifier)
    assert not window.busy and window.dialogs == [] and window.history.conversations() == []
    QApplication.processEvents()
    snapshot(window, "issue22_send_disabled_800")
    panel.constraintCombo.setCurrentIndex(panel.constraintCombo.findData(""))
    assert window.prompt.send_button.isEnabled()
    # A message longer than the context: counted by the worker once typing pauses.
    window.prompt.set_text("Once upon a time there was a dog. " * 400)
    run(loop, until(lambda: "fit in the prompt" in window.prompt.hint.text(), 20, "the count"))
    assert not window.prompt.send_button.isEnabled() and window.history.conversations() == []
    window.prompt.set_text("Once upon a time")
    run(loop, until(lambda: window.prompt.send_button.isEnabled(), 5, "Send again"))


def test_the_window_offers_continue_only_for_local_replies(window, loop, fixtures):
    """Chat → Continue Reply is off while replies come from a server, on again after."""
    run(loop, load(window, str(fixtures / "stories260K.gguf")))
    assert window.action("continue").isEnabled()
    window.use_remote(SimpleNamespace(url="http://127.0.0.1:9/v1", caps=None, model="served", card=None))
    assert not window.action("continue").isEnabled() and window.action("regen").isEnabled()
    window.use_local()
    assert window.action("continue").isEnabled()


def test_the_window_keeps_the_reply_when_the_draft_model_cannot_draft(qtbot, window, loop, fixtures):
    """The issue's steps: a reply, then Speculative → Draft model with a model of another
    vocabulary, Ctrl+R: nothing is sent, the reply stays on screen, the reason is inline."""
    run(loop, load(window, str(fixtures / "stories260K.gguf")))
    run(loop, window_send(qtbot, window, "Once upon a time", max_tokens=4))
    before = [(w.message["role"], w.message["text"]) for w in window.chat.widgets]
    window.panel.speculative.apply({"speculative": "draft", "draft_path": str(DEMO)})
    window.panel.speculative.changed.emit()
    assert "2,048-token vocabulary" in window.prompt.hint.text()
    window.action("regen").trigger()
    assert not window.busy and window.dialogs == []
    assert [(w.message["role"], w.message["text"]) for w in window.chat.widgets] == before
    assert len(window.history.children(window.conversation.path()[0].id)) == 1


def test_a_reply_the_store_cannot_save_keeps_its_text_and_says_why_on_it(qtbot, loop, history, monkeypatch):
    from core.history.records import HistoryError

    t = chat(qtbot, history, replies("Kept text"))
    assert t.c.send("go")

    def full(*a, **k):
        raise HistoryError("history database error: database or disk is full")
    monkeypatch.setattr(history, "add_message", full)
    finish(loop, t)
    w = t.col.chat.widgets[-1]
    assert not t.col.chat.streaming and w.message["text"] == "Kept text"
    assert "could not be saved" in w.footer.text() and "disk is full" in w.footer.text() and t.errors == []
