"""The lane model picker without a comparison window: what a lane's model combo chooses,
a checkpoint opened beside the app's model (or found open already), a server asked for
with no dialog to ask it, and the held checkpoints handed back."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from PySide6.QtWidgets import QWidget

from gui.bridge import BridgeError
from gui.compare.lane_column import OPEN_CHECKPOINT, LaneColumn
from gui.compare.model_picker import LaneModelPicker
from gui.compare.models import LaneModel, ModelShelf


class Bridge:
    """hold() answers with ``info`` (or raises it); release() records the keys."""

    def __init__(self, info=None):
        self.info = info
        self.released: list[str] = []

    async def hold(self, path):
        if isinstance(self.info, Exception):
            raise self.info
        return self.info

    def release(self, key):
        self.released.append(key)


def picker_for(qtbot, bridge, models):
    window = QWidget()
    qtbot.addWidget(window)
    col = LaneColumn(settings={})
    qtbot.addWidget(col)
    shelf = ModelShelf(models)
    picker = LaneModelPicker(bridge, shelf, None, window, lambda: [col])
    col.set_models(shelf.models, shelf.models[0])
    chosen, status = [], []
    picker.chosen.connect(lambda c, m: chosen.append((c, m)))
    picker.status.connect(status.append)
    return picker, col, shelf, chosen, status


def test_a_lane_chooses_an_offered_model_or_one_already_open(qtbot, tmp_path):
    loaded = LaneModel("loaded", "story", path=str(tmp_path / "story.gguf"))
    twin = LaneModel("checkpoint", "twin", key=str(tmp_path / "twin.gguf"))
    picker, col, _shelf, chosen, _status = picker_for(qtbot, Bridge(), [loaded, twin])
    picker.choose(col, 1)
    assert chosen == [(col, twin)]
    # a path that is the loaded model or a held checkpoint: no second copy, nothing to wait for
    assert picker.open_checkpoint(col, str(tmp_path / "story.gguf")) is None
    assert picker.open_checkpoint(col, str(tmp_path / "twin.gguf")) is None
    assert chosen[1:] == [(col, loaded), (col, twin)]
    # "Other checkpoint…" that is cancelled chooses nothing, and the combo shows the lane's model
    picker.ask_checkpoint_path = lambda: None
    picker.choose(col, OPEN_CHECKPOINT)
    assert len(chosen) == 3 and col.model_combo.currentText() == "story"


def test_a_checkpoint_opens_beside_the_loaded_model_or_says_why_not(qtbot, tmp_path):
    loaded = LaneModel("loaded", "story")
    info = {"key": str(tmp_path / "other.gguf"), "name": "other", "tokenizer": "t2"}
    picker, col, shelf, chosen, status = picker_for(qtbot, Bridge(info), [loaded])

    async def opened(path):
        await picker.open_checkpoint(col, path)

    asyncio.run(opened(info["key"]))
    (_, model), = chosen
    assert model in shelf and (model.kind, model.key, model.tokenizer) == ("checkpoint", info["key"], "t2")
    assert status == ["Opening other.gguf for lane 1…", "Lane 1 runs on other (another tokenizer: compared by text)."]

    picker.bridge = Bridge(BridgeError("it does not fit"))
    asyncio.run(opened(str(tmp_path / "big.gguf")))
    assert len(chosen) == 1 and col.notice.text() == "Could not open big.gguf: it does not fit"
    assert status[-1] == "Could not open big.gguf."


def test_a_server_without_a_dialog_says_where_to_connect_and_held_checkpoints_go_back(qtbot):
    held = LaneModel("checkpoint", "twin", key="/m/twin.gguf")
    bridge = Bridge()
    picker, col, shelf, _chosen, _status = picker_for(qtbot, bridge, [LaneModel("loaded", "story"), held])
    assert picker.connect_server(col) is None
    assert "Connect to a server first" in col.notice.text()
    remote = SimpleNamespace(url="http://127.0.0.1:8000/v1", model="m", tokenizer_fingerprint="t1")
    first = picker.add_server(remote)
    assert picker.add_server(remote) is first and shelf.models.count(first) == 1  # once per server and model
    assert col.model_combo.findText(first.label()) >= 0  # offered to the lane
    picker.release_held()
    assert bridge.released == ["/m/twin.gguf"] and held.key == ""
