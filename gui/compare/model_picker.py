"""Which model a comparison lane runs on, as the lane's model combo asks: one of the
models offered, "Other checkpoint…" (opened beside the app's model through the bridge,
memory checked as for a load) or "Model on a server…" (the app's Connect to Server
dialog). It has no layout; the view applies what it picks."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from gui.bridge import BridgeError
from gui.compare.lane_column import CONNECT_SERVER, OPEN_CHECKPOINT, LaneColumn
from gui.compare.models import ModelShelf, tokenizers_match
from gui.settings import speculative


class LaneModelPicker(QObject):
    """Picks lane models for the comparison window ``window``.

    Args:
        bridge: the :class:`gui.bridge.Bridge` (``hold``, ``release``).
        shelf: the window's :class:`ModelShelf`.
        server_dialog: ``factory(parent) -> dialog`` whose ``connected(RemoteModel)`` signal gives
            a connected server's model; None: "Model on a server…" says where to connect.
        lanes: the window's lane columns now (a lane removed meanwhile is left alone).

    Signals:
        chosen(object, object): a :class:`LaneColumn` and the :class:`LaneModel` it runs on now.
        status(str): a status line (opening a checkpoint, and how it went).
    """

    chosen = Signal(object, object)
    status = Signal(str)

    def __init__(self, bridge, shelf: ModelShelf, server_dialog: Callable | None, window: QWidget,
                 lanes: Callable[[], list[LaneColumn]]):
        super().__init__(window)
        self.bridge, self.shelf, self.server_dialog, self.window = bridge, shelf, server_dialog, window
        self.lanes = lanes
        self._hold_tasks: set[asyncio.Task] = set()
        loaded_signal = getattr(bridge, "modelLoaded", None)
        if loaded_signal is not None:
            loaded_signal.connect(self._main_model_changed)

    def offer(self) -> None:
        """Show every lane the models it can run on now."""
        for col in self.lanes():
            col.set_models(self.shelf.models, col.model)

    def _main_model_changed(self, info: dict) -> None:
        """The app loaded another model: lanes on "the loaded model" now run on it."""
        self.shelf.follow_load(info)
        self.offer()

    def add_server(self, remote):
        """A connected :class:`core.remote.client.RemoteModel` as a lane model (once per
        server and model; a new one is offered to every lane)."""
        known = len(self.shelf.models)
        model = self.shelf.server(remote)
        if len(self.shelf.models) != known:
            self.offer()
        return model

    def choose(self, col: LaneColumn, index: int) -> None:
        """The lane's combo chose entry ``index`` (see :attr:`LaneColumn.modelChosen`)."""
        if index == OPEN_CHECKPOINT:
            col.set_models(self.shelf.models, col.model)  # the combo shows the lane's model until one opens
            path = self.ask_checkpoint_path()
            if path:
                self.open_checkpoint(col, path)
        elif index == CONNECT_SERVER:
            col.set_models(self.shelf.models, col.model)
            self.connect_server(col)
        elif 0 <= index < len(self.shelf.models):
            self.chosen.emit(col, self.shelf.models[index])

    def ask_checkpoint_path(self) -> str | None:
        """Which checkpoint a lane should run on (a file dialog; tests replace this)."""
        return speculative.choose_model_path(self.window, "Open a checkpoint for this lane")

    def open_checkpoint(self, col: LaneColumn, path: str) -> asyncio.Task | None:
        """Load ``path`` beside the app's model and run ``col`` on it; a failure is shown in
        the lane. Returns the task (None when the model is open already)."""
        known = self.shelf.known_checkpoint(path)
        if known is not None:  # the loaded model or one held already: no second copy
            self.chosen.emit(col, known)
            return None
        task = asyncio.ensure_future(self._hold(col, path))
        self._hold_tasks.add(task)
        task.add_done_callback(self._hold_tasks.discard)
        return task

    async def _hold(self, col: LaneColumn, path: str) -> None:
        name = Path(path).name
        col.show_notice("")
        self.status.emit(f"Opening {name} for lane {self.lanes().index(col) + 1}…")
        try:
            info = await self.bridge.hold(path)
        except BridgeError as e:
            if col in self.lanes():
                col.show_notice(f"Could not open {name}: {e}")
            self.status.emit(f"Could not open {name}.")
            return
        model = self.shelf.held(info)
        here = col in self.lanes()
        if here:
            self.chosen.emit(col, model)
        loaded = self.shelf.loaded()
        self.status.emit(f"Lane {self.lanes().index(col) + 1 if here else '?'} runs on {model.name}"
                         + ("" if loaded is None or tokenizers_match(model, loaded)
                            else " (another tokenizer: compared by text)") + ".")

    def connect_server(self, col: LaneColumn):
        """"Model on a server…": the app's Connect to Server dialog; the model it connects
        becomes the lane's. Without one, the lane says where to connect."""
        if self.server_dialog is None:
            col.show_notice("Connect to a server first (Model → Connect to Server…), then choose it here.")
            return None
        dlg = self.server_dialog(self.window)

        def connected(remote) -> None:
            if col in self.lanes():
                self.chosen.emit(col, self.add_server(remote))
        dlg.connected.connect(connected)
        dlg.open()  # window-modal, never a nested event loop
        return dlg

    def release_held(self) -> None:
        """Hand back the checkpoints held for the window's lanes (it is closing)."""
        release = getattr(self.bridge, "release", None)
        for m in self.shelf.models:
            if m.kind == "checkpoint" and m.key and release is not None:
                release(m.key)
                m.key = ""
