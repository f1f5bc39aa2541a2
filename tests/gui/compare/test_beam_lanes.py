"""Beam search as a comparison lane's setting: a sweep over beams, what a beam lane turns
off, a run on the real worker whose beam lane is the engine's beam search, and a server
lane refused before anything runs."""
from __future__ import annotations

from PySide6.QtCore import Qt

from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.settings import SamplingParams
from gui.compare.models import LaneModel
from gui.compare.runner import BEAMS_ON_SERVER, LaneJob, refusals
from gui.compare.view import CompareView

from tests.gui.compare.common import PROMPT, FakeBridge, bridge, history, snapshot, story  # noqa: F401  (fixtures)
from tests.gui.ui_helpers import loop, run, until  # noqa: F401  (fixtures)


def test_a_sweep_over_beams_makes_beam_lanes(qtbot, loop, history):
    v = CompareView(bridge=FakeBridge(), history=history, prompt=PROMPT,
                    lanes=[{"temperature": 0.7, "seed": 3, "logit_bias_text": ["dog=-inf"]}])
    qtbot.addWidget(v)
    assert "num_beams" in [v.sweep_row.param.itemData(i) for i in range(v.sweep_row.param.count())]
    assert v.apply_sweep("num_beams", "1, 2, 4")
    assert [s["num_beams"] for s in v.lane_settings()] == [1, 2, 4]
    assert all(s["temperature"] == 0.7 for s in v.lane_settings())
    first, beams = v.columns[0].fields, v.columns[2].fields
    assert first["temperature"].isEnabled() and not first["length_penalty"].isEnabled()
    assert not beams["temperature"].isEnabled() and not beams["seed"].isEnabled() and beams["length_penalty"].isEnabled()
    assert "Beam search (4 beams)" in beams["temperature"].toolTip()
    # what beam search refuses is off in a beam lane and left out of its settings, kept in its field
    assert not v.columns[2].bias_edit.isEnabled() and not v.columns[2].speculative.combo.isEnabled()
    assert v.lane_settings()[2]["logit_bias_text"] == [] and v.columns[2].bias_edit.text() == "dog=-inf"
    assert v.lane_settings()[0]["logit_bias_text"] == ["dog=-inf"] and v.columns[0].bias_edit.isEnabled()
    SamplingParams.from_dict(v.lane_settings()[2]).validate()
    assert not v.apply_sweep("num_beams", "0, 2") and "from 1 (off) to 16" in v.sweep_row.error.text()
    assert v.apply_sweep("length_penalty", "-1, 0, 2")
    assert [s["length_penalty"] for s in v.lane_settings()] == [-1.0, 0.0, 2.0]


def test_a_beam_lane_runs_the_engines_beam_search(qtbot, loop, bridge, history, story, fixtures):
    lanes = [{"temperature": 0.0, "max_new_tokens": 12}, {"num_beams": 3, "max_new_tokens": 12, "length_penalty": 0.0}]
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion", lanes=lanes)
    qtbot.addWidget(v)
    v.resize(1000, 700)
    v.show()

    async def go():
        await bridge.load(str(fixtures / "stories260K.gguf"), device="cpu", dtype="float32")
        qtbot.mouseClick(v.bar.run_button, Qt.LeftButton)
        await until(lambda: not v.running, 60, "the comparison to finish")
    run(loop, go(), 90)
    eng = Engine(story.model, story.tokenizer, stop_ids=story.stop_ids)
    prompt = story.tokenizer.encode(PROMPT, bos=True)
    ref = [e for e in eng.generate(prompt, SamplingParams(num_beams=3, max_new_tokens=12, length_penalty=0.0))
           if isinstance(e, Done)][0]
    greedy = [e for e in eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=12)) if isinstance(e, Done)][0]
    beam_run = v.columns[1].run
    assert beam_run.finished and beam_run.ids == ref.tokens and beam_run.text == ref.text
    assert v.columns[0].run.ids == greedy.tokens
    assert beam_run.params["num_beams"] == 3 and "beam 1 of 3" in v.columns[1].stats.text()
    snapshot(v, "compare_beam_lane")


def test_a_beam_lane_on_a_server_is_refused_before_it_runs():
    """Even LlamaDesk's serve (which takes extension fields) runs no beam search."""
    server = LaneModel("server", "srv", remote=type("Remote", (), {"is_llamadesk": True})())
    local = LaneModel("loaded", "stories260K")
    jobs = [LaneJob(1, server, SamplingParams(num_beams=2)), LaneJob(2, server, SamplingParams()),
            LaneJob(3, local, SamplingParams(num_beams=2))]
    notices, line = refusals(jobs)
    assert notices == {0: BEAMS_ON_SERVER} and line == "Settings: lane 1 runs beam search on a server"
