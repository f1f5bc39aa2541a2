"""Branching in the comparison window: "Continue with X" from a lane's token adds a lane
that keeps the tokens before it and forces X (drafting lanes keep drafting), and "Ban X"
edits the lane's logit bias; each checked against the engine run directly."""
from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt

from core.engine.engine import Engine
from core.engine.events import Done as EngineDone
from core.engine.settings import SamplingParams
from gui.compare.view import CompareView

from tests.gui.compare.common import (PROMPT, bridge, history, load_and_run, snapshot, story,  # noqa: F401  (fixtures)
                                      three_words, token_text_of)
from tests.gui.ui_helpers import ScriptedBridge, loop, run, until  # noqa: F401  (fixtures)


def test_branch_from_a_lane_that_drafts_keeps_drafting_with_the_token_forced(
        qtbot, loop, bridge, history, story, fixtures, random_draft, tmp_path):
    """'Continue with X' from a lane with prompt lookup and from a lane with a draft model,
    through the real worker: each branch lane keeps its source's lookup or draft setting
    (shown in its editor, used by the worker, saved), keeps the source's tokens before the
    position, has X there, and continues as plain greedy decoding from X does."""
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


def test_branch_from_a_lane_token_adds_a_lane_and_ban_edits_the_lanes_bias(
        qtbot, loop, bridge, history, story, fixtures, tmp_path):
    """'Continue with X' in a lane's inspector, through the real worker: a new lane with the
    lane's settings keeps its tokens before the position, has X there (the prefix came from
    the KV cache: cached_tokens counted) and continues as an uncached engine does; its header
    and divergence say where it branched; it is saved and reopens as a branch. 'Ban X' adds
    X=-inf to that lane's bias, and the next Run never draws X there (the branch is forced again)."""
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

    check_branch_saved_and_reopened(qtbot, bridge, history, v, tmp_path, at, alt, token_text_of(tok))

    # Ban X in lane 2: a word-start token of its reply, banned by its text
    ban_and_run_again(qtbot, loop, v, tok)
    again = v.columns[2].run
    assert again.ids[:at] == base.ids[:at] and again.ids[at] == alt and again.ids == br.ids  # the same branch
    v.inspect_token(2, at)
    snapshot(v, "compare_branch")


def check_branch_saved_and_reopened(qtbot, bridge, history, v, tmp_path, at: int, alt: int, token_text) -> None:
    """Lane 3 of ``v``, branched from lane 1's token ``at`` with ``alt``: saved with the
    comparison (its source, point and kept tokens), reopened as a branch."""
    base, br = v.columns[0].run, v.columns[2].run
    js = json.loads(Path(v.export("json", str(tmp_path / "c.json"))).read_text())
    saved = js["conversation"]["meta"]["comparison"]["lanes"]
    assert saved[2]["branch"] == {"from_lane": 1, "at": at, "token_id": alt, "kept_tokens": base.ids[:at]}
    assert "branch" not in saved[0] and saved[2]["tokens"] == br.ids
    v2 = CompareView(bridge=bridge, history=history, token_text=token_text)
    qtbot.addWidget(v2)
    v2.open_comparison(v.saved_id)
    assert v2.columns[2].branch["at"] == at and v2.columns[2].branch_label.text() == "Branched from lane 1 at token 4"
    assert v2.columns[2].branch["kept"].ids == base.ids[:at]


def ban_and_run_again(qtbot, loop, v, tok) -> None:
    """'Ban X' on a word-start token of lane 2's reply (banned by its text): the lane's
    bias gains X=-inf and the next Run never draws X there."""
    lane2 = v.columns[1].run
    i, ban = next((i, t) for i, t in enumerate(lane2.tokens) if t.piece.startswith(" ") and len(t.piece) > 2
                  and tok.encode(t.piece[1:]) == [t.token_id])
    assert v.inspect_token(1, i) and v.inspector.select_row(ban.token_id)
    assert v.inspector.ban_button.text() == f"Ban “{v.inspector.text_of(ban.token_id)}” in this lane"
    qtbot.mouseClick(v.inspector.ban_button, Qt.LeftButton)
    assert v.columns[1].logit_bias() == [f"{ban.piece[1:]}=-inf"]

    async def wait():
        v.run()
        await until(lambda: not v.running, 60, "the run without it")
    run(loop, wait(), 90)
    assert ban.token_id not in v.columns[1].run.ids


def test_a_branched_lane_scrolls_into_view_in_one_move(qtbot, loop, history):
    """Issue 22 #17: the branch lane is added at the far right, out of sight; it is scrolled
    into view once laid out, in one move (the scrollbar never goes back or jumps about)."""
    v = CompareView(bridge=ScriptedBridge(three_words), history=history, prompt=PROMPT, mode="completion",
                    lanes=[{"temperature": 0.1 * i, "max_new_tokens": 8} for i in range(3)])
    qtbot.addWidget(v)
    v.resize(800, 600)
    v.show()

    async def runs(start):
        start()
        await until(lambda: not v.running, 10, "the lanes")

    run(loop, runs(v.run), 20)
    bar = v.scroll.horizontalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    bar.setValue(bar.maximum() // 3)
    start, seen = bar.value(), []
    bar.valueChanged.connect(seen.append)
    run(loop, runs(lambda: v.branch_lane(1, 1, 99)), 20)
    new, vp = v.columns[-1], v.scroll.viewport()
    assert new.branch is not None and new.branch["token_id"] == 99 and new.run is not None
    qtbot.waitUntil(lambda: 0 <= new.mapTo(vp, new.rect().topLeft()).x()
                    and new.mapTo(vp, new.rect().topRight()).x() <= vp.width(), timeout=2000)
    assert len(seen) == 1 and seen[0] > start, seen
    # Rendering it again (a heatmap, a token clicked) leaves the scrollbar where it is.
    v.bar.heatmap_check.setChecked(True)
    assert v.inspect_token(0, 1)
    assert len(seen) == 1 and bar.value() == seen[0]
    # A sweep builds all its lanes in one go: nothing scrolls for them.
    bar.setValue(0)
    v.set_lanes([{"temperature": t} for t in (0.2, 0.5, 0.9)])
    qtbot.wait(50)
    assert bar.value() == 0
