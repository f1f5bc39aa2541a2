"""Beam search in the chat: every beam the worker returns is a version of the reply (‹ ›),
the best on screen; the texts are the ones the command line's beam search gives."""
from __future__ import annotations

import json

import pytest

from core.engine.events import Beam, Done, Prefilled, Stats
from core.history.store import History
from gui.chat.conversation import ConversationModel
from gui.chat.message import MessageWidget
from gui.chat.reply import ReplyController
from gui.widgets.stats import format_stats
from tests.core.cli.helpers import run_cli
from tests.gui.chat.test_reply import Settings, chunk
from tests.gui.test_main_window import send
from tests.gui.ui_helpers import (ScriptedBridge, bridge, data_dir, loop, run, settings, snapshot, until,  # noqa: F401
                                  window)

BEAMS = [Beam([7, 8], "A cat", [-0.1, -0.2], -0.15, "eos", 2), Beam([7, 9], "A dog", [-0.1, -0.4], -0.25, "eos", 2),
         Beam([5, 6], "The end", [-0.3, -0.5], -0.4, "length")]


async def three_beams(request, stream):
    yield Prefilled(10, 0, 0.01)
    yield chunk("A cat")
    best = BEAMS[0]
    yield Done(0, best.stop_reason, best.tokens, best.text, best.logprobs, request.params.resolved(),
               Stats(prompt_tokens=10, generated_tokens=2), best.stop_token, beams=list(BEAMS))


@pytest.fixture
def conv(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    yield ConversationModel(history=h)
    h.close()


def reply_to(conv, loop, bridge, prompt: str, **params) -> list[dict]:
    r = ReplyController(bridge=bridge, conversation=conv, settings=Settings(**params))
    finished: list[dict] = []
    r.finished.connect(finished.append)

    async def go():
        assert r.send(prompt)
        await until(lambda: finished, 60, "the reply")
    run(loop, go())
    return finished


def versions(conv) -> list[tuple[str, tuple[int, int], str]]:
    """Walk the reply's versions with › from the first: (text, version, stats line) each."""
    reply = conv.path()[-1]
    while conv.switch_version(conv.path()[-1].id, -1) is not None:
        pass
    seen = []
    while True:
        view = conv.view_messages()[-1]
        seen.append((view["text"], view["version"], format_stats(view)))
        if conv.switch_version(view["id"], 1) is None:
            break
    conv.history.select(reply.id)
    return seen


def test_every_beam_is_a_version_of_the_reply_and_the_best_is_shown(qapp, loop, conv):
    finished = reply_to(conv, loop, ScriptedBridge(three_beams), "Tell me", num_beams=3)
    view = finished[0]
    assert view["text"] == "A cat" and view["version"] == (1, 3)  # the best, on screen, of three
    assert conv.path()[-1].id == view["id"]
    walked = versions(conv)
    assert [(t, v) for t, v, _ in walked] == [("A cat", (1, 3)), ("A dog", (2, 3)), ("The end", (3, 3))]
    assert "beam 2 of 3 (score -0.250)" in walked[1][2] and "seed" not in walked[1][2]
    others = [m for m in conv.history.siblings(view["id"]) if m.id != view["id"]]
    assert [m.stop_reason for m in others] == ["eos", "length"]
    assert all(m.settings["num_beams"] == 3 for m in others)
    assert conv.path()[-1].id == view["id"]  # walking the versions and back leaves the best on screen


def test_carrying_a_beam_reply_on_adds_one_version_not_more_beams(qapp, loop, conv):
    r = ReplyController(bridge=ScriptedBridge(three_beams), conversation=conv, settings=Settings(num_beams=3))
    finished: list[dict] = []
    r.finished.connect(finished.append)

    async def go():
        assert r.send("Tell me")
        await until(lambda: finished, 10, "the reply")
        assert r.continue_reply(finished[0]["id"])
        await until(lambda: len(finished) == 2, 10, "the continuation")
    run(loop, go())
    best = finished[0]["id"]
    texts = [m.text for m in conv.history.siblings(best)]
    # the continuation is the best beam carried on (in place or as a version of its own); the
    # continuation's own runners-up are not stored as more versions
    assert "A catA cat" in texts and texts.count("A dog") == texts.count("The end") == 1 and len(texts) <= 4


def test_regenerating_the_same_beams_adds_no_copies_and_says_so(qapp, loop, conv):
    """Beam search has no seed: Ctrl+R with the same settings gives the same beams. They are
    not stored again (the first set stays, its best on screen) and the reply says why; a
    wider search adds only the beams that are new."""
    wider = [*BEAMS, Beam([5, 9], "The dog", [-0.3, -0.6], -0.45, "length")]
    beams = {"now": BEAMS}

    async def script(request, stream):
        yield Prefilled(10, 0, 0.01)
        best = beams["now"][0]
        yield chunk(best.text)
        yield Done(0, best.stop_reason, best.tokens, best.text, best.logprobs, request.params.resolved(),
                   Stats(prompt_tokens=10, generated_tokens=2), best.stop_token, beams=list(beams["now"]))

    r = ReplyController(bridge=ScriptedBridge(script), conversation=conv, settings=Settings(num_beams=3))
    finished = []
    r.finished.connect(finished.append)

    async def go():
        assert r.send("Tell me")
        await until(lambda: finished, 10, "the reply")
        assert r.regenerate()
        await until(lambda: len(finished) == 2, 10, "the same beams again")
        beams["now"] = wider
        assert r.regenerate()
        await until(lambda: len(finished) == 3, 10, "a wider search")
    run(loop, go())
    first = finished[0]["id"]
    assert finished[1]["id"] == first and finished[1]["version"] == (1, 3) and conv.path()[-1].id == first
    assert "note" not in finished[0] and finished[1]["note"].startswith("The same 3 beams again")
    assert "no seed" in finished[1]["note"]  # said on the reply shown, not stored with it
    assert [m.text for m in conv.history.siblings(first)] == ["A cat", "A dog", "The end", "The dog"]
    assert finished[2]["id"] == first
    assert finished[2]["note"] == "3 of the 4 beams were versions already; only the 1 new one was added (‹ ›)."
    widget = MessageWidget(message=finished[1])
    assert widget.footer.text().startswith("The same 3 beams again") and "beam 1 of 3" in widget.footer.text()
    assert "note" not in conv.view_messages()[-1]


def test_the_window_shows_the_command_lines_beams_as_versions(qtbot, window, loop, fixtures, capsys):
    """Beams 3 in the panel, a chat reply through the real bridge and worker: ‹ › walks the
    beams `python -m core generate --chat --num-beams 3 --json` lists, best first."""
    model = fixtures / "stories260K.gguf"

    async def scenario():
        window.ask_model_path = lambda: model
        window.open_model_dialog()
        await until(lambda: window.info is not None, 30, "model load")
        window.panel.numBeamsSpin.setValue(3)
        view = await send(qtbot, window, "Once upon a time", max_tokens=10)
        assert view["version"] == (1, 3) and window.chat.widgets[-1].version_label.text() == "1/3"
        texts = [window.chat.widgets[-1].message["text"]]
        for k in (2, 3):
            window.chat.widgets[-1].next_button.click()
            await until(lambda: window.chat.widgets[-1].message["version"] == (k, 3), 5, f"beam {k}")
            texts.append(window.chat.widgets[-1].message["text"])
        window.chat.widgets[-1].prev_button.click()
        await until(lambda: window.chat.widgets[-1].message["version"] == (2, 3), 5, "back to beam 2")
        assert "beam 2 of 3" in format_stats(window.chat.widgets[-1].message)
        return texts

    texts = run(loop, scenario(), 90)
    snapshot(window, "chat_beam_versions")
    rc, out, err = run_cli(capsys, "generate", model, "--chat", "--prompt", "Once upon a time", "--num-beams", "3",
                           "--max-new-tokens", "10", "--json")
    assert rc == 0, err
    cli = [b["text"] for b in json.loads(out)["beams"]]
    assert texts == cli and len(set(cli)) == 3
