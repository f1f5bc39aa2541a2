"""Tools → MCP Servers…: the user's MCP servers, each with its status.

The list shows every server of ``mcp.json`` with what connecting it gave (connected with N
tools, failed and why, disabled); the form edits one: a command with its arguments and
environment (stdio), or a URL with its headers (streamable HTTP). "Paste JSON…" takes a
Claude Desktop / LM Studio ``mcpServers`` blob as it is. Every change is checked by
:mod:`core.tools.config` before it is saved (the error is said under the form, nothing is
written); connecting happens elsewhere, off the UI thread (``save(config)`` hands the
configuration back; :meth:`McpServersDialog.set_status` shows what connecting said).
"""
from __future__ import annotations

import html
import json
import shlex
from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout,
                               QInputDialog, QLabel, QLineEdit, QListWidget, QListWidgetItem, QPlainTextEdit,
                               QPushButton, QVBoxLayout, QWidget)

from core.errors import one_line
from core.tools.config import McpConfig, McpConfigError, ServerConfig, parse

STATE_TEXT = {"connecting": "connecting…", "disabled": "disabled", "connected": "connected", "failed": "failed"}


def status_line(status: dict | None) -> str:
    """A server's status in a few words: "connected · 3 tools", "failed: why"."""
    if not status:
        return "not connected"
    state = status.get("state", "")
    if state == "connected":
        n = int(status.get("tools") or 0)
        return f"connected · {n} tool{'s' if n != 1 else ''}"
    if state == "failed":
        return f"failed: {status.get('error') or 'unknown reason'}"
    return STATE_TEXT.get(state, state)


def _pairs(text: str, sep: str) -> dict[str, str]:
    """"KEY=VALUE" (or "Name: value") lines as a dict; blank lines skipped."""
    out = {}
    for line in text.splitlines():
        if line.strip():
            key, _, value = line.partition(sep)
            out[key.strip()] = value.strip()
    return out


class McpServersDialog(QDialog):
    """Add, edit, remove and paste MCP servers (objectName ``mcpServersDialog``).

    Args:
        config: the configuration as it is now.
        status: each server's status by name (``set_status`` updates it).
        save: ``save(config) -> bool``: write and reconnect (False: it said why elsewhere).

    Widgets (objectNames): ``mcpServerList``, ``mcpName``, ``mcpKind``, ``mcpCommand``,
    ``mcpArgs``, ``mcpEnv``, ``mcpUrl``, ``mcpHeaders``, ``mcpDisabled``, ``mcpAddButton``,
    ``mcpRemoveButton``, ``mcpPasteButton``, ``mcpApplyButton``, ``mcpProblem``.
    """

    def __init__(self, *, config: McpConfig, status: dict[str, dict], save, parent=None):
        super().__init__(parent)
        self.setObjectName("mcpServersDialog")
        self.setWindowTitle("MCP Servers")
        self.config, self.status, self._save = config, dict(status), save
        self.editing: str | None = None  # the server the form shows (None: a new one)
        lay = QVBoxLayout(self)
        intro = QLabel("Servers that give the model tools, prompts and resources (the <code>mcpServers</code> of "
                       "Claude Desktop and LM Studio). Turn a server on for a chat in Tools → Enable in This Chat.")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        body = QHBoxLayout()
        body.addLayout(self._build_list(), 2)
        body.addWidget(self._build_form(), 3)
        lay.addLayout(body, 1)
        self.problem = QLabel()
        self.problem.setObjectName("mcpProblem")
        self.problem.setWordWrap(True)
        self.problem.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.problem)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.resize(760, 440)
        self.refresh()

    def _build_list(self) -> QVBoxLayout:
        col = QVBoxLayout()
        self.list = QListWidget()
        self.list.setObjectName("mcpServerList")
        self.list.currentItemChanged.connect(lambda item, _old: self.show_server(item.data(Qt.UserRole) if item else None))
        col.addWidget(self.list, 1)
        row = QHBoxLayout()
        for name, text, slot in (("mcpAddButton", "Add", self.new_server), ("mcpRemoveButton", "Remove", self.remove),
                                 ("mcpPasteButton", "Paste JSON…", self.paste)):
            b = QPushButton(text)
            b.setObjectName(name)
            b.clicked.connect(slot)
            row.addWidget(b)
        col.addLayout(row)
        return col

    def _build_form(self) -> QWidget:
        box = QWidget()
        form = QFormLayout(box)
        self.name = QLineEdit(objectName="mcpName", placeholderText="weather")
        self.kind = QComboBox(objectName="mcpKind")
        self.kind.addItems(["Command (stdio)", "URL (streamable HTTP)"])
        self.command = QLineEdit(objectName="mcpCommand", placeholderText="npx")
        self.args = QLineEdit(objectName="mcpArgs", placeholderText="-y @modelcontextprotocol/server-filesystem /tmp")
        self.env = QPlainTextEdit(objectName="mcpEnv", placeholderText="KEY=value, one a line")
        self.url = QLineEdit(objectName="mcpUrl", placeholderText="https://example.com/mcp")
        self.headers = QPlainTextEdit(objectName="mcpHeaders", placeholderText="Authorization: Bearer …, one a line")
        self.disabled = QCheckBox("Disabled (kept, not started)", objectName="mcpDisabled")
        self.tools = QListWidget(objectName="mcpTools")  # what the server offers: a name, its schema on hover
        self.tools.setFixedHeight(84)
        self.state = QLabel(objectName="mcpState", wordWrap=True)
        self.state.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.state.setAlignment(Qt.AlignLeft | Qt.AlignTop)  # beside its label, not centred below it
        for w in (self.env, self.headers):
            w.setFixedHeight(64)
        rows = (("Name", self.name), ("Kind", self.kind), ("Command", self.command), ("Arguments", self.args),
                ("Environment", self.env), ("URL", self.url), ("Headers", self.headers), ("", self.disabled),
                ("Status", self.state), ("Tools", self.tools))
        for label, w in rows:
            form.addRow(label, w)
        self._form = form
        self.apply = QPushButton("Save", objectName="mcpApplyButton")
        self.apply.clicked.connect(self.save_form)
        form.addRow("", self.apply)
        self.kind.currentIndexChanged.connect(self._show_kind)
        return box

    def _show_kind(self, *_) -> None:
        http = self.kind.currentIndex() == 1
        for w, on in ((self.command, not http), (self.args, not http), (self.env, not http),
                      (self.url, http), (self.headers, http)):
            self._form.setRowVisible(w, on)

    # ------------------------------------------------------------------ showing

    def refresh(self) -> None:
        """The list anew from the configuration and the statuses (the selection kept)."""
        keep = self.editing
        self.list.blockSignals(True)
        self.list.clear()
        for name in self.config.servers:
            item = QListWidgetItem(f"{name} — {status_line(self.status.get(name))}")
            item.setToolTip(status_line(self.status.get(name)))
            item.setData(Qt.UserRole, name)
            self.list.addItem(item)
            if name == keep:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        if keep not in self.config.servers and self.list.count():
            self.list.setCurrentRow(0)
        else:
            self.show_server(keep if keep in self.config.servers else None)

    def set_status(self, name: str, status: dict) -> None:
        self.status[name] = dict(status)
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(Qt.UserRole) == name:
                item.setText(f"{name} — {status_line(status)}")
                item.setToolTip(status_line(status))  # a long failure reason, whole
        if name == self.editing:
            self.state.setText(status_line(status))
            self._show_tools(status)

    def _show_tools(self, status: dict | None) -> None:
        """The server's tools: "name — description", the parameters' JSON schema on hover."""
        self.tools.clear()
        for fn in (status or {}).get("listing") or []:
            item = QListWidgetItem(f"{fn['name']} — {fn.get('description') or 'no description'}")
            item.setToolTip("<pre>" + html.escape(json.dumps(fn.get("parameters") or {}, indent=2)[:4000], quote=False) + "</pre>")
            self.tools.addItem(item)

    def show_server(self, name: str | None) -> None:
        """Put server ``name`` in the form (None: an empty form for a new one)."""
        self.editing = name
        s = self.config.servers.get(name) if name else None
        s = s or ServerConfig("", command="")
        self.name.setText(s.name)
        self.kind.setCurrentIndex(1 if s.url else 0)
        self.command.setText(s.command)
        self.args.setText(shlex.join(s.args))
        self.env.setPlainText("\n".join(f"{k}={v}" for k, v in s.env.items()))
        self.url.setText(s.url)
        self.headers.setPlainText("\n".join(f"{k}: {v}" for k, v in s.headers.items()))
        self.disabled.setChecked(s.disabled)
        self.state.setText(status_line(self.status.get(name)) if name else "new server")
        self._show_tools(self.status.get(name) if name else None)
        self._show_kind()

    # ------------------------------------------------------------------ changing

    def form_server(self) -> ServerConfig:
        """The form as a server (McpConfigError when a field is wrong)."""
        old = self.config.servers.get(self.editing) if self.editing else None
        common = dict(disabled=self.disabled.isChecked(), extra=old.extra if old else {},
                      **({"timeout": old.timeout, "start_timeout": old.start_timeout} if old else {}))
        name = self.name.text().strip()
        if self.kind.currentIndex() == 1:
            obj = {"url": self.url.text().strip(), "headers": _pairs(self.headers.toPlainText(), ":")}
        else:
            try:
                args = shlex.split(self.args.text())
            except ValueError as e:
                raise McpConfigError(f"server '{name}': the arguments do not parse: {e}") from None
            obj = {"command": self.command.text().strip(), "args": args, "env": _pairs(self.env.toPlainText(), "=")}
        checked = ServerConfig.from_json(name, obj, source="the form")
        return replace(checked, **common)

    def _commit(self, config: McpConfig) -> bool:
        if not self._save(config):
            return False
        self.config = config
        self.problem.setText("")
        self.refresh()
        return True

    def save_form(self) -> bool:
        """Save the form as the server it shows (or a new one)."""
        try:
            server = self.form_server()
            config = self.config.with_server(server, old_name=self.editing)
        except McpConfigError as e:
            self.problem.setText(f"⚠ {one_line(e)}")
            return False
        self.editing = server.name
        return self._commit(config)

    def new_server(self) -> None:
        self.list.clearSelection()
        self.show_server(None)
        self.name.setFocus()

    def remove(self) -> bool:
        if self.editing is None or self.editing not in self.config.servers:
            return False
        name, self.editing = self.editing, None
        return self._commit(self.config.without(name))

    def paste(self) -> None:
        text, ok = QInputDialog.getMultiLineText(self, "Paste MCP Servers",
                                                 "A Claude Desktop / LM Studio configuration (mcpServers JSON):")
        if ok:
            self.add_json(text)

    def add_json(self, text: str) -> bool:
        """Add (or replace, by name) the servers of a pasted ``mcpServers`` blob."""
        try:
            pasted = parse(text, source="the pasted JSON")
            config = self.config
            for server in pasted.servers.values():
                config = config.with_server(server)
        except McpConfigError as e:
            self.problem.setText(f"⚠ {one_line(e)}")
            return False
        self.editing = next(iter(pasted.servers), self.editing)
        return self._commit(config)
