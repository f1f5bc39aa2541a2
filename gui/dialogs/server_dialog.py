"""Model → Connect to Server…: pick a model on an OpenAI-compatible server.

The dialog asks for a base URL and an optional API key, lists the server's models (its
``/v1/models``) and, once one is chosen, has the server probed for what it supports
(:meth:`core.remote.client.RemoteModel.probe`) and hands the connected model over through
``connected``. It only lays out and forwards: the calls and what is remembered are
:mod:`gui.dialogs.servers`'.
"""
from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout)

from gui.dialogs.servers import SavedServers, ServerController, normal_url


class ServerDialog(QDialog):
    """Connect to a server (objectName ``serverDialog``); open it with ``open()``.

    Signals:
        connected(object): the chosen model, a connected and probed
            :class:`core.remote.client.RemoteModel`; the dialog closes.
        forgotten(str): the user forgot the saved server with this URL.

    Widgets (objectNames): ``serverUrl`` (editable, the saved servers in its list),
    ``serverKey``, ``serverListButton`` (List Models), ``serverModels``,
    ``serverForgetButton``, ``serverStatus``, and the OK button (Use Model).
    """

    connected = Signal(object)
    forgotten = Signal(str)

    def __init__(self, *, saved: SavedServers, url: str = "", parent=None):
        super().__init__(parent)
        self.setObjectName("serverDialog")
        self.setAccessibleName("Connect to Server")
        self.setWindowTitle("Connect to Server")
        self.saved = saved
        self.controller = ServerController(saved, parent=self)
        lay = QVBoxLayout(self)
        intro = QLabel("Chat with a model on an OpenAI-compatible server: <code>python -m core serve</code>, "
                       "vLLM, llama.cpp's server, Ollama or LM Studio.")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        lay.addLayout(self._build_form(url))
        lay.addLayout(self._build_server_buttons())
        lay.addWidget(self._build_models(), 1)
        self.status = QLabel("")
        self.status.setObjectName("serverStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.status)
        lay.addWidget(self._build_dialog_buttons())
        self.rejected.connect(self.controller.cancel)
        self._connect_controller()
        self.resize(520, 420)
        self._update_buttons()

    # -- layout ------------------------------------------------------------------------------
    def _build_form(self, url: str) -> QFormLayout:
        form = QFormLayout()
        self.url = QComboBox()
        self.url.setObjectName("serverUrl")
        self.url.setAccessibleName("Server URL")
        self.url.setEditable(True)
        self.url.setInsertPolicy(QComboBox.NoInsert)
        self.url.lineEdit().setPlaceholderText("http://127.0.0.1:8000")
        self.url.setToolTip("The server's address, e.g. http://127.0.0.1:8000 or https://host/v1")
        for s in self.saved.servers():
            self.url.addItem(s["url"], s.get("model"))
        self.url.setCurrentText(url or (self.url.itemText(0) if self.url.count() else ""))
        self.url.currentTextChanged.connect(self._url_changed)
        self.key = QLineEdit()
        self.key.setObjectName("serverKey")
        self.key.setAccessibleName("API key")
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText("none")
        self.key.setToolTip("Sent as 'Authorization: Bearer KEY'. Kept in the app's settings for this "
                            "server only, never in chats or exports.")
        self.key.setText(self.saved.key(self.url.currentText().strip()))
        form.addRow("Server &URL", self.url)
        form.addRow("API &key", self.key)
        return form

    def _build_server_buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.list_button = QPushButton("&List Models")
        self.list_button.setObjectName("serverListButton")
        self.list_button.setToolTip("Ask the server for its models (GET /v1/models)")
        self.list_button.clicked.connect(self.list_models)
        self.forget_button = QPushButton("&Forget Server")
        self.forget_button.setObjectName("serverForgetButton")
        self.forget_button.setToolTip("Remove this server and its API key from the saved servers")
        self.forget_button.clicked.connect(self.forget)
        row.addWidget(self.list_button)
        row.addStretch(1)
        row.addWidget(self.forget_button)
        return row

    def _build_models(self) -> QListWidget:
        self.models = QListWidget()
        self.models.setObjectName("serverModels")
        self.models.setAccessibleName("Models on the server")
        self.models.itemDoubleClicked.connect(lambda *_: self.use_model())
        self.models.currentItemChanged.connect(lambda *_: self._update_buttons())
        return self.models

    def _build_dialog_buttons(self) -> QDialogButtonBox:
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.ok = self.buttons.button(QDialogButtonBox.Ok)
        self.ok.setText("&Use Model")
        self.ok.setObjectName("serverUseButton")
        self.buttons.accepted.connect(self.use_model)
        self.buttons.rejected.connect(self.reject)
        return self.buttons

    def _connect_controller(self) -> None:
        c = self.controller
        c.busyChanged.connect(lambda _on: self._update_buttons())
        c.statusChanged.connect(self._set_status)
        c.modelsChanged.connect(self._show_models)
        c.connected.connect(self._connected)
        c.forgotten.connect(self.forgotten)

    # -- state -------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.controller.busy

    def _update_buttons(self) -> None:
        url = self.url.currentText().strip()
        self.list_button.setEnabled(bool(url) and not self.busy)
        self.forget_button.setEnabled(self.saved.has(url) and not self.busy)
        self.ok.setEnabled(self.models.currentItem() is not None and not self.busy)
        self.url.setEnabled(not self.busy)
        self.key.setEnabled(not self.busy)

    def _url_changed(self, text: str) -> None:
        self.key.setText(self.saved.key(text.strip()))
        self.models.clear()
        self.status.setText("")
        self._update_buttons()

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setProperty("error", error)
        self.status.setStyleSheet("color: #c0392b;" if error else "")

    def _show_models(self, rows: list, pick: str) -> None:
        self.models.clear()
        for mid, tooltip in rows:
            item = QListWidgetItem(mid)
            item.setData(Qt.UserRole, mid)
            item.setToolTip(tooltip)
            self.models.addItem(item)
            if mid == pick:
                self.models.setCurrentItem(item)

    def _connected(self, remote) -> None:
        self.connected.emit(remote)
        self.accept()

    # -- actions ------------------------------------------------------------------------------
    def list_models(self) -> asyncio.Task | None:
        """Ask the server for its models (off the UI thread); fills ``serverModels``."""
        return self.controller.list_models(self.url.currentText(), self.key.text())

    def use_model(self) -> asyncio.Task | None:
        """Connect to the chosen model and probe the server (off the UI thread); then
        ``connected`` and the dialog closes. Until then the dialog says what it is doing."""
        item = self.models.currentItem()
        if item is None or self.busy:
            return None
        return self.controller.use_model(self.url.currentText(), self.key.text(), item.data(Qt.UserRole))

    def forget(self) -> None:
        """Remove the server in the URL box (and its key) from the saved servers."""
        url = self.url.currentText().strip()
        for i in reversed(range(self.url.count())):
            if normal_url(self.url.itemText(i)) == normal_url(url):
                self.url.removeItem(i)
        self.url.setCurrentText("")
        self.key.clear()
        self.controller.forget(url)
        self._update_buttons()
