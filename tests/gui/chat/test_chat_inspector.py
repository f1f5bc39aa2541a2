"""The token inspector for chat replies, end to end: the real bridge and worker on the
stories260K fixture, the main window, and the history store across a restart.

The asynchronous parts (loading, waiting for a reply) run as coroutines on the qasync loop
with asyncio sleeps; clicks, hovers and screenshots happen in the test body, never inside
a coroutine (a nested event loop there hangs qasync).
"""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QToolButton

from core.checkpoints import load as load_checkpoint
from core.engine.events import Token
from core.engine.settings import SamplingParams
from gui.chat.chat_view import ChatView
from gui.chat.reply import ReplyState, token_record
from gui.widgets.token_inspector import TokenInspector, fmt_prob
from gui.widgets.token_run import LaneRun
from tests.gui.ui_helpers import (anchor_point, bridge, close, data_dir, load, loop, make_window,  # noqa: F401
                                  reference_probs, run, send, settings, snapshot, until)

PROMPT = "Tell me a story about a cat"
# Every filter on, so the "after filters" column is a real test of all of them.
SETTINGS = dict(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.1, seed=7,
                max_new_tokens=40)


@pytest.fixture(scope="module")
def story(fixtures):
    """The fixture model loaded directly, for the reference logits."""
    return load_checkpoint(fixtures / "stories260K.gguf", device="cpu", dtype="float32")


@pytest.fixture
def gguf(fixtures):
    return str(fixtures / "stories260K.gguf")


def record_requests(w) -> list:
    """Wrap the window's bridge so the test sees every GenerateRequest it sends."""
    seen = []
    real = w.bridge.generate

    def generate(request):
        seen.append(request)
        return real(request)

    w.bridge.generate = generate
    return seen


def check_against_model(chat, story, msg_id, index, prompt_ids, ids, settings):
    """The inspector's shown rows equal a direct softmax of the model's logits, raw and
    under the reply's filters."""
    insp = chat.inspector
    assert insp.current == (msg_id, index)
    w = chat.widget_for(msg_id)
    rec = w.token(index)
    raw, filt = reference_probs(story, prompt_ids, ids, index, settings)
    assert abs(float(raw[rec.token_id].log()) - rec.logprob) < 1e-4
    rows = insp.rows
    assert rows and any(r["chosen"] for r in rows)
    assert [r["id"] for r in rows][:5] == torch.topk(raw, 5).indices.tolist()
    for row, shown in zip(rows, insp.shown_values()):
        if row["raw"] is None:  # a filtered favourite outside the raw top list
            assert float(raw[row["id"]]) <= min(p for _, p in rec.top["raw"]) + 1e-4
        else:
            assert abs(row["raw"] - float(raw[row["id"]])) < 1e-4
        ref_f = float(filt[row["id"]])
        if row["filtered"] is None:
            # Not among the top filtered alternatives recorded (and the list is full, so it
            # may or may not have been cut): then it is no likelier than the last of them.
            assert ref_f <= min(p for _, p in rec.top["filtered"]) + 1e-4, (row, ref_f)
            assert shown[2] == "–"
        else:
            assert abs(row["filtered"] - ref_f) < 1e-4, (row, ref_f)
        assert shown[1] == fmt_prob(row["raw"]) and shown[2] == fmt_prob(row["filtered"])
    # the filtered alternatives recorded are exactly the top of the filtered distribution
    top_f = torch.topk(filt, len(rec.top["filtered"]))
    for (i, p), ref_i, ref_p in zip(rec.top["filtered"], top_f.indices.tolist(), top_f.values.tolist()):
        assert abs(p - ref_p) < 1e-4 and (i == ref_i or abs(float(filt[i]) - ref_p) < 1e-6)
    # the reply's settings are named with the token
    label = insp.summary.text()
    for part in ("T 0.9", "top-p 0.9", "top-k 20", "min-p 0.05", "rep 1.1", "seed 7"):
        assert part in label, (part, label)
    assert f"log p = {rec.logprob:.3f}" in label
    return rows


def test_chat_token_inspector(qtbot, loop, bridge, settings, data_dir, story, gguf):
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    requests = record_requests(w)
    assert w.action("record_probs").objectName() == "recordProbsAction"
    assert not w.action("record_probs").isChecked()  # on demand: records are large
    w.action("record_probs").setChecked(True)
    w.panel.set_params(SamplingParams(**SETTINGS))
    w.panel.set_system_prompt("")

    async def reply(text):
        if w.info is None:
            await load(w, gguf)
        return await send(qtbot, w, text, max_tokens=SETTINGS["max_new_tokens"])

    view = run(loop, reply(PROMPT))
    req = requests[-1]
    assert req.inspect == 5
    msg = w.history.message(view["id"])
    record = msg.meta["tokens"]
    ids = record["tokens"]
    assert len(ids) == view["stats"]["generated_tokens"] == len(record["top"]) == len(record["logprobs"])
    assert all(t and t["raw"] and t["filtered"] for t in record["top"])
    prompt_ids = story.chat_format.encode_dialog(req.messages)
    assert len(prompt_ids) == view["stats"]["prompt_tokens"]
    used = view["settings"]
    assert used["seed"] == 7 and used["top_k"] == 20

    # the reply's toggle switches its body to tokens; the inspector appears beside it
    mw = w.chat.widgets[-1]
    button = mw.findChild(QToolButton, "inspectTokensButton")
    assert button is not None and button.isVisible() and button.accessibleName()
    assert not w.chat.widgets[0].inspect_button.isVisible()  # the user's message has none
    assert not w.inspector.isVisible()
    qtbot.mouseClick(button, Qt.LeftButton)
    assert mw.token_mode and w.inspector.isVisible()
    assert "tok:0" in mw.body.toHtml() and "tok:3" in mw.body.toHtml()
    assert mw.body.toPlainText().strip() == view["text"].strip()  # the same reply, as tokens

    # a real click on a token pins it; the shown numbers are the model's
    index = min(5, len(ids) - 1)
    qtbot.mouseClick(mw.body.viewport(), Qt.LeftButton, pos=anchor_point(mw.body, f"tok:{index}"))
    assert w.chat.pinned == (view["id"], index)
    rows = check_against_model(w.chat, story, view["id"], index, prompt_ids, ids, used)
    # hovering peeks at another token; leaving the tokens goes back to the pinned one
    mw.body.highlighted.emit(QUrl("tok:2"))
    check_against_model(w.chat, story, view["id"], 2, prompt_ids, ids, used)
    mw.body.highlighted.emit(QUrl(""))
    assert w.inspector.current == (view["id"], index) and w.chat.pinned == (view["id"], index)

    # the heatmap shades tokens; the screenshot shows tokens + heatmap + inspector
    mw.heatmap_check.setChecked(True)
    assert "background-color" in mw.body.toHtml()
    w.chat.inspect_token(view["id"], index)
    # the whole token body shows: the message grew to hold it (layouts settle over a few passes)
    qtbot.waitUntil(lambda: mw.body.geometry().bottom() < mw.footer.geometry().top()
                    and mw.body.height() >= mw.body.document().size().height(), timeout=3000)
    snapshot(w, "chat_inspector")

    # toggling back restores the Markdown body and hides the inspector
    qtbot.mouseClick(button, Qt.LeftButton)
    assert not mw.token_mode and not w.inspector.isVisible()
    assert "tok:" not in mw.body.toHtml()
    assert mw.body.toPlainText().split() == view["text"].split()  # Markdown folds single newlines
    close(loop, w)

    # restart: a new window on the same store; the stored reply is still inspectable
    w2 = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w2)
    w2.open_conversation(msg.conversation_id)
    mw2 = w2.chat.widget_for(view["id"])
    assert mw2 is not None and not mw2.inspect_button.isHidden()  # (shown once events run)
    assert w2.chat.show_tokens(view["id"])
    assert w2.inspector.isVisible()
    qtbot.mouseClick(mw2.body.viewport(), Qt.LeftButton, pos=anchor_point(mw2.body, f"tok:{index}"))
    rows2 = check_against_model(w2.chat, story, view["id"], index, prompt_ids, ids, used)
    assert [(r["id"], r["chosen"]) for r in rows2] == [(r["id"], r["chosen"]) for r in rows]
    assert w2.inspector.shown_values() and w2.inspector.title.text().startswith("Reply · token")

    # the token view survives a re-render of the transcript (a new message sent, a refresh)
    w2.refresh_transcript()
    assert w2.chat.widget_for(view["id"]).token_mode and w2.chat.pinned == (view["id"], index)

    # recording off: the next reply asks for no alternatives and has no token view
    requests2 = record_requests(w2)
    w2.action("record_probs").setChecked(False)
    assert settings.value("chat/record_probs", type=bool) is False
    w = w2

    view2 = run(loop, reply("Once upon a time"))
    assert requests2[-1].inspect == 0
    assert "tokens" not in (w2.history.message(view2["id"]).meta or {})
    last = w2.chat.widget_for(view2["id"])
    assert last is not None and last.inspect_button.isHidden()
    assert not w2.chat.show_tokens(view2["id"])
    close(loop, w2)


def test_token_view_without_model(qtbot):
    """The message widget alone: a stored record renders tokens, a damaged one is ignored,
    a continued reply's unrecorded prefix stays plain text."""
    top = {"raw": [[5, 0.6], [9, 0.3]], "filtered": [[5, 0.7], [9, 0.3]], "pieces": {"5": " Hi", "9": " Yo"}}
    rec = {"tokens": [5, 9], "token_texts": [" Hi", " Yo"], "pieces": [" Hi", " Yo"],
           "logprobs": [-0.5108, -1.2040], "top": [top, top], "offset": 6}
    insp = TokenInspector()
    chat = ChatView(inspector=insp)
    qtbot.addWidget(chat)
    chat.set_messages([
        {"id": 1, "role": "user", "text": "hello"},
        {"id": 2, "role": "assistant", "text": "Start: Hi Yo", "tokens": rec, "settings": {"temperature": 0.7}},
        {"id": 3, "role": "assistant", "text": "x", "tokens": {"tokens": [1], "top": "bad", "logprobs": [None]}},
    ])
    chat.show()
    changes = []
    chat.tokenViewChanged.connect(changes.append)
    assert chat.show_tokens(2) and changes == [True]
    w = chat.widget_for(2)
    assert w.body.toPlainText() == "Start: Hi Yo"
    assert 'href="tok:0"' in w.body.toHtml() and 'href="tok:1"' in w.body.toHtml()
    assert not chat.show_tokens(3) and not chat.widget_for(3).inspect_button.isVisible()
    assert chat.inspect_token(2, 1)
    assert insp.current == (2, 1) and insp.shown_values()[1][2] == "30.00%"
    assert not chat.inspect_token(2, 7)
    chat.show_tokens(2, False)
    assert changes == [True, False] and insp.current is None and chat.pinned is None


def test_continued_reply_record():
    """Continuing a reply extends its token record when the record covers the text so far;
    otherwise the new record starts after it (``offset``)."""

    top = {"raw": [(4, 0.5)], "filtered": [(4, 1.0)], "pieces": {4: "!"}}
    run = LaneRun()
    run.add([Token(0, 0, 4, "!", "!", -0.6931, top)])
    prev = {"tokens": [1, 2], "token_texts": ["Hi", " there"], "logprobs": [-0.1, -0.2], "top": [None, None]}
    reply = ReplyState(parent_id=1, settings={}, inspect=5, prefix="Hi there", run=run,
                       continue_of=SimpleNamespace(meta={"tokens": prev}))
    rec = token_record(reply)
    assert rec["tokens"] == [1, 2, 4] and rec["token_texts"] == ["Hi", " there", "!"]
    assert rec["pieces"] == ["Hi", " there", "!"] and rec["logprobs"] == [-0.1, -0.2, -0.6931]
    assert rec["top"][2] == {"raw": [[4, 0.5]], "filtered": [[4, 1.0]], "pieces": {"4": "!"}}
    assert "offset" not in rec
    rec = token_record(replace(reply, prefix="Hello there"))  # the record does not cover it
    assert rec["tokens"] == [4] and rec["offset"] == len("Hello there")
    assert token_record(replace(reply, run=None)) is None  # recording was off


def greedy_reference(model, ids, n):
    """Greedy by full forward passes, no cache."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([out]))[0, -1].argmax()))
    return out[len(ids):]


def recorded_reply(qtbot, loop, bridge, settings, data_dir, gguf, params: SamplingParams):
    """A main window on the fixture model, with token records on, and its first reply to
    PROMPT under ``params``: (window, the requests it sent, its finished replies, the reply)."""
    w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
    qtbot.addWidget(w)
    requests = record_requests(w)
    w.action("record_probs").setChecked(True)
    w.panel.set_params(params)
    w.panel.set_system_prompt("")
    done = []
    w.replyFinished.connect(done.append)

    async def first():
        await load(w, gguf)
        return await send(qtbot, w, PROMPT, max_tokens=params.max_new_tokens)

    return w, requests, done, run(loop, first())


def test_branch_from_a_token_and_ban_it(qtbot, loop, bridge, settings, data_dir, story, gguf):
    """Click an alternative in the inspector and "Continue with": a new version of the
    reply that keeps the tokens before it (from the KV cache: one prompt position run),
    has the alternative at that position and continues as the model would; "Ban and
    retry" on it gives a third version that never uses that token again."""
    w, requests, done, view = recorded_reply(qtbot, loop, bridge, settings, data_dir, gguf,
                                             SamplingParams(temperature=0, max_new_tokens=24))
    old = w.history.message(view["id"])
    ids = old.meta["tokens"]["tokens"]
    prompt_ids = story.chat_format.encode_dialog(requests[-1].messages)
    i = 3
    assert w.chat.show_tokens(view["id"]) and w.chat.inspect_token(view["id"], i)
    insp = w.inspector
    assert insp.actions.isVisible() and not insp.branch_button.isEnabled()  # nothing chosen yet
    alt = next(r["id"] for r in insp.rows if not r["chosen"])
    assert insp.select_row(alt) and insp.branch_button.isEnabled()
    assert insp.branch_button.text().startswith("Continue with “")
    insp.select_row(ids[i])  # the chosen token itself: no branch to it, but it can be banned
    assert not insp.branch_button.isEnabled() and insp.ban_button.isEnabled()
    insp.select_row(alt)
    snapshot(w, "chat_inspector_branch")

    done.clear()
    qtbot.mouseClick(insp.branch_button, Qt.LeftButton)
    branched = run(loop, until(lambda: done, 30, "the branch"))[0]
    req = requests[-1]
    assert req.reply_prefix == ids[:i] and req.forced == [alt]
    new = w.history.message(branched["id"])
    toks = new.meta["tokens"]["tokens"]
    assert new.parent_id == old.parent_id and branched["version"] == (2, 2)
    assert toks[:i] == ids[:i] and toks[i] == alt  # the forced token at the chosen position
    assert toks[i + 1:] == greedy_reference(story.model, prompt_ids + ids[:i] + [alt], len(toks) - i - 1)
    # the prefix came from the KV cache: of prompt + 3 kept tokens, only the last was run
    stats = new.stats
    assert stats["prompt_tokens"] == len(prompt_ids) + i and stats["cached_tokens"] == stats["prompt_tokens"] - 1
    footer = w.chat.widget_for(branched["id"]).footer.text()
    assert f"{stats['cached_tokens']}/{stats['prompt_tokens']} prompt tokens cached" in footer
    kept_text = "".join(old.meta["tokens"]["token_texts"][:i])
    assert new.text.startswith(kept_text) and old.text.startswith(kept_text) and new.text != old.text
    assert len(new.meta["tokens"]["top"]) == len(toks)  # the new version is inspectable all along
    assert w.history.message(old.id).text == old.text  # the old version stays

    # "Ban and retry" on the forced token: a third version without it
    assert w.chat.show_tokens(branched["id"]) and w.chat.inspect_token(branched["id"], i)
    insp.select_row(alt)
    done.clear()
    qtbot.mouseClick(insp.ban_button, Qt.LeftButton)
    banned = run(loop, until(lambda: done, 30, "the banned retry"))[0]
    third = w.history.message(banned["id"])
    t3 = third.meta["tokens"]["tokens"]
    assert banned["version"] == (3, 3) and requests[-1].forced == [] and requests[-1].reply_prefix == ids[:i]
    assert t3[:i] == ids[:i] and alt not in t3[i:]
    assert third.settings["logit_bias"] == {str(alt): "-inf"}
    biased = story.model(torch.tensor([prompt_ids + ids[:i]]))[0, -1].detach().clone()
    biased[alt] = float("-inf")
    assert t3[i] == int(biased.argmax())  # greedy under the ban: the best other token
    close(loop, w)


@pytest.mark.parametrize("spec", ["lookup", "draft"])
def test_branch_from_a_token_of_a_reply_that_drafts(qtbot, loop, bridge, settings, data_dir, story, gguf,
                                                     random_draft, spec):
    """A reply decoded speculatively (prompt lookup, or a draft model of the same tokenizer)
    offers "Continue with" like any other: the new version keeps the tokens before the
    chosen position, has the alternative there, continues as plain greedy decoding would
    (speculative decoding is exact), and still drafts with the same setting."""
    drafting = {"lookup": 2} if spec == "lookup" else {"draft": str(random_draft)}
    w, requests, done, view = recorded_reply(qtbot, loop, bridge, settings, data_dir, gguf,
                                             SamplingParams(temperature=0, max_new_tokens=24, **drafting))
    assert w.panel.speculativeCombo.currentData() == spec
    old = w.history.message(view["id"])
    assert old.stats["speculative"]["kind"] == spec
    ids = old.meta["tokens"]["tokens"]
    prompt_ids = story.chat_format.encode_dialog(requests[-1].messages)
    i = 3
    assert w.chat.show_tokens(view["id"]) and w.chat.inspect_token(view["id"], i)
    insp = w.inspector
    alt = next(r["id"] for r in insp.rows if not r["chosen"])
    assert insp.select_row(alt) and insp.branch_button.isEnabled()

    done.clear()
    qtbot.mouseClick(insp.branch_button, Qt.LeftButton)
    branched = run(loop, until(lambda: done, 30, "the branch"))[0]
    req = requests[-1]
    assert req.reply_prefix == ids[:i] and req.forced == [alt]
    assert {k: getattr(req.params, k) for k in drafting} == drafting
    new = w.history.message(branched["id"])
    assert new.stop_reason in ("length", "eos") and branched["version"] == (2, 2), w.statusBar().currentMessage()
    toks = new.meta["tokens"]["tokens"]
    assert toks[:i] == ids[:i] and toks[i] == alt  # the forced token at the chosen position
    assert toks[i + 1:] == greedy_reference(story.model, prompt_ids + ids[:i] + [alt], len(toks) - i - 1)
    assert {k: new.settings[k] for k in drafting} == drafting  # the branch drafts as its reply did
    assert new.stats["speculative"]["kind"] == spec
    assert new.stats["prompt_tokens"] == len(prompt_ids) + i and new.stats["cached_tokens"] == len(prompt_ids) + i - 1
    close(loop, w)
