"""Comparison lanes that differ in grounding: none, the chat's attached files, a collection;
passages retrieved and retrieval mode; the lane's label says how it was grounded."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt

from core.documents import DocumentIndex, approx_tokens
from core.engine.settings import SamplingParams
from core.worker.protocol import CompareRequest
from gui.compare import grounding
from gui.compare.lane_column import LaneColumn
from gui.compare.models import ModelShelf
from gui.compare.runner import ComparisonRunner, LaneJob, plan
from core.history.store import History
from gui.compare.view import CompareView
from tests.gui.compare.common import three_words
from tests.gui.compare.test_runner import LOADED, Bridge, recorder, words
from tests.gui.ui_helpers import ScriptedBridge, loop, run, until  # noqa: F401 (fixtures)

QUESTION = "Where does the blue watering can stand?"
NOTES = "# Garden\n\nThe blue watering can stands behind the shed.\n\nTomatoes need sun every day.\n"


@pytest.fixture
def source(tmp_path):
    (tmp_path / "notes.md").write_text(NOTES)
    ix = DocumentIndex(tmp_path / "h.sqlite3")
    src = SimpleNamespace(files=[SimpleNamespace(path=str(tmp_path / "notes.md"), state="ready")], index=ix,
                          count_tokens=lambda: approx_tokens)
    yield src
    ix.close()


def job(n: int, documents=None) -> LaneJob:
    return LaneJob(n, LOADED, SamplingParams(seed=n), documents=documents)


def test_lanes_grounded_alike_share_a_request_others_get_their_own():
    attached = {"documents": "attached", "k": 0, "mode": "bm25"}
    jobs = [job(1), job(2, attached), job(3), job(4, dict(attached)), job(5, {**attached, "k": 3})]
    assert [g.lanes for g in plan(jobs)] == [[0, 2], [1, 3], [4]]
    assert grounding.spec_key({"documents": "none", "k": 5}) == ()


def test_each_lane_is_sent_its_own_grounding_and_says_how(source, monkeypatch):
    monkeypatch.setattr(grounding, "SOURCE", source)
    bridge = Bridge(words)
    runner = ComparisonRunner(bridge, ModelShelf([LOADED]))
    seen = recorder(runner)
    jobs = [job(1), job(2, {"documents": "attached", "k": 0, "mode": "bm25"}),
            job(3, {"documents": "collection:/nowhere", "k": 2, "mode": "bm25"}),
            job(4, {"documents": "attached", "k": 0, "mode": "dense"})]
    base = CompareRequest(messages=[{"role": "user", "content": QUESTION}], mode="chat")
    failed = asyncio.run(runner.run(base, jobs))
    # lane 1 as asked; lanes 2 and 4 grounded (a whole file needs no retrieval, dense or not)
    assert len(bridge.requests) == 3
    assert bridge.requests[0].messages[-1]["content"] == QUESTION
    for r in bridge.requests[1:]:
        grounded = r.messages[-1]["content"]
        assert "behind the shed" in grounded and grounded.endswith(f"Question: {QUESTION}")
    assert jobs[0].run.grounding == "" and jobs[1].run.grounding.endswith("read in full")
    assert "dense" in jobs[3].run.grounding
    assert jobs[1].run.stop_reason == jobs[3].run.stop_reason == "length" and jobs[2].run.error
    assert seen["failed"] == [(3, "documents: /nowhere is not an indexed collection (index it first)"
                                  " — press Run to try again.")]
    assert len(failed) == 1


def test_lane_column_offers_the_chats_documents_and_labels_its_grounding(qtbot, source, monkeypatch):
    monkeypatch.setattr(grounding, "SOURCE", source)
    col = LaneColumn(settings=SamplingParams().to_dict())
    qtbot.addWidget(col)
    col.show()
    docs = col.documents
    assert [docs.source.itemData(i) for i in range(docs.source.count())] == ["none", "attached"]
    assert docs.spec() is None and not docs.k.isEnabled()
    docs.set_spec({"documents": "attached", "k": 4, "mode": "hybrid"})
    assert docs.spec() == {"documents": "attached", "k": 4, "mode": "hybrid", "embedder": "wordllama"}
    assert docs.k.isEnabled() and docs.mode.currentText() == "hybrid"  # the built-in model, said in its tip
    assert docs.mode.itemData(docs.mode.currentIndex(), Qt.ToolTipRole) == "hybrid · WordLlama"
    assert "top 4 · hybrid · WordLlama: 4 of 9" in grounding.describe(docs.spec(), "4 of 9 passages used")
    # the embedding model is picked with the mode; lanes differing only in it are not grouped
    docs.mode.setCurrentIndex(docs.mode.findText("dense · bge"))
    assert docs.spec()["embedder"] == "bge-small" and docs.spec()["mode"] == "dense"
    assert grounding.spec_key(docs.spec()) != grounding.spec_key({**docs.spec(), "embedder": "wordllama"})
    docs.set_spec({"documents": "attached", "k": 4, "mode": "bm25"})
    assert "embedder" not in docs.spec() and docs.mode.currentText() == "BM25"
    assert grounding.describe(None) == "No documents"


def replace_second_word(ev):
    from dataclasses import replace
    if type(ev).__name__ == "Chunk":
        toks = [replace(t, token_id=99, text=" shed", piece=" shed") if t.index == 1 else t for t in ev.tokens]
        return replace(ev, text="".join(t.text for t in toks), tokens=toks)
    return replace(ev, tokens=[99 if i == 1 else t for i, t in enumerate(ev.tokens)], text="a shed c")


def test_view_labels_where_a_grounded_lane_parts_from_an_ungrounded_one(qtbot, loop, source, monkeypatch, tmp_path):
    monkeypatch.setattr(grounding, "SOURCE", source)
    history = History(tmp_path / "c.sqlite3")
    async def script(request, stream):  # a grounded question gets another second word
        async for ev in three_words(request, stream):
            if "Question:" in request.messages[-1]["content"] and type(ev).__name__ in ("Chunk", "Done"):
                ev = replace_second_word(ev)
            yield ev
    bridge = ScriptedBridge(script)
    v = CompareView(bridge=bridge, history=history, prompt=QUESTION, mode="chat",
                    lanes=[SamplingParams(seed=1).to_dict(), SamplingParams(seed=2).to_dict()])
    qtbot.addWidget(v)
    v.resize(1200, 700)
    v.show()
    v.columns[1].documents.set_spec({"documents": "attached", "k": 0, "mode": "bm25"})
    task = v.run()
    run(loop, until(lambda: task.done(), 20, "the run"))
    assert len(bridge.requests) == 2 and "behind the shed" in bridge.requests[1].messages[-1]["content"]
    assert [c.run.text for c in v.columns] == ["a b c", "a shed c"]
    label = v.columns[1].divergence.text()
    assert "Diverges at token 2" in label and "Grounding: Attached files" in label and "read in full" in label
    v.grab().save("/tmp/docsgui-compare.png")
    # a branch of the grounded lane is grounded alike: its kept tokens answered that prompt
    task = v.branch_lane(1, 1, 77)
    run(loop, until(lambda: task.done(), 20, "the branch"))
    assert v.columns[2].documents.spec() == v.columns[1].documents.spec()
    assert bridge.requests[-1].messages == bridge.requests[1].messages and bridge.requests[-1].forced == [77]
    # saved, exported and opened again: each lane keeps its documents and how it was grounded
    spec, how = v.columns[1].documents.spec(), v.columns[1].run.grounding
    md = v.export("md", str(tmp_path / "c.md"))
    data = json.loads(open(v.export("json", str(tmp_path / "c.json"))).read())
    assert f"> Documents: {how}" in open(md).read() and "read in full" in how
    lanes = json.dumps(data, ensure_ascii=False)
    assert '"documents": {"documents": "attached"' in lanes and how in lanes
    again = CompareView(bridge=bridge, history=history, prompt="", mode="chat", lanes=[SamplingParams().to_dict()])
    qtbot.addWidget(again)
    again.open_comparison(v.saved_id)
    assert [c.documents.spec() for c in again.columns] == [None, spec, spec]
    assert again.columns[1].run.grounding == how and "Grounding: Attached files" in again.columns[1].divergence.text()
    history.close()
