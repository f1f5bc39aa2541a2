"""Make lanes over lanes worth keeping: it asks (replace / add beside / cancel), and Undo
puts the lanes back whole (results, the branched lane, a ban, the baseline)."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from gui.compare.sweeper import at_stake
from gui.compare.view import CompareView

from tests.gui.compare.common import PROMPT, FakeBridge, history, snapshot, three_words  # noqa: F401  (fixtures)
from tests.gui.ui_helpers import ScriptedBridge, loop, run, until  # noqa: F401  (fixtures)


@pytest.fixture
def ran(qtbot, loop, history):
    """Two lanes that ran (three words each), a third branched from lane 1, a ban in lane 2."""
    v = CompareView(bridge=ScriptedBridge(three_words), history=history, prompt=PROMPT, mode="completion",
                    lanes=[{"temperature": 0.7, "seed": 1}, {"temperature": 1.2, "seed": 3}])
    qtbot.addWidget(v)
    v.resize(1300, 700)
    v.show()

    async def go():
        v.run()
        await until(lambda: not v.running, 10, "the run")
        v.branch_lane(0, 1, 77)
        await until(lambda: not v.running, 10, "the branch")

    run(loop, go(), 30)
    assert v.ban_in_lane(1, 1, 61)
    v.bar.baseline_combo.setCurrentIndex(1)
    assert v.lane_count() == 3 and v.columns[2].branch and all(c.run is not None for c in v.columns)
    v.asked = []
    v.sweep_row.ask = lambda stake, n, room: v.asked.append((stake, n, room)) or v.answer
    qtbot.mouseClick(v.bar.sweep_button, Qt.LeftButton)
    v.sweep_row.values.setText("0.1, 0.5")
    return v


def state(v):
    return [(c, c.run, c.settings()["logit_bias_text"], bool(c.branch)) for c in v.columns], v.baseline


def test_cancel_changes_nothing(ran, qtbot):
    before = state(ran)
    ran.answer = "cancel"
    qtbot.mouseClick(ran.sweep_row.apply_button, Qt.LeftButton)
    assert ran.asked == [("the 3 lanes here (3 with results, 1 branched)", 2, 5)]
    assert state(ran) == before and ran.sweep_row.undo_button.isHidden()


def test_add_beside_keeps_the_lanes_and_undo_removes_the_new_ones(ran, qtbot):
    before = state(ran)
    ran.answer = "add"
    qtbot.mouseClick(ran.sweep_row.apply_button, Qt.LeftButton)
    assert ran.lane_count() == 5 and state(ran)[0][:3] == before[0] and ran.baseline == 1
    assert [c.settings()["temperature"] for c in ran.columns[3:]] == [0.1, 0.5]
    assert [c.run for c in ran.columns[3:]] == [None, None] and "beside" in ran.status.text()
    assert ran.sweep_row.undo_button.isVisible()
    snapshot(ran, "compare_sweep_added_beside")
    qtbot.mouseClick(ran.sweep_row.undo_button, Qt.LeftButton)
    assert state(ran) == before and ran.sweep_row.undo_button.isHidden()
    assert "baseline" in ran.columns[1].title.text()


def test_replace_then_undo_brings_results_branch_and_ban_back(ran, qtbot):
    before = state(ran)
    saved = ran.save()
    ran.answer = "replace"
    qtbot.mouseClick(ran.sweep_row.apply_button, Qt.LeftButton)
    assert [c.settings()["temperature"] for c in ran.columns] == [0.1, 0.5]
    assert all(c.run is None and not c.branch for c in ran.columns) and ran.baseline == 0
    qtbot.mouseClick(ran.sweep_row.undo_button, Qt.LeftButton)
    assert state(ran) == before and ran.save() == saved  # the same saved comparison, not a new one
    assert [c.objectName() for c in ran.columns] == ["compareLane0", "compareLane1", "compareLane2"]
    assert all(c.isVisible() for c in ran.columns)


def test_add_beside_refused_when_the_lanes_would_not_fit(ran, qtbot):
    ran.answer = "add"
    assert not ran.apply_sweep("seed", "1:6") and "only 5 more lanes fit" in ran.sweep_row.error.text()
    assert ran.lane_count() == 3


def test_a_run_ends_undo(ran, qtbot, loop):
    ran.answer = "replace"
    assert ran.apply_sweep()

    async def go():
        ran.run()
        await until(lambda: not ran.running, 10, "the run")

    run(loop, go(), 30)
    assert ran.sweep_row.undo_button.isHidden() and not ran.sweeper.undo()


def test_nothing_at_stake_is_not_asked(qtbot, history):
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT, lanes=[{"temperature": 0.3}])
    qtbot.addWidget(v)
    v.sweep_row.ask = lambda *a: pytest.fail("asked with nothing at stake")
    assert v.apply_sweep("temperature", "0.1, 0.2, 0.3")  # one lane, no results: its settings are the base
    assert v.apply_sweep("top_k", "1, 5")  # the sweep's own lanes, untouched
    v.columns[1].fields["temperature"].setValue(1.5)  # the user's edit is at stake
    assert at_stake(v.columns, v.sweeper.made) == "the 2 lanes here"
    asked = []
    v.sweep_row.ask = lambda *a: asked.append(a) or "replace"
    assert v.apply_sweep("top_k", "2, 3") and asked == [("the 2 lanes here", 2, 6)]
