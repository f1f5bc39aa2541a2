"""The main window: conversations | transcript + prompt | sampling settings, menus, status bar.

It lays out the widgets and shows what its two controllers say: the
:class:`~gui.model_controller.ModelController` (which model replies come from) and the
:class:`~gui.chat.controller.ConversationController` (what the conversation becomes).
Its commands come from the table in :mod:`gui.actions`. The UI thread never waits on the
worker: loads and replies are asyncio tasks on the qasync loop, and their events update
the widgets as they arrive.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QApplication, QFileDialog, QMainWindow, QMenu, QMessageBox, QWidget

from core.history import export as chat_export
from core.history.records import HistoryError
from core.history.store import History
from core.remote.runner import public_url
from core.worker.protocol import GenerateRequest

from gui import actions, theme
from gui.chat.column import ChatColumn
from gui.chat.controller import ConversationController
from gui.chat.markdown import render_markdown
from gui.widgets.side_splitter import SideSplitter
from gui.widgets.stats import format_stats
from gui.chat.sidebar import ConversationSidebar
from gui.chat.tools_menu import ToolsMenu
from gui.compare.launch import compare_window_for
from gui.dialogs import model_dialog
from gui.dialogs.model_dialog import ModelInfoDialog
from gui.dialogs.server_dialog import ServerDialog
from gui.dialogs.servers import SavedServers
from gui.library.window import LibraryRoom
from gui.model_controller import ModelController, with_path
from gui.model_drop import ModelDrop
from gui.settings.panel import SamplingPanel
from gui.send_wait import SendWhenLoaded
from gui.settings.store import default_settings
from gui.status_bar import MainStatusBar
from gui.window_state import WindowState

APP_NAME = "LlamaDesk"
RECORD_PROBS_KEY = "chat/record_probs"
NO_MODEL_HINT = "No model loaded — open a .gguf file or a model folder with File → Open Model… (Ctrl+O), or drop it here."
# The empty transcript also links to Model → Library… (find, download and open models).
NO_MODEL_LINK = NO_MODEL_HINT + "<br><br><a href='library'>Get a model from the library…</a>"
#: under the prompt, beside the transcript's NO_MODEL_LINK: why Send is off, not the same words twice
NO_MODEL_SEND = "No model loaded: Send needs one (Ctrl+O opens one)."


class MainWindow(QMainWindow):
    """LlamaDesk's window (objectName ``mainWindow``).

    Signals:
        modelReady(dict): a model finished loading (its info).
        replyFinished(dict): a reply was written to the store (the transcript's message dict).
        busyChanged(bool): a reply started or ended.
    """

    modelReady = Signal(dict)
    replyFinished = Signal(dict)
    busyChanged = Signal(bool)
    compare_view = None  # the comparison window while it is open (see open_compare)

    def __init__(self, *, bridge, history: History | None = None, settings: QSettings | None = None,
                 model: str | None = None, device: str | None = None, dtype: str | None = None,
                 autoload: bool = True, parent=None):
        super().__init__(parent)
        self.setObjectName("mainWindow")
        self.setAccessibleName("mainWindow")
        self.bridge = bridge
        self.settings = settings if settings is not None else default_settings()
        # A damaged or unwritable store never stops the app: it is moved aside, or the
        # session keeps conversations in memory, and the notice says which (issue 12).
        self.history, self._history_notice = ((history, None) if history is not None
                                              else History.open_or_recover(History.default_path()))
        self.models = ModelController(bridge=bridge, settings=self.settings, device=device, dtype=dtype, parent=self)
        self.servers = SavedServers(self.settings)
        self._dialogs: list = []  # non-blocking dialogs kept alive while open
        self.context_length = 0

        self.setWindowIcon(theme.icon("app", theme.colors()["accent"]))
        self.drops = ModelDrop(self)  # a model dragged over the window: what a drop does, then loads it
        self.panel = SamplingPanel(settings=self.settings)  # the settings each reply is sent with
        # The conversation and its reply: the controller decides, the window shows.
        self.chats = ConversationController(bridge=bridge, history=self.history, models=self.models,
                                            settings=self.panel, parent=self)
        self.chats.attachments.use_settings(self.settings)  # retrieval choices kept across runs
        self.conversation = self.chats.conversation
        self.reply = self.chats.reply
        self._build()
        self.tools_menu = ToolsMenu(self)  # Tools: the chat's tools, MCP servers, prompts, options
        self._build_actions()
        self._sync_record_probs()
        self._wire_reply()
        self._wire_models()
        self.send_wait = SendWhenLoaded(self)  # Ctrl+Enter during a load: the message waits for it
        self.library = LibraryRoom(self, settings=self.settings, models=self.models)
        self.library.openRequested.connect(self.load_model)
        resume_error = self.library.resume_downloads()  # downloads a previous run left go on
        if resume_error:
            self.statusBar().showMessage(resume_error, 8000)
        self.conversation.listChanged.connect(self.sidebar.refresh)
        self.conversation.listChanged.connect(self._update_title)  # a rename shows at once
        self.conversation.pathChanged.connect(self._update_title)
        self.conversation.pathChanged.connect(self._status_from_path)
        self.conversation.currentChanged.connect(self._on_conversation_switched)
        self.sidebar.refresh()
        self.refresh_transcript()
        self.models.set_model(None)
        self.window_state = WindowState(self, self.settings)
        self.window_state.restore()  # size, splitter widths and the open chat of the last run
        # The first code block a reply shows loads pygments' lexers (~100-300 ms): do it
        # while the window opens, not in the middle of the first streamed reply.
        QTimer.singleShot(0, lambda: render_markdown("```python\nx = 1\n```"))
        self.prompt.focus()
        self.setFocusProxy(self.prompt.editor)
        if autoload:
            path = self.models.initial_model(model)
            if path:
                # Runs once the event loop does (tasks need a running loop).
                QTimer.singleShot(0, lambda: self.load_model(path))

    # ------------------------------------------------------------------ layout
    def _build(self) -> None:
        """Conversations | transcript and prompt | sampling settings, and the status bar."""
        self.splitter = SideSplitter(Qt.Horizontal)  # the chat keeps its share of a narrow window
        self.splitter.setObjectName("mainSplitter")
        self.splitter.setChildrenCollapsible(True)
        self.sidebar = ConversationSidebar(conversation=self.conversation)
        self.sidebar.openRequested.connect(self.open_conversation)
        self.sidebar.newRequested.connect(self.new_chat)
        self.sidebar.deleteRequested.connect(self.delete_current)
        self.panel.setMinimumWidth(240)
        for w in (self.sidebar, self._build_middle(), self.panel):
            self.splitter.addWidget(w)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setCollapsible(1, False)
        self.splitter.setSizes([230, 680, 290])
        self.setCentralWidget(self.splitter)
        self._build_status_bar()

    def _build_middle(self) -> QWidget:
        """The transcript (with the token inspector beside it), the notices and the prompt."""
        self.column = column = ChatColumn()
        column.attach(self.chats)  # the transcript and prompt show what the controller says
        self.chat, self.inspector, self.prompt = column.chat, column.inspector, column.prompt
        self.attach_bar = column.attach_bar
        self.send_notice, self.reply_notice = column.send_notice, column.reply_notice
        if self._history_notice:
            self.chat.set_notice(self._history_notice)
        self.chat.empty_hint.linkActivated.connect(lambda _link: self.open_library())
        self.chat.copied.connect(lambda t: self.statusBar().showMessage("Copied to the clipboard", 2000))
        self.send_notice.actionTriggered.connect(self.retry_send)
        self.reply_notice.actionTriggered.connect(self.retry_reply)
        self.prompt.sendRequested.connect(self.send)
        self.prompt.stopRequested.connect(self.stop)
        return column

    def _build_status_bar(self) -> None:
        self.status = MainStatusBar()
        self.setStatusBar(self.status)
        self.status.load_progress.cancelRequested.connect(self.models.cancel_load)

    def _build_actions(self) -> None:
        """Menus, toolbar and shortcuts, from the table in gui/actions.py."""
        self._actions, self._menus, self.toolbar = actions.build(self, checked={
            "compile": self.compile, "record_probs": self.settings.value(RECORD_PROBS_KEY, False, type=bool)})

    def action(self, name: str) -> QAction:
        """The QAction of command ``name`` in gui/actions.py's table."""
        return self._actions[name]

    def menu(self, name: str) -> QMenu:
        """A submenu of gui/actions.py's table by name ("recent", "device", "dtype", "theme")."""
        return self._menus[name]

    def show_conversations(self, on: bool) -> None:
        """View → Conversations: show or hide the list on the left."""
        self._show_pane(0, on)

    def show_settings_panel(self, on: bool) -> None:
        """View → Settings Panel: show or hide the sampling settings on the right."""
        self._show_pane(2, on)

    def set_record_probs(self, on: bool) -> None:
        self.settings.setValue(RECORD_PROBS_KEY, on)
        self._sync_record_probs()

    def _sync_record_probs(self) -> None:
        """Replies record token alternatives when asked and the backend can give them."""
        a = self._actions["record_probs"]
        self.chats.record_probs = a.isEnabled() and a.isChecked()

    def fill_devices(self, menu: QMenu) -> None:
        actions.fill_choices(menu, model_dialog.available_devices(), self.device, self.models.set_device,
                             name="device")

    def fill_dtypes(self, menu: QMenu) -> None:
        actions.fill_choices(menu, model_dialog.DTYPES, self.dtype, self.models.set_dtype, name="dtype")

    def fill_themes(self, menu: QMenu) -> None:
        actions.fill_choices(menu, ("system", "light", "dark"), str(self.settings.value("ui/theme", "system")),
                             self.set_theme, label=str.capitalize)

    def _show_pane(self, index: int, on: bool) -> None:
        sizes = self.splitter.sizes()
        w = self.splitter.widget(index)
        w.setVisible(on)
        if on and sizes[index] == 0:
            sizes[index] = 230 if index == 0 else 290
            self.splitter.setSizes(sizes)

    # ------------------------------------------------------------------ model
    def _wire_models(self) -> None:
        m = self.models
        m.switching.connect(self._stop_reply)
        m.loadStarted.connect(self._on_load_started)
        m.loadEnded.connect(self.status.load_progress.finish)
        m.loaded.connect(self.modelReady)
        m.modelChanged.connect(self._show_model)
        m.backendChanged.connect(self._on_backend_changed)
        m.failed.connect(self.show_error)
        m.message.connect(self.statusBar().showMessage)
        self.bridge.loadProgress.connect(self.status.load_progress.update_progress)
        self.reply.started.connect(lambda _view: self.status.begin_reply(m.compiling()))

    # What the model controller holds, read where the window and its tests look for it.
    info = property(lambda self: self.models.info, doc="the model replies come from (local or remote)")
    backend = property(lambda self: self.models.backend, doc="the RemoteModel replies come from, or None")
    recent = property(lambda self: self.models.recent)
    device = property(lambda self: self.models.device)
    dtype = property(lambda self: self.models.dtype)
    compile = property(lambda self: self.models.compile)

    def ask_model_path(self) -> str | None:
        """Ask the user for a model (a .gguf file or a folder); tests replace this method."""
        start = os.path.dirname(self.recent.last() or "") or str(Path.home())
        return model_dialog.ask_model(self, start)

    def open_model_dialog(self) -> None:
        path = self.ask_model_path()
        if path:
            self.load_model(path)

    def load_model(self, path: str) -> asyncio.Task:
        """Start loading a model (stopping a running reply); returns the task."""
        return self.models.load(path)

    def unload_model(self) -> None:
        self.stop()
        self.models.unload()

    def _stop_reply(self) -> None:
        if self.busy:
            self.stop()

    def _on_load_started(self, name: str) -> None:
        self.status.load_progress.start(name)
        self.status.model_status.setText(f"Loading {name}…")
        self.prompt.set_model_ready(False, f"Loading {name}…")
        self.chat.set_empty_hint(f"Loading {name}…")

    def open_server_dialog(self, url: str = "") -> ServerDialog:
        """Model → Connect to Server…: a non-blocking dialog; its model becomes the backend."""
        current = self.backend.url if self.backend is not None else ""
        dlg = ServerDialog(saved=self.servers, url=url or current, parent=self)
        dlg.connected.connect(self.use_remote)
        dlg.forgotten.connect(self.models.forget_server)
        self._open_dialog(dlg)
        return dlg

    def use_remote(self, remote) -> None:
        """Replies come from ``remote`` (a connected, probed core.remote.client.RemoteModel) from now on."""
        self.models.use_remote(remote)

    def use_local(self) -> None:
        """Model → Use Local Model: replies come from the model loaded here (if any) again."""
        self.models.use_local()

    def _on_backend_changed(self, remote) -> None:
        """Replies come from a server (``remote``) or the local model (None) now: the panel
        and View → Record Token Probabilities offer what that backend can do."""
        caps = remote.caps if remote is not None else None
        where = public_url(remote.url) if remote is not None else ""
        self.panel.set_capabilities(caps, where)
        lacks_top = caps is not None and not caps.top_logprobs
        self._actions["record_probs"].setEnabled(not lacks_top)
        self._actions["record_probs"].setToolTip(
            f"Not available with {where}: {caps.why.get('top_logprobs', 'no top_logprobs')}" if lacks_top
            else actions.RECORD_PROBS_TIP)
        self._actions["use_local"].setEnabled(remote is not None)
        self._actions["continue"].setEnabled(self.info is not None and remote is None and not self.busy)
        self._sync_record_probs()
        if remote is None:
            self.reply_notice.hide()

    def _show_model(self, info: dict | None) -> None:
        """The status bar, prompt, transcript and actions for the model replies come from."""
        ready = info is not None
        if ready:
            self.status.show_model(info)
            self.context_length = int(info.get("context_length") or 0)
            try:
                if self.context_length > 0:  # a server may not say its context length
                    self.panel.set_model_context(self.context_length)
            except Exception:
                pass
            self.chat.set_empty_hint("Start a conversation: type below and press Ctrl+Enter.")
        elif not self.models.loading:
            self.status.show_model(None)
            self.chat.set_empty_hint(NO_MODEL_LINK)
        self.prompt.set_model_ready(ready, None if ready else NO_MODEL_SEND)
        self.chat.set_can_generate(ready)
        for name in ("reload", "unload", "info", "regen", "continue"):
            self._actions[name].setEnabled(ready and not (name in ("regen", "continue") and self.busy)
                                           and (name != "continue" or self.chats.can_continue))
        if self.backend is not None:
            self._actions["reload"].setEnabled(self.models.local_info is not None)
            self._actions["unload"].setEnabled(self.models.local_info is not None)
        if not ready:
            self.context_length = 0
        self._status_from_path()
        self._update_title()

    def show_model_info(self) -> None:
        if self.info:
            dlg = ModelInfoDialog(info=self.info, parent=self)
            self._open_dialog(dlg)

    def fill_recent(self, menu: QMenu) -> None:
        """File → Recent Models, filled each time it opens."""
        actions.fill_recent(menu, self.recent.paths(), self.load_model, self.recent.clear)

    # ------------------------------------------------------------------ conversations
    def open_conversation(self, conv_id: int | None) -> None:
        """Open a conversation (None: a new chat); each chat keeps its own unsent draft."""
        try:
            text = self.chats.open(conv_id, draft=self.prompt.text(), editing=self.prompt.editing is not None)
        except HistoryError as e:
            self.show_error("Could not open the conversation", str(e))
            self.sidebar.refresh()
            return
        if text is not None:
            self.prompt.end_edit()
            self.prompt.set_text(text)

    def new_chat(self) -> None:
        self.open_conversation(None)
        self.prompt.focus()

    def confirm(self, title: str, text: str) -> bool:
        """Ask yes/no (a modal box, never called from a coroutine); tests replace it."""
        return QMessageBox.question(self, title, text) == QMessageBox.Yes

    def delete_current(self, conv_id: int | None = None) -> None:
        conv_id = conv_id if conv_id is not None else self.conversation.conv_id
        if conv_id is None:
            return
        title = self.history.conversation(conv_id).title
        if self.confirm("Delete chat", f"Delete “{title}” and all its messages?"):
            self.chats.delete_conversation(conv_id)

    def _on_conversation_switched(self) -> None:
        self.chat.set_notice(None)
        self.prompt.end_edit()
        self._status_from_path()
        self.sidebar.refresh()
        self._update_title()

    def _status_from_path(self) -> None:
        """The status bar for what is on screen: the shown reply version's stats, and the
        context used as the loaded model counts it (the reply's own count when it came from
        this model, else the worker counts the chat); nothing without a model."""
        if self.busy:  # a streaming reply owns the status bar
            return
        last = self.chats.last_reply()
        if self.info is None or last is None:
            self.status.show_context(0, self.context_length if self.info else 0)
            self.status.stats_label.setText("")
            return
        s = last.stats or {}
        counted_here = last.model_id == self.info.get("name")
        used = int(s.get("prompt_tokens", 0)) + int(s.get("generated_tokens", 0)) if counted_here else 0
        self.status.show_context(used, self.context_length)
        if not counted_here:
            self._recount()
        self.status.stats_label.setText(format_stats(self.conversation.view_message(last)))

    def _recount(self) -> None:
        """The last reply came from another model: the loaded one counts this chat itself."""
        conv = self.conversation.conv_id
        try:
            request = GenerateRequest(messages=self.conversation.request_messages(self.panel.system_prompt()),
                                      params=self.panel.params(), chat_format=self.panel.chat_format())
        except Exception:  # settings that cannot be sent: the count waits for the next reply
            return
        self.models.count(request, lambda n: self.status.show_context(n, self.context_length)
                          if conv == self.conversation.conv_id and not self.busy else None)

    def refresh_transcript(self) -> None:
        self.column.show_transcript()
        self._update_title()

    def _update_title(self) -> None:
        parts = [APP_NAME]
        if self.info:
            parts.append(str(self.info.get("name", "model")))
        if self.conversation.conv_id is not None:
            try:
                parts.insert(0, self.conversation.title())
            except HistoryError:
                pass
        self.setWindowTitle(" — ".join(parts))

    # ------------------------------------------------------------------ messages
    def _wire_reply(self) -> None:
        c, r = self.chats, self.reply
        c.status.connect(self.statusBar().showMessage)
        c.error.connect(self.show_error)
        c.retryOffered.connect(lambda message, kind: self.reply_notice.show_notice(f"⚠ {message}", kind))
        self.status.undo_notice.actionTriggered.connect(c.undo_delete)
        c.undoOffered.connect(self.status.undo_notice.show_notice)
        c.undoEnded.connect(self.status.undo_notice.hide)
        r.contextUsed.connect(self.status.show_context)
        r.rateChanged.connect(self.status.show_rate)
        r.finished.connect(self._on_reply_finished)
        r.failed.connect(self.show_error)
        r.saveFailed.connect(self._on_save_failed)
        r.textRepaired.connect(lambda text: self.statusBar().showMessage(text, 10000))
        c.busyChanged.connect(self._set_busy)  # a reply or its tool calls

    @property
    def busy(self) -> bool:
        return self.chats.busy

    def send(self, text: str) -> None:
        """Send the prompt box's text (a new turn, or the resend of an edited message)."""
        if self.chats.send(text, editing=self.prompt.editing):
            self.send_notice.hide()
            self.prompt.end_edit()
            self.prompt.clear()

    def retry_send(self) -> None:
        """Send again what the editor holds (after a message could not be saved)."""
        self.send(self.prompt.text())

    def _on_save_failed(self, message: str) -> None:
        self.send_notice.show_notice(message)
        self.send_notice.button.setFocus()

    def retry_reply(self) -> None:
        """Ask again for the reply that failed (a new version beside any partial one)."""
        if self.chats.can_retry:
            self.reply_notice.hide()
            self.chats.retry()

    def _on_reply_finished(self, view: dict) -> None:
        if view.get("id") is None:  # nothing came back: the transcript shows the error in its place
            return
        view = self.chats.finished_view(view)
        self.status.stats_label.setText(format_stats(view))
        s = view["stats"]
        self.status.show_context(int(s.get("prompt_tokens", 0)) + int(s.get("generated_tokens", 0)), self.context_length)
        if self.models.note_decode(s.get("decode")):
            # The first reply compiled (or fell back): the model's status says which path runs now.
            self.status.show_model(self.info)
        self.replyFinished.emit(view)

    def _set_busy(self, busy: bool) -> None:
        self.prompt.set_busy(busy)
        for name in ("regen", "continue", "send"):
            self._actions[name].setEnabled(not busy and (name == "send" or self.info is not None)
                                           and (name != "continue" or self.chats.can_continue))
        self.busyChanged.emit(busy)

    def stop(self) -> None:
        """Stop the running reply (what streamed so far is kept); cancel an edit otherwise."""
        if self.busy:
            self.chats.stop()
        elif self.prompt.editing is not None:
            self.prompt.end_edit()
            self.prompt.clear()

    def copy_last_reply(self) -> None:
        last = self.chats.last_reply()
        if last is not None:
            QGuiApplication.clipboard().setText(last.text)
            self.statusBar().showMessage("Last reply copied", 2000)

    # ------------------------------------------------------------------ files
    def ask_save_path(self, title: str, name: str, filt: str) -> str | None:
        """Where to save an export; tests replace this method."""
        path, _ = QFileDialog.getSaveFileName(self, title, str(Path.home() / name), filt)
        return path or None

    def ask_open_path(self, title: str, filt: str) -> str | None:
        """Which file to import; tests replace this method."""
        path, _ = QFileDialog.getOpenFileName(self, title, str(Path.home()), filt)
        return path or None

    def export_conversation(self, fmt: str) -> str | None:
        """File → Export as Markdown ("md") or JSON ("json"); returns the file written."""
        if self.conversation.conv_id is None:
            self.statusBar().showMessage("Nothing to export yet", 3000)
            return None
        name = chat_export.export_file_name(self.conversation.title(), fmt)
        title, filt = ("Export as Markdown", "Markdown (*.md)") if fmt == "md" else ("Export as JSON", "JSON (*.json)")
        path = self.ask_save_path(title, name, filt)
        if not path:
            return None
        try:
            self.conversation.export_file(path, fmt)
        except (OSError, HistoryError) as e:
            self.show_error("Export failed", str(e))
            return None
        self.statusBar().showMessage(f"Exported to {path}", 4000)
        return path

    def import_conversation(self) -> int | None:
        path = self.ask_open_path("Import Conversation", "JSON (*.json)")
        if not path:
            return None
        try:
            return self.conversation.import_file(path)
        except HistoryError as e:
            self.show_error("Import failed", with_path(path, str(e)))
            return None

    # ------------------------------------------------------------------ dialogs, theme, quit
    @property
    def dialogs(self) -> list:
        """The non-blocking dialogs open now (errors, server, model info)."""
        return list(self._dialogs)

    def _open_dialog(self, dlg) -> None:
        self._dialogs.append(dlg)
        dlg.finished.connect(lambda *_: self._dialogs.remove(dlg) if dlg in self._dialogs else None)
        dlg.open()

    def show_error(self, title: str, message: str) -> QMessageBox:
        """A non-blocking error box (safe inside coroutines); the app stays usable."""
        box = QMessageBox(QMessageBox.Warning, title, message, QMessageBox.Ok, self)
        box.setObjectName("errorDialog")
        box.setAccessibleName(title)
        self._open_dialog(box)
        return box

    def set_theme(self, mode: str) -> None:
        self.settings.setValue("ui/theme", mode)
        theme.apply(QApplication.instance(), mode)
        self.retheme()

    def retheme(self) -> None:
        """Re-tint icons and re-render the transcript for the current theme."""
        self.sidebar.new_button.setIcon(theme.icon("new"))
        self.prompt.stop_button.setIcon(theme.icon("stop"))
        self.prompt.send_button.setIcon(theme.icon("send", theme.colors()["accent_text"]))
        for name, icon in actions.icons().items():
            self._actions[name].setIcon(theme.icon(icon))
        if not self.busy:
            self.refresh_transcript()

    def open_library(self, tab: str = "library"):
        """Open (or raise) Model → Library… on ``tab`` (library, hub, downloads)."""
        return self.library.show(tab)

    def open_compare(self):
        """Open (or raise) the comparison window, seeded from the prompt, conversation and
        panel; the window owns it (``compare_view`` while it is open)."""
        view = self.compare_view
        if view is not None and not view.isHidden():
            view.raise_()
            view.activateWindow()
            return view
        view = self.compare_view = compare_window_for(self)
        view.destroyed.connect(lambda *_: setattr(self, "compare_view", None))
        self.window_state.track_compare(view)
        view.show()
        return view

    def closeEvent(self, event):
        """Quitting mid-reply: stop it, save what streamed, then close."""
        self.chats.close()
        self.tools_menu.close()
        self.models.close()
        for d in list(self._dialogs):
            d.close()
        self.library.close()  # downloads stop; their state is kept for the next start
        super().closeEvent(event)
