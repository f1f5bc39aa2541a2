"""The compare view end to end: the real bridge and worker on the stories260K fixture.

Scenarios run as coroutines on a qasync loop (``run(loop, coro)``) and wait with asyncio
sleeps, never a nested Qt event loop inside a coroutine.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtWidgets import QApplication, QWidget

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "artifacts"

LANES = [
    {"temperature": 0.0, "max_new_tokens": 48},  # greedy baseline
    {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 7, "max_new_tokens": 48},
    {"temperature": 1.3, "top_p": 0.95, "repetition_penalty": 1.15, "seed": 11, "max_new_tokens": 48},
]
PROMPT = "Once upon a time"

from core.engine.sampling import SamplingParams  # noqa: E402
from tests.gui.ui_helpers import ScriptedBridge, anchor_point, loop, reference_probs, run, until  # noqa: E402,F401  (shared qasync loop fixture and helpers)


# --------------------------------------------------------------------------- fixtures

@pytest.fixture
def history(tmp_path):
    from core.history.store import History
    h = History(tmp_path / "history.sqlite3")
    yield h
    h.close()


@pytest.fixture
def bridge(loop):
    from gui.bridge import Bridge
    b = Bridge(torch_threads=1)
    yield b
    loop.run_until_complete(b.shutdown())
    b.deleteLater()


@pytest.fixture(scope="module")
def story(fixtures):
    """The fixture model loaded directly, for the tokenizer and reference logits."""
    from core.checkpoints import load
    return load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")


class FakeBridge:
    """Enough bridge for layout tests that never run."""

    def compare(self, request):  # pragma: no cover - not reached
        raise AssertionError("no runs in this test")

    def cancel(self):
        pass




def load_and_run(loop, bridge, fixtures, view, timeout: float = 60) -> None:
    """Load the fixture model, then run every lane of ``view`` until all have finished."""
    async def scenario():
        await bridge.load(str(fixtures / "stories260K.gguf"), device="cpu", dtype="float32")
        view.run()
        await until(lambda: not view.running, timeout, "the comparison to finish")
    run(loop, scenario(), timeout + 30)


def snapshot(widget, name: str, *, in_coroutine: bool = False) -> Path:
    """Save a PNG under artifacts/. Inside a coroutine no events are processed: a nested
    processEvents() there can re-enter another task's step, which asyncio refuses, and
    that task then never wakes again."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    if not in_coroutine:
        QApplication.processEvents()
    widget.grab().save(str(path))
    return path


def token_text_of(tok):
    return lambda i: tok.token_bytes(i).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- a reference

# --------------------------------------------------------------------------- tests

def test_lanes_names_sweep_and_seed_lock(qtbot, loop, history):
    from gui.compare.view import CompareView
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT, lanes=LANES[:1])
    qtbot.addWidget(v)
    for name in ("compareView", "compareRunButton", "compareStopButton", "addLaneButton", "sweepButton",
                 "seedLockCheck", "baselineCombo", "heatmapCheck", "tokenInspector", "compareLane0"):
        w = v if name == "compareView" else v.findChild(QWidget, name)
        assert w is not None, name
    assert not v.bar.stop_button.isEnabled() and v.bar.run_button.isEnabled()

    qtbot.mouseClick(v.bar.add_button, Qt.LeftButton)
    assert v.lane_count() == 2 and v.findChild(QWidget, "compareLane1") is not None
    assert v.columns[1].settings() == v.columns[0].settings()  # a copy of the last lane
    v.columns[1].fields["temperature"].setValue(1.1)
    v.duplicate_lane(1)
    assert [c.settings()["temperature"] for c in v.columns] == [0.0, 1.1, 1.1]
    v.move_lane(2, -2)  # to the front
    assert [c.objectName() for c in v.columns] == ["compareLane0", "compareLane1", "compareLane2"]
    assert v.columns[0].settings()["temperature"] == 1.1
    v.remove_lane(0)
    assert v.lane_count() == 2 and v.bar.baseline_combo.count() == 2
    for _ in range(10):
        v.add_lane()
    assert v.lane_count() == 8 and not v.bar.add_button.isEnabled()

    # sweep: one lane per value, the rest copied from lane 1
    v.columns[0].set_settings({"top_p": 0.8, "seed": 5})
    qtbot.mouseClick(v.bar.sweep_button, Qt.LeftButton)
    assert not v.sweep_row.isHidden()
    v.sweep_row.values.setText("0.2:1.4:0.4")
    qtbot.mouseClick(v.sweep_row.apply_button, Qt.LeftButton)
    assert [c.settings()["temperature"] for c in v.columns] == [0.2, 0.6, 1.0, 1.4]
    assert all(c.settings()["top_p"] == 0.8 and c.settings()["seed"] == 5 for c in v.columns)
    assert not v.apply_sweep("top_p", "0.5, 1.5") and "between" in v.sweep_row.error.text()
    assert v.lane_count() == 4  # a bad sweep changes nothing

    # seed lock: every lane gets lane 1's seed, and the others' seed fields follow it
    v.columns[2].set_settings({"seed": 99})
    v.bar.seed_lock.setChecked(True)
    assert {s["seed"] for s in v.lane_settings()} == {5}
    assert not v.columns[2].fields["seed"].isEnabled()
    v.columns[0].fields["seed"].setValue(42)
    assert all(c.settings()["seed"] == 42 for c in v.columns)
    v.bar.seed_lock.setChecked(False)
    v.columns[0].set_settings({"seed": None})  # "random"
    v.bar.seed_lock.setChecked(True)  # locking a random seed picks one to share
    seeds = {s["seed"] for s in v.lane_settings()}
    assert len(seeds) == 1 and None not in seeds


def test_compare_end_to_end(qtbot, loop, bridge, history, story, fixtures, tmp_path):
    import torch
    from gui.compare.view import CompareView
    from gui.chat.conversation import ConversationModel
    from gui.widgets.token_inspector import fmt_prob

    conv = ConversationModel(history=history)
    adopted = []
    tok = story.tokenizer
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=LANES,
                    conversation=conv, token_text=token_text_of(tok))
    v.adoptRequested.connect(lambda text, info: adopted.append((text, info)))
    qtbot.addWidget(v)
    v.resize(1400, 760)
    v.show()

    async def scenario():
        info = await bridge.load(str(fixtures / "stories260K.gguf"), device="cpu", dtype="float32")
        assert "stories" in info["name"].lower() or info["context_length"] > 0
        chunks_before = v.renders
        qtbot.mouseClick(v.bar.run_button, Qt.LeftButton)
        assert v.running and v.bar.stop_button.isEnabled() and not v.bar.run_button.isEnabled()
        await until(lambda: v.columns[0].run and len(v.columns[0].run.tokens) >= 6, 30, "tokens streaming")
        mid = [len(c.run.tokens) for c in v.columns]
        snapshot(v, "compare_midstream", in_coroutine=True)
        await until(lambda: not v.running, 60, "the comparison to finish")
        return mid, v.renders - chunks_before

    mid, renders = run(loop, scenario(), 90)
    runs = [c.run for c in v.columns]
    assert all(r.finished for r in runs), [r.stop_reason for r in runs]
    # (mid-stream counts are not asserted: on a loaded machine the UI may see a lane finish
    # between two polls; the screenshot shows the streaming state)
    # three columns, each with its own streamed text; the text shown is the lane's text
    for c, r in zip(v.columns, runs):
        assert r.text and len(r.tokens) > 3
        assert c.browser.toPlainText().replace("\u2503", "") == r.text
        assert "tok/s" in c.stats.text() and "perplexity" in c.stats.text() and "distinct-2" in c.stats.text()
    assert runs[0].params["temperature"] == 0.0 and runs[0].params["seed"] is not None  # resolved
    assert runs[1].params["seed"] == 7 and runs[2].params["seed"] == 11
    assert runs[1].text != runs[0].text
    total_tokens = sum(len(r.tokens) for r in runs)
    assert renders < total_tokens  # coalesced, not once per token
    # divergence marks against the greedy baseline
    assert "baseline" in v.columns[0].title.text()
    assert "Diverges at token" in v.columns[1].divergence.text()

    # inspector on lane 2 (top-k/top-p/min-p) and lane 3 (repetition penalty) vs. the model
    prompt_ids = tok.encode(PROMPT, bos=True)
    for lane, idx in ((1, 5), (2, 9)):
        v.columns[lane].browser.anchorClicked.emit(QUrl(f"tok:{lane}:{idx}"))
        assert v.inspector.current == (lane, idx) and v.selected == (lane, idx)
        rec = runs[lane].tokens[idx]
        raw, filt = reference_probs(story, prompt_ids, runs[lane].ids, idx, runs[lane].params)
        assert abs(float(raw[rec.token_id].log()) - rec.logprob) < 1e-4
        rows = v.inspector.rows
        assert rows and any(r["chosen"] for r in rows)
        assert [r["id"] for r in rows][:5] == torch.topk(raw, 5).indices.tolist()
        for row, shown in zip(rows, v.inspector.shown_values()):
            assert abs(row["raw"] - float(raw[row["id"]])) < 1e-4
            ref_f = float(filt[row["id"]])
            assert row["filtered"] is not None and abs(row["filtered"] - ref_f) < 1e-4, (row, ref_f)
            assert shown[1] == fmt_prob(row["raw"]) and shown[2] == fmt_prob(row["filtered"])
            text = token_text_of(tok)(row["id"])
            assert shown[0] == (text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") if text else "∅")
        assert abs(sum(float(filt[r["id"]]) for r in rows) - sum(r["filtered"] for r in rows)) < 1e-4

    # a real click on a token's anchor pins it; hovering shows another, leaving goes back
    browser = v.columns[2].browser
    pos = anchor_point(browser, "tok:2:3")
    qtbot.mouseClick(browser.viewport(), Qt.LeftButton, pos=pos)
    assert v.selected == (2, 3) and v.inspector.current == (2, 3)
    browser.highlighted.emit(QUrl("tok:2:6"))
    assert v.inspector.current == (2, 6) and v.selected == (2, 3)
    browser.highlighted.emit(QUrl(""))
    assert v.inspector.current == (2, 3)

    # the heatmap and the finished view with the inspector open
    v.inspect_token(1, 5)
    v.bar.heatmap_check.setChecked(True)
    assert "background-color" in v.columns[0].browser.toHtml()
    snapshot(v, "compare_heatmap")
    v.bar.heatmap_check.setChecked(False)
    snapshot(v, "compare_finished")

    # adopt lane 2 into the chat: the prompt as the user's turn, the lane's reply after it
    qtbot.mouseClick(v.columns[1].adopt_button, Qt.LeftButton)
    assert adopted and adopted[0][0] == runs[1].text and adopted[0][1]["seed"] == 7
    path = conv.path()
    assert [m.role for m in path] == ["user", "assistant"]
    assert path[0].text == PROMPT and path[1].text == runs[1].text and path[1].seed == 7
    assert path[1].settings["top_k"] == 20

    # save, reopen in a fresh view, re-run exactly
    qtbot.mouseClick(v.findChild(QWidget, "compareSaveButton"), Qt.LeftButton)
    cid = v.saved_id
    assert cid is not None and cid in [c.id for c in history.conversations(kind="comparison")]
    saved = history.comparison(cid)
    assert [l["seed"] for l in saved["lanes"]] == [r.params["seed"] for r in runs]
    md = Path(v.export("md", str(tmp_path / "cmp.md"))).read_text()
    assert runs[1].text.strip()[:30] in md and "seed 7" in md
    js = json.loads(Path(v.export("json", str(tmp_path / "cmp.json"))).read_text())
    assert js["conversation"]["kind"] == "comparison"
    assert js["conversation"]["meta"]["comparison"]["lanes"][2]["settings"]["repetition_penalty"] == 1.15

    v2 = CompareView(bridge=bridge, history=history, token_text=token_text_of(tok))
    qtbot.addWidget(v2)
    v2.resize(1400, 760)
    v2.show()
    v2.fill_saved_menu()
    titles = [a.text() for a in v2.bar.saved_menu.actions()]
    assert any(t.startswith("Compare: Once upon") for t in titles)
    v2.open_comparison(cid)
    assert v2.lane_count() == 3 and v2.prompt_row.mode_combo.currentData() == "completion"
    assert v2.prompt_row.prompt_edit.toPlainText() == PROMPT
    for c, r in zip(v2.columns, runs):
        s = c.settings()
        for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "max_new_tokens"):
            assert s[k] == pytest.approx(r.params[k]), k
        assert c.run.text == r.text  # the saved results show before any run
    assert "Diverges at token" in v2.columns[1].divergence.text()

    async def rerun():
        v2.run()
        await until(lambda: not v2.running, 60, "the re-run")

    run(loop, rerun(), 90)
    assert [c.run.text for c in v2.columns] == [r.text for r in runs]
    assert [c.run.ids for c in v2.columns] == [r.ids for r in runs]


def test_stop_cancels_all_lanes(qtbot, loop, bridge, history, fixtures):
    from gui.compare.view import CompareView
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion",
                    lanes=[{**l, "max_new_tokens": 2000} for l in LANES[:2]])
    qtbot.addWidget(v)
    v.show()

    async def scenario():
        await bridge.load(str(fixtures / "stories260K.gguf"), device="cpu", dtype="float32")
        v.run()
        await until(lambda: v.columns[0].run and len(v.columns[0].run.tokens) >= 3, 30, "tokens")
        qtbot.mouseClick(v.bar.stop_button, Qt.LeftButton)
        await until(lambda: not v.running, 30, "the stop")

    run(loop, scenario(), 90)
    reasons = [c.run.stop_reason for c in v.columns]
    assert all(r in ("cancelled", "eos", "length", "context") for r in reasons)
    assert "cancelled" in reasons or all(r != "length" for r in reasons)
    assert v.bar.run_button.isEnabled() and not v.bar.stop_button.isEnabled()


def test_main_window_hook(qtbot, loop, bridge, tmp_path, monkeypatch):
    """compareButton / Ctrl+Shift+K open the view seeded from the prompt and the panel."""
    from PySide6.QtCore import QSettings
    import gui.main_window as mw
    from core.history.store import History
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path))
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)
    w = mw.MainWindow(bridge=bridge, history=History(tmp_path / "h.sqlite3"), settings=settings, autoload=False)
    qtbot.addWidget(w)
    w.show()
    w.panel.set_params(SamplingParams(temperature=0.55, top_k=33, seed=21, max_new_tokens=64))
    w.prompt.set_text("Tell me a story")
    action = w.findChild(type(w.action("compare")), "compareButton") or w.action("compare")
    assert action.objectName() == "compareButton" and action.isVisible()
    assert action.shortcut().toString() == "Ctrl+Shift+K"
    assert w.findChild(QWidget, "compareButton") is not None  # the toolbar's button
    action.trigger()
    view = w.compare_view
    assert view is not None and view.objectName() == "compareView" and view.isVisible()
    assert view.prompt_row.prompt_edit.toPlainText() == "Tell me a story"
    s = view.columns[0].settings()
    assert s["temperature"] == 0.55 and s["top_k"] == 33 and s["seed"] == 21 and s["max_new_tokens"] == 64
    action.trigger()
    assert w.compare_view is view  # raised, not opened twice
    snapshot(w, "compare_main_window_toolbar")
    view.close()
    w.close()


async def three_words(request, stream):
    """Each lane streams three words (" a b c", lane 1 differs at the second) in one Chunk."""
    from core.engine.engine import Done, Prefilled, Stats, Token
    from core.worker.worker import Prompted
    from gui.bridge import Chunk
    yield Prompted(1, 0, 256)
    yield Prefilled(5, 0, 0.0)
    for lane, p in enumerate(request.lanes):
        seed = p.seed if p.seed is not None else 1000 + lane
        words = [" a", " b", " c"] if lane == 0 else [" a", " x", " c"]
        toks = [Token(lane, i, 10 + i + (lane and i == 1) * 50, w, w, -0.5, None) for i, w in enumerate(words)]
        yield Chunk(lane, "".join(words), toks)
        await asyncio.sleep(0)
        yield Done(lane, "length", [t.token_id for t in toks], "".join(words).strip(), [-0.5] * 3,
                   SamplingParams.from_dict({**p.to_dict(), "seed": seed}), Stats(generated_tokens=3, decode_s=0.2))


def test_run_flow_chat_context_seed_lock_and_reruns(qtbot, loop, history):
    from gui.compare.view import CompareView
    from gui.chat.conversation import ConversationModel
    conv = ConversationModel(history=history)
    conv.add_user("Hi")
    conv.add_reply(conv.leaf_id(), "Hello!")
    b = ScriptedBridge(three_words)
    v = CompareView(bridge=b, history=history, prompt="And then?", messages=conv.request_messages("Be brief."),
                    lanes=[{"temperature": 0.7, "seed": None, "stop": ["\n\n"]}, {"temperature": 1.2, "seed": 3}],
                    conversation=conv)
    qtbot.addWidget(v)

    async def go(**kw):
        v.run(**kw)
        await until(lambda: not v.running, 10, "the run")

    run(loop, go(), 90)
    req = b.requests[-1]
    assert req.mode == "chat" and req.inspect == 5
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "user"]
    assert req.messages[-1]["content"] == "And then?"
    assert [p.seed for p in req.lanes] == [None, 3] and all(p.stop == ("\n\n",) for p in req.lanes)
    assert v.columns[0].run.params["seed"] == 1000  # the seed the worker drew is kept
    assert "Diverges at token 2" in v.columns[1].divergence.text()
    # Re-run: exactly the shown results' settings, random seed now fixed to the one used
    run(loop, go(again=True), 90)
    assert [p.seed for p in b.requests[-1].lanes] == [1000, 3]
    # seed lock: one seed for all lanes; new seeds draws one shared seed
    v.bar.seed_lock.setChecked(True)
    run(loop, go(), 90)
    assert len({p.seed for p in b.requests[-1].lanes}) == 1
    run(loop, go(new_seeds=True), 90)
    seeds = [p.seed for p in b.requests[-1].lanes]
    assert len(set(seeds)) == 1 and seeds[0] is not None
    v.bar.seed_lock.setChecked(False)
    run(loop, go(new_seeds=True), 90)
    # adopting answers the conversation: the prompt becomes the user's turn
    info = v.adopt(1)
    assert info and [m.role for m in conv.path()] == ["user", "assistant", "user", "assistant"]
    assert conv.path()[-1].text == "a x c" and conv.path()[-2].text == "And then?"
    # baseline switch: lane 2 becomes the baseline, lane 1 now diverges from it
    v.bar.baseline_combo.setCurrentIndex(1)
    assert "baseline" in v.columns[1].title.text() and "Diverges at token 2" in v.columns[0].divergence.text()
    # an empty prompt without context is refused with a message
    v.prompt_row.prompt_edit.setPlainText("")
    v.prompt_row.context_check.setChecked(False)
    assert v.run() is None and "prompt" in v.status.text().lower()


def test_lane_summaries_follow_edits_before_a_run(qtbot, loop, history):
    from gui.compare.view import CompareView
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT,
                    lanes=[{"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 0.0, "top_k": 5}])
    qtbot.addWidget(v)
    v.render()
    assert v.columns[1].divergence.text() == "T 1"
    v.columns[1].fields["temperature"].setValue(2.0)
    assert v.columns[1].divergence.text() == "T 2"
    v.columns[2].fields["top_k"].setValue(9)
    assert v.columns[2].divergence.text() == "top-k 9"
    v.columns[0].fields["top_k"].setValue(9)  # the baseline: every other lane's summary changes
    assert v.columns[2].divergence.text() == "T 0"  # nothing differs any more
    assert v.columns[1].divergence.text() == "T 2 · top-k 0"



def test_a_lane_sets_prompt_lookup_or_a_draft_model_never_both(qtbot, loop, history, monkeypatch, tmp_path):
    """The lane editor's speculative row (the sampling panel's controls): off, prompt lookup
    with its n, or a draft model's path with a "…" chooser. One mode at a time, so what a
    lane sends always validates; the summary names the draft model; a lane on a server that
    drafts is refused inline; the stats line names the draft model that drafted."""
    from core.engine.sampling import SamplingParams
    from gui.settings import panel as sampling_panel
    from gui.compare.models import LaneModel
    from gui.compare.view import CompareView
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT,
                    lanes=[{"temperature": 0.0, "lookup": 3}, {"temperature": 0.0},
                           {"temperature": 0.0, "draft": "/models/small.gguf"}])
    qtbot.addWidget(v)
    v.resize(1000, 700)
    v.show()
    look, plain, drafted = v.columns
    field = look.findChild(QWidget, "lane_lookup")
    assert field is not None and field.value() == 3 and "lookup" in field.toolTip().lower() and field.isVisible()
    assert look.speculative.mode() == "lookup" and not look.speculative.draft_row.isVisible()
    assert plain.speculative.mode() == "off" and plain.speculative.combo.currentText() == "Off"
    assert not plain.findChild(QWidget, "lane_lookup").isVisible() and not plain.speculative.draft_row.isVisible()
    assert drafted.findChild(QWidget, "lane_draft").text() == "/models/small.gguf"
    assert drafted.speculative.draft_row.isVisible() and drafted.findChild(QWidget, "lane_draft_browse").isVisible()
    assert [(s["lookup"], s["draft"]) for s in v.lane_settings()] == [(3, ""), (0, ""), (0, "/models/small.gguf")]
    assert drafted.divergence.text() == "lookup off · draft small.gguf"  # the summary against the baseline

    # "…" chooses a draft model: the lane switches from lookup to that draft, never both.
    chosen = tmp_path / "tiny draft.gguf"
    chosen.write_bytes(b"GGUF")
    asked = []
    monkeypatch.setattr(sampling_panel, "choose_model_path", lambda parent, title, start="": asked.append(title)
                        or str(chosen))
    look.speculative.combo.setCurrentIndex(look.speculative.combo.findData("draft"))
    assert look.settings()["lookup"] == 0 and look.settings()["draft"] == ""  # a draft with no path yet: off
    qtbot.mouseClick(look.findChild(QWidget, "lane_draft_browse"), Qt.LeftButton)
    assert asked == ["Choose a draft model"]
    assert (look.settings()["lookup"], look.settings()["draft"]) == (0, str(chosen))
    assert plain.divergence.text() == "draft off"  # lane 1 is the baseline: the others say how they differ
    # Back to lookup: its n was kept, the draft is off (and its path kept for later).
    look.speculative.combo.setCurrentIndex(look.speculative.combo.findData("lookup"))
    assert (look.settings()["lookup"], look.settings()["draft"]) == (3, "")
    # Typing a path (then leaving the field) is an edit the summary follows; a path that
    # names nothing is said inline at once, and goes when the path is right.
    drafted.speculative.draft.setText("/models/other.gguf")
    drafted.speculative.draft.editingFinished.emit()
    assert drafted.divergence.text() == "lookup off · draft other.gguf"
    assert drafted.notice.isVisible() and drafted.notice.text() == "Draft model not found: /models/other.gguf"
    drafted.speculative.draft.setText(str(chosen))
    drafted.speculative.draft.editingFinished.emit()
    assert drafted.notice.isHidden()
    # Settings that name both (a hand-edited save): the draft wins, the lane stays valid.
    plain.set_settings({"lookup": 4, "draft": "/models/x.gguf"})
    assert (plain.settings()["lookup"], plain.settings()["draft"]) == (0, "/models/x.gguf")
    plain.set_settings({"lookup": 2})  # lookup alone replaces the draft
    assert (plain.settings()["lookup"], plain.settings()["draft"]) == (2, "")
    plain.set_settings({"lookup": "many", "draft": 7})  # not a number, not a path: off
    assert (plain.settings()["lookup"], plain.settings()["draft"]) == (0, "")
    for s in v.lane_settings():
        SamplingParams.from_dict(s).validate()

    # A lane on a server decodes there: lookup or a draft is refused inline, nothing runs.
    v.set_lane_model(2, LaneModel("server", "remote-model", tokenizer=None, path="http://127.0.0.1:9/v1"))
    assert v.run() is None and not v.running
    assert "lane 3 drafts (speculative) on a server" in v.status.text()
    assert not drafted.notice.isHidden() and "speculative decoding to Off" in drafted.notice.text()

    from core.engine.lanes import lane_stats
    from gui.chat.chat_view import format_stats
    st = lane_stats([5, 6, 7], [-0.1, -0.2, -0.3], {"decode_tok_s": 10.0, "speculative": {
        "kind": "lookup", "lookup": 3, "draft": "", "drafted": 10, "accepted": 7, "acceptance": 0.7,
        "mean_draft": 2.5, "speedup": 1.6}})
    text = format_stats({"stats": st, "stop_reason": "length"})
    assert "speculative (lookup 3): 70% of 10 drafted accepted, 2.5 a step · ≈1.60× plain" in text
    st["speculative"] = {**st["speculative"], "kind": "draft", "lookup": 0, "draft": "/models/small.gguf"}
    assert "speculative (draft small.gguf): 70% of 10 drafted accepted" in format_stats({"stats": st})


def test_draft_model_lanes_run_save_export_and_reopen_and_a_bad_draft_fails_only_its_lane(
        qtbot, loop, bridge, history, story, fixtures, random_draft, tmp_path):
    """Draft-model lanes through the real worker: a lane drafting with a random model of
    the same tokenizer gives the greedy lane's tokens (speculative decoding is exact) and
    says how drafting went; a lane whose draft file is missing and one whose draft model
    has another tokenizer each get an inline notice, and the other lanes still run. The
    draft model is saved, exported (JSON and Markdown) and reopened with the comparison."""
    from gui.compare.view import CompareView
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    missing = tmp_path / "gone.gguf"
    lanes = [{"temperature": 0.0, "max_new_tokens": 24},
             {"temperature": 0.0, "max_new_tokens": 24, "draft": str(random_draft)},
             {"temperature": 0.0, "max_new_tokens": 24, "draft": str(missing)},
             {"temperature": 0.0, "max_new_tokens": 24, "draft": str(demo)},
             {"temperature": 0.0, "max_new_tokens": 24, "lookup": 2}]
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=lanes,
                    token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v)
    v.resize(1600, 800)
    v.show()

    load_and_run(loop, bridge, fixtures, v, 90)
    plain, drafted, gone, foreign, lookup = (c.run for c in v.columns)
    assert plain.stop_reason == "length" and len(plain.ids) == 24
    assert drafted.error is None and drafted.ids == plain.ids and lookup.ids == plain.ids
    sp = drafted.engine_stats["speculative"]
    # (a random draft's choices rarely agree with the target's, so it may never earn a draft:
    # drafted can be 0; the lane still ran as a drafting lane and says so)
    assert sp["kind"] == "draft" and sp["draft"] == str(random_draft) and sp["accepted"] <= sp["drafted"]
    assert "speculative (draft random-draft.gguf)" in v.columns[1].stats.text()
    assert gone.error and "draft model not found" in gone.error and not gone.ids
    assert "draft model not found" in v.columns[2].notice.text() and not v.columns[2].notice.isHidden()
    assert foreign.error and "another vocabulary" in foreign.error and not foreign.ids
    assert "another vocabulary" in v.columns[3].notice.text() and "draft model" in v.columns[3].notice.text()
    assert all(v.columns[i].notice.isHidden() for i in (0, 1, 4))
    assert "lane 3" in v.status.text() and "lane 4" in v.status.text()
    snapshot(v, "compare_draft_lanes")

    md = Path(v.export("md", str(tmp_path / "c.md"))).read_text()
    assert f"draft model {random_draft}" in md and "prompt lookup 2" in md
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert [ln["settings"]["draft"] for ln in saved] == ["", str(random_draft), str(missing), str(demo), ""]
    assert [ln["settings"]["lookup"] for ln in saved] == [0, 0, 0, 0, 2]
    v2 = CompareView(bridge=bridge, history=history, token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v2)
    v2.open_comparison(v.saved_id)
    assert [(c.settings()["lookup"], c.settings()["draft"]) for c in v2.columns] == \
        [(0, ""), (0, str(random_draft)), (0, str(missing)), (0, str(demo)), (2, "")]
    assert v2.columns[1].speculative.mode() == "draft" and v2.columns[1].run.ids == plain.ids


def test_branch_from_a_lane_that_drafts_keeps_drafting_with_the_token_forced(
        qtbot, loop, bridge, history, story, fixtures, random_draft, tmp_path):
    """'Continue with X' from a lane with prompt lookup and from a lane with a draft model,
    through the real worker: each branch lane keeps its source's lookup or draft setting
    (shown in its editor, used by the worker, saved), keeps the source's tokens before the
    position, has X there, and continues as plain greedy decoding from X does."""
    from core.engine.engine import Done as EngineDone, Engine
    from gui.compare.view import CompareView
    tok = story.tokenizer
    lanes = [{"temperature": 0.0, "max_new_tokens": 20, "lookup": 2},
             {"temperature": 0.0, "max_new_tokens": 20, "draft": str(random_draft)}]
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=lanes,
                    token_text=token_text_of(tok))
    qtbot.addWidget(v)
    v.resize(1500, 800)
    v.show()
    load_and_run(loop, bridge, fixtures, v)
    prompt_ids = tok.encode(PROMPT, bos=True)
    plain = Engine(story.model, tok, stop_ids=story.stop_ids)

    async def wait():
        await until(lambda: not v.running, 60, "the branch to finish")

    assert v.columns[1].run.ids == v.columns[0].run.ids
    for lane, at, drafting in ((0, 3, {"lookup": 2}), (1, 5, {"draft": str(random_draft)})):
        source = v.columns[lane].run
        assert source.error is None and source.engine_stats["speculative"]["kind"] == next(iter(drafting))
        assert v.inspect_token(lane, at)
        alt = next(r["id"] for r in v.inspector.rows if not r["chosen"] and r["id"] >= 0)
        assert v.inspector.select_row(alt) and v.inspector.branch_button.isEnabled()
        qtbot.mouseClick(v.inspector.branch_button, Qt.LeftButton)
        assert v.running
        run(loop, wait(), 90)
        col = v.columns[-1]
        br = col.run
        assert br.finished and br.error is None and col.notice.isHidden(), v.status.text()
        assert {k: col.settings()[k] for k in drafting} == drafting  # the editor shows the setting kept
        assert {k: br.params[k] for k in drafting} == drafting  # and the worker drafted with it
        assert br.engine_stats["speculative"]["kind"] == next(iter(drafting))
        assert br.ids[:at] == source.ids[:at] and br.ids[at] == alt  # the forced token at the position
        ref = [e for e in plain.generate(prompt_ids + source.ids[:at], SamplingParams(temperature=0.0,
               max_new_tokens=20), forced=[alt]) if isinstance(e, EngineDone)][0]
        assert br.ids[at:] == ref.tokens  # greedy from the forced token, as plain decoding without drafts
        # The prefix came from the KV cache: all of it after the comparison; after the first
        # branch, what that branch's request shared (both lanes are greedy: the same tokens).
        assert br.engine_stats["cached_tokens"] == len(prompt_ids) + (at - 1 if lane == 0 else 3)
        assert col.branch_label.text() == f"Branched from lane {lane + 1} at token {at + 1}"
    assert v.lane_count() == 4
    snapshot(v, "compare_branch_drafting")
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert [(ln["settings"]["lookup"], ln["settings"]["draft"]) for ln in saved] == \
        [(2, ""), (0, str(random_draft)), (2, ""), (0, str(random_draft))]
    assert [ln["branch"]["from_lane"] for ln in saved[2:]] == [1, 2]


def test_lanes_with_output_formats_validate_save_and_show_what_the_constraint_removed(
        qtbot, loop, bridge, history, story, fixtures, tmp_path):
    """Per-lane constraints through the real worker: a JSON-schema lane validates, a regex
    lane matches, a free lane beside them is untouched; saved, exported and reopened with
    their constraints; the inspector marks the model's favourites the schema removed; a
    schema that cannot compile is an inline notice in its lane."""
    import re

    import jsonschema
    from gui.compare.view import CompareView

    schema = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
              "properties": {"name": {"type": "string", "pattern": "^[A-Za-z]{1,8}$"},
                             "age": {"type": "integer", "minimum": 0, "maximum": 99}}}
    lanes = [{"temperature": 0.0, "max_new_tokens": 40, "constraint": {"kind": "json_schema", "text": json.dumps(schema)}},
             {"temperature": 1.0, "seed": 3, "max_new_tokens": 30, "constraint": {"kind": "regex", "text": "(Tom|Amy) is [0-9]{1,2}"}},
             {"temperature": 0.0, "max_new_tokens": 12}]
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=lanes,
                    token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v)
    v.resize(1400, 760)
    v.show()
    assert v.columns[0].constraint_kind.currentData() == "json_schema"
    assert not v.columns[1].constraint_text.isHidden() and v.columns[2].constraint_text.isHidden()

    load_and_run(loop, bridge, fixtures, v, 60)
    runs = [c.run for c in v.columns]
    assert [r.stop_reason for r in runs[:2]] == ["eos", "eos"], [r.stop_reason for r in runs]
    jsonschema.validate(json.loads(runs[0].text), schema)
    assert re.fullmatch("(Tom|Amy) is [0-9]{1,2}", runs[1].text)
    assert runs[2].text.startswith(", there was")  # the free lane: the fixture's greedy text
    v.inspect_token(0, 0)
    marked = [r for r in v.inspector.rows if r["constrained"]]
    assert marked and marked[0]["id"] == v.inspector.rows[0]["id"]  # the model's favourite was not "{"
    assert all(shown[2] == "constraint" for row, shown in zip(v.inspector.rows, v.inspector.shown_values())
               if row["constrained"])
    snapshot(v, "compare_constraints")
    md = Path(v.export("md", str(tmp_path / "c.md"))).read_text()
    assert "format JSON schema" in md and "format regular expression" in md
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert saved[0]["settings"]["constraint"]["kind"] == "json_schema" and saved[2]["settings"]["constraint"] is None
    v.save()
    v2 = CompareView(bridge=bridge, history=history, token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v2)
    v2.open_comparison(v.saved_id)
    assert [c.settings()["constraint"] for c in v2.columns] == [ln.get("constraint") for ln in lanes]
    # A regex that cannot compile: the lane says so inline as it is typed.
    col = v2.columns[1]
    col.constraint_text.setText("(Tom|Amy")
    col.constraint_text.editingFinished.emit()
    assert not col.notice.isHidden() and "cannot be compiled" in col.notice.text()


def test_lane_logit_bias_field_runs_saves_and_reopens(qtbot, loop, bridge, history, story, fixtures, tmp_path):
    """A lane's logit bias field through the real worker: the lane with 'girl=-inf' never
    uses girl's tokens while the greedy lane beside it does; a malformed item is left out
    and named inline; the bias is saved, exported (JSON and Markdown) and reopened."""
    from gui.compare.view import CompareView
    girl = set(story.tokenizer.encode("girl"))
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion",
                    lanes=[{"temperature": 0.0, "max_new_tokens": 16}] * 2, token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v)
    col = v.columns[1]
    col.bias_edit.setText("girl=-inf, dragon=lots")
    col.bias_edit.editingFinished.emit()
    assert not col.bias_notice.isHidden() and "Left out" in col.bias_notice.text() \
        and "not a number" in col.bias_notice.text()
    assert col.settings()["logit_bias_text"] == ["girl=-inf"]
    assert v.columns[0].settings()["logit_bias_text"] == []
    assert "bias girl=-inf" in col.divergence.text()  # the summary against the baseline names it

    load_and_run(loop, bridge, fixtures, v, 60)
    plain, banned = (c.run for c in v.columns)
    assert girl <= set(plain.ids) and not girl & set(banned.ids)
    assert banned.params["logit_bias_text"] == ["girl=-inf"]
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert [ln["settings"]["logit_bias_text"] for ln in saved] == [[], ["girl=-inf"]]
    assert "logit bias girl=-inf" in Path(v.export("md", str(tmp_path / "c.md"))).read_text()
    v2 = CompareView(bridge=bridge, history=history, token_text=token_text_of(story.tokenizer))
    qtbot.addWidget(v2)
    v2.open_comparison(v.saved_id)
    assert v2.columns[1].bias_edit.text() == "girl=-inf" and v2.columns[1].bias_notice.isHidden()
    assert v2.columns[0].bias_edit.text() == ""


def test_lane_logit_bias_on_a_server_is_refused_inline(qtbot, loop, history):
    from gui.compare.models import LaneModel
    from gui.compare.view import CompareView
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT,
                    lanes=[{"temperature": 0.0}, {"temperature": 0.0, "logit_bias_text": ["girl=-inf"]}])
    qtbot.addWidget(v)
    v.set_lane_model(1, LaneModel("server", "remote-model", tokenizer=None, path="http://127.0.0.1:9/v1"))
    assert v.run() is None and not v.running
    assert "lane 2 sets a logit bias on a server" in v.status.text()
    assert not v.columns[1].notice.isHidden() and "server" in v.columns[1].notice.text()


def test_branch_from_a_lane_token_adds_a_lane_and_ban_edits_the_lanes_bias(
        qtbot, loop, bridge, history, story, fixtures, tmp_path):
    """'Continue with X' in a lane's inspector, through the real worker: a new lane with the
    lane's settings keeps its tokens before the position, has X there (the prefix came from
    the KV cache: cached_tokens counted) and continues as an uncached engine does; its header
    and divergence say where it branched; it is saved and reopens as a branch. 'Ban X' adds
    X=-inf to that lane's bias, and the next Run never draws X there (the branch is forced again)."""
    from core.engine.engine import Done as EngineDone, Engine
    from gui.compare.view import CompareView
    tok = story.tokenizer
    lanes = [{"temperature": 0.0, "max_new_tokens": 20}, {"temperature": 0.8, "seed": 5, "max_new_tokens": 20}]
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=lanes,
                    token_text=token_text_of(tok))
    qtbot.addWidget(v)
    v.resize(1500, 800)
    v.show()

    load_and_run(loop, bridge, fixtures, v, 60)
    base = v.columns[0].run
    at = 3
    assert v.inspect_token(0, at)
    alt = next(r["id"] for r in v.inspector.rows if not r["chosen"] and r["id"] >= 0)
    assert v.inspector.select_row(alt) and v.inspector.branch_button.isEnabled()
    assert "Continue with" in v.inspector.branch_button.text()
    qtbot.mouseClick(v.inspector.branch_button, Qt.LeftButton)
    assert v.lane_count() == 3 and v.running

    async def wait():
        await until(lambda: not v.running, 60, "the branch to finish")

    run(loop, wait(), 90)
    col = v.columns[2]
    br = col.run
    assert br.finished and br.error is None, v.status.text()
    assert br.ids[:at] == base.ids[:at] and br.ids[at] == alt
    assert br.text.startswith("".join(t.text for t in base.tokens[:at]))
    prompt_ids = tok.encode(PROMPT, bos=True)
    st = br.engine_stats
    assert st["prompt_tokens"] == len(prompt_ids) + at and st["cached_tokens"] == len(prompt_ids) + at - 1
    assert f"{st['cached_tokens']}/{st['prompt_tokens']} prompt tokens cached" in col.stats.text()
    ref = [e for e in Engine(story.model, tok, stop_ids=story.stop_ids).generate(
        prompt_ids + base.ids[:at], SamplingParams(temperature=0.0, max_new_tokens=20), forced=[alt])
        if isinstance(e, EngineDone)][0]
    assert br.ids[at:] == ref.tokens  # the continuation: greedy from the forced token, as uncached
    assert col.branch_label.text() == "Branched from lane 1 at token 4" and not col.branch_label.isHidden()
    assert "Diverges at token 4" in col.divergence.text() and "Branch" in col.divergence.text()
    assert v.columns[0].run is base and v.columns[1].run.finished  # the other lanes kept their results

    # saved with the comparison, reopened as a branch
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert saved[2]["branch"] == {"from_lane": 1, "at": at, "token_id": alt, "kept_tokens": base.ids[:at]}
    assert "branch" not in saved[0] and saved[2]["tokens"] == br.ids
    v2 = CompareView(bridge=bridge, history=history, token_text=token_text_of(tok))
    qtbot.addWidget(v2)
    v2.open_comparison(v.saved_id)
    assert v2.columns[2].branch["at"] == at and v2.columns[2].branch_label.text() == "Branched from lane 1 at token 4"
    assert v2.columns[2].branch["kept"].ids == base.ids[:at]

    # Ban X in lane 2: a word-start token of its reply, banned by its text
    lane2 = v.columns[1].run
    i, ban = next((i, t) for i, t in enumerate(lane2.tokens) if t.piece.startswith(" ") and len(t.piece) > 2
                  and tok.encode(t.piece[1:]) == [t.token_id])
    assert v.inspect_token(1, i) and v.inspector.select_row(ban.token_id)
    assert v.inspector.ban_button.text() == f"Ban “{v.inspector.text_of(ban.token_id)}” in this lane"
    qtbot.mouseClick(v.inspector.ban_button, Qt.LeftButton)
    assert v.columns[1].logit_bias() == [f"{ban.piece[1:]}=-inf"]
    v.run()
    run(loop, wait(), 90)
    assert ban.token_id not in v.columns[1].run.ids
    again = v.columns[2].run
    assert again.ids[:at] == base.ids[:at] and again.ids[at] == alt and again.ids == br.ids  # the same branch
    v.inspect_token(2, at)
    snapshot(v, "compare_branch")


def test_sweep_every_knob_makes_those_lanes(qtbot, loop, bridge, history, story, fixtures):
    """The Sweep row over seed, prompt lookup, a logit bias and the output format on/off:
    the lanes it makes carry those settings (the rest copied from lane 1); a bias sweep runs
    through the real worker with each lane biased as swept; bad values are named inline."""
    from gui.compare.view import CompareView
    girl = set(story.tokenizer.encode("girl"))
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion",
                    lanes=[{"temperature": 0.0, "max_new_tokens": 16, "logit_bias_text": ["Lily=1"],
                            "constraint": {"kind": "regex", "text": "[a-z ,]+"}}])
    qtbot.addWidget(v)
    keys = [v.sweep_row.param.itemData(i) for i in range(v.sweep_row.param.count())]
    assert {"seed", "lookup", "logit_bias_text", "constraint"} <= set(keys)
    v.sweep_row.param.setCurrentIndex(keys.index("logit_bias_text"))
    assert "girl=-inf" in v.sweep_row.values.placeholderText()
    assert v.apply_sweep("lookup", "0, 3")
    assert [c.settings()["lookup"] for c in v.columns] == [0, 3]
    assert v.apply_sweep("seed", "4:6")
    assert [c.settings()["seed"] for c in v.columns] == [4, 5, 6]
    assert v.apply_sweep("constraint", "on, off")
    assert [c.settings()["constraint"] for c in v.columns] == [{"kind": "regex", "text": "[a-z ,]+"}, None]
    assert "output format: on, off" in v.status.text()
    assert not v.apply_sweep("logit_bias_text", "girl=lots") and "not a number" in v.sweep_row.error.text()
    assert v.lane_count() == 2  # a bad sweep changes nothing
    v.columns[0].set_settings({"constraint": None})
    assert not v.apply_sweep("constraint", "on, off") and "no output format" in v.sweep_row.error.text()
    assert v.apply_sweep("logit_bias_text", "girl=-inf, 0")
    assert [c.settings()["logit_bias_text"] for c in v.columns] == [["Lily=1", "girl=-inf"], ["Lily=1", "girl=0"]]
    assert [c.bias_edit.text() for c in v.columns] == ["Lily=1, girl=-inf", "Lily=1, girl=0"]

    load_and_run(loop, bridge, fixtures, v, 60)
    banned, kept = (c.run for c in v.columns)
    assert not girl & set(banned.ids) and girl <= set(kept.ids)


SWEEPS = [  # setting, values typed in the Sweep row, the lane values they make, how Markdown shows one
    ("temperature", "0, 0.7", [0.0, 0.7], "temperature {}"),
    ("top_p", "0.5, 0.9", [0.5, 0.9], "top_p {}"),
    ("top_k", "1, 40", [1, 40], "top_k {}"),
    ("min_p", "0, 0.1", [0.0, 0.1], "min_p {}"),
    ("repetition_penalty", "1, 1.3", [1.0, 1.3], "repetition_penalty {}"),
    ("seed", "4, 5", [4, 5], "seed {}"),
    ("max_new_tokens", "3, 5", [3, 5], "max_new_tokens {}"),
    ("lookup", "0, 2", [0, 2], "prompt lookup {}"),
    ("draft", None, ["", "DRAFT"], "draft model {}"),  # the "…" button fills it in
    ("constraint", "on, off", [{"kind": "regex", "text": "[a-z ,.]+"}, None], None),
    ("logit_bias_text", "girl=-inf, 0", [["girl=-inf"], ["girl=0"]], "logit bias {}"),
]


def test_every_knob_sweeps_from_the_sweep_row_and_its_lanes_run_save_and_export(
        qtbot, loop, bridge, history, story, fixtures, random_draft, monkeypatch, tmp_path):
    """Each setting the Sweep row offers, driven as a user would (choose it, type the values
    or pick a draft model with "…", Make lanes): the lanes carry the values, the worker runs
    them with exactly those settings (its Done echoes them), and the saved comparison's JSON
    and Markdown export name each lane's value."""
    from gui.settings import panel as sampling_panel
    from gui.compare.view import CompareView
    monkeypatch.setattr(sampling_panel, "choose_model_path", lambda *a, **k: str(random_draft))
    base = {"temperature": 0.8, "seed": 1, "max_new_tokens": 6}
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=[base])
    qtbot.addWidget(v)
    v.resize(1300, 760)
    v.show()
    qtbot.mouseClick(v.bar.sweep_button, Qt.LeftButton)
    keys = [v.sweep_row.param.itemData(i) for i in range(v.sweep_row.param.count())]
    assert sorted(keys) == sorted(k for k, *_ in SWEEPS)  # every knob, and nothing is left out here
    run(loop, bridge.load(str(fixtures / "stories260K.gguf"), device="cpu", dtype="float32"), 60)

    for key, typed, values, md_form in SWEEPS:
        values = [str(random_draft) if x == "DRAFT" else x for x in values]
        v.set_lanes([{**base, **({"constraint": values[0]} if key == "constraint" else {})}])
        v.sweep_row.param.setCurrentIndex(keys.index(key))
        assert v.sweep_row.browse_button.isVisible() == (key == "draft")
        v.sweep_row.values.clear()
        if typed is None:
            qtbot.mouseClick(v.sweep_row.browse_button, Qt.LeftButton)
            assert v.sweep_row.values.text() == f"off, {random_draft}"
        else:
            qtbot.keyClicks(v.sweep_row.values, typed)
        qtbot.mouseClick(v.sweep_row.apply_button, Qt.LeftButton)
        assert v.sweep_row.error.text() == "", (key, v.sweep_row.error.text())
        assert [c.settings()[key] for c in v.columns] == values, key
        if key == "draft":
            snapshot(v, "compare_draft_sweep")

        async def go():
            v.run()
            await until(lambda: not v.running, 60, f"the {key} sweep to run")
        run(loop, go(), 90)
        runs = [c.run for c in v.columns]
        assert all(r.finished and r.error is None for r in runs), (key, [r.error for r in runs])
        assert [r.params[key] for r in runs] == values, key  # what the worker ran
        js = json.loads(Path(v.export("json", str(tmp_path / f"{key}.json"))).read_text())
        saved = js["conversation"]["meta"]["comparison"]["lanes"]
        assert [ln["settings"][key] for ln in saved] == values, key
        md = Path(v.export("md", str(tmp_path / f"{key}.md"))).read_text()
        sections = md.split("## Lane ")[1:]
        for section, value in zip(sections, values):
            if key == "constraint":
                assert ("format regular expression" in section) == (value is not None)
            elif value or key not in ("lookup", "draft"):  # speculative decoding off: not named
                shown = ", ".join(value) if isinstance(value, list) else f"{value:g}" if isinstance(value, float) \
                    else value
                assert md_form.format(shown) in section, (key, value, section)
    assert [len(c.run.ids) for c in v.columns] == [6, 6]
