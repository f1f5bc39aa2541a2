"""The comparison window's controls: the prompt row (the prompt, its mode, the
conversation as context), the action bar (run, lanes, baseline, keeping it) and the
token inspector as lanes use it.

They lay out and name widgets; what each control does is the view's (it passes the
bar its slots by name).
"""
from __future__ import annotations

from typing import Callable

import shiboken6
from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtWidgets import (QCheckBox, QComboBox, QHBoxLayout, QLabel, QMenu, QPlainTextEdit,
                               QScrollArea, QToolButton, QVBoxLayout, QWidget)

from core.engine.lanes import MAX_LANES

from gui import theme
from gui.settings.widgets import guard_wheel
from gui.widgets.token_inspector import TokenInspector


def _button(text: str, name: str, tip: str, slot, icon: str | None = None) -> QToolButton:
    """A bar button: a tool button (as wide as its text: the style's 80 px push buttons made
    the bar wider than an 800 px screen), its icon beside the text."""
    b = QToolButton()
    b.setText(text)
    b.setObjectName(name)
    b.setAccessibleName(text.replace("&", "") or tip)
    b.setToolTip(tip)
    if icon:
        b.setIcon(theme.icon(icon))
        b.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
    b.clicked.connect(slot)
    return b


def _check(text: str, name: str, tip: str, slot) -> QCheckBox:
    c = QCheckBox(text)
    c.setObjectName(name)
    c.setToolTip(tip)
    c.toggled.connect(slot)
    return c


def _menu_button(text: str, name: str, tip: str, actions: list[tuple[str, Callable]] = (),
                 icon: str | None = None) -> QToolButton:
    """A tool button that opens a menu (of ``actions``, or filled as it opens)."""
    b = QToolButton()
    b.setText(text)
    b.setObjectName(name)
    b.setToolTip(tip)
    b.setPopupMode(QToolButton.InstantPopup)
    if icon:
        b.setIcon(theme.icon(icon))
        b.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
    menu = QMenu(b)
    for label, slot in actions:
        menu.addAction(label, slot)
    b.setMenu(menu)
    return b


def lane_inspector(token_text) -> TokenInspector:
    """The token inspector as a comparison uses it: a chosen alternative starts a new lane
    ("Continue with"), a ban edits the lane's logit bias for the next Run."""
    inspector = TokenInspector(token_text=token_text)
    inspector.ban_label = "Ban “{}” in this lane"
    inspector.ban_button.setToolTip("Add TEXT=-inf for the chosen token to this lane's logit bias "
                                    "(it takes effect at the next Run)")
    inspector.branch_button.setToolTip("A new lane with this lane's settings: its tokens up to here, "
                                       "then the chosen alternative, and the model carries on")
    inspector.set_can_branch(True)
    return inspector


class PromptRow(QWidget):
    """The prompt every lane answers (``prompt_edit``), its mode (``mode_combo``: chat or
    completion) and ``context_check``: send ``context``, the open conversation, before it;
    ``tools``: the functions a chat prompt offers (OpenAI-shaped; lanes' tool_choice says how)."""

    def __init__(self, prompt: str, mode: str, context: list[dict], parent=None, *, tools: list[dict] = ()):
        super().__init__(parent)
        self.tools = list(tools)
        top = QHBoxLayout(self)
        top.setContentsMargins(0, 0, 0, 0)
        self.prompt_edit = QPlainTextEdit(prompt)
        self.prompt_edit.setObjectName("comparePrompt")
        self.prompt_edit.setAccessibleName("Comparison prompt")
        self.prompt_edit.setPlaceholderText("The prompt every lane answers…")
        self.prompt_edit.setFixedHeight(64)
        top.addWidget(self.prompt_edit, 1)
        side = QVBoxLayout()
        self.mode_combo = QComboBox()
        self.mode_combo.setObjectName("compareModeCombo")
        self.mode_combo.setAccessibleName("Prompt mode")
        self.mode_combo.addItem("Chat", "chat")
        self.mode_combo.addItem("Completion", "completion")
        self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(mode)))
        self.mode_combo.setToolTip("Chat: the prompt is a user turn in the model's chat format. "
                                   "Completion: the model continues the text.")
        self.context_check = QCheckBox()
        self.context_check.setObjectName("compareContextCheck")
        self.context_check.setToolTip("Send the open conversation before the prompt (chat mode)")
        self.offer_context(context)
        side.addWidget(self.mode_combo)
        side.addWidget(self.context_check)
        side.addStretch(1)
        top.addLayout(side)
        guard_wheel(self)

    def offer_context(self, messages: list[dict]) -> None:
        """Offer ``messages`` as context (checked; the switch is hidden when there are none)."""
        self.context = list(messages)
        self.context_check.setText(f"Conversation as context ({len(messages)} messages)")
        self.context_check.setEnabled(bool(messages))
        self.context_check.setChecked(bool(messages))
        self.context_check.setVisible(bool(messages))

    def prompt(self, chat_format: str) -> dict:
        """The prompt as a run sends and a record keeps it: text, mode, chat format, and
        in chat mode the messages (the context when checked, then the prompt's turn)."""
        mode = self.mode_combo.currentData()
        d = {"text": self.prompt_edit.toPlainText(), "mode": mode, "chat_format": chat_format}
        if mode == "chat":
            msgs = list(self.context) if self.context_check.isChecked() else []
            if d["text"].strip():
                msgs.append({"role": "user", "content": d["text"]})
            d["messages"] = msgs
            if self.tools:
                d["tools"] = list(self.tools)
        return d

    def show_prompt(self, prompt: dict, context: list[dict]) -> None:
        """Show a saved comparison's prompt, mode, context and tools."""
        self.prompt_edit.setPlainText(str(prompt.get("text", "")))
        self.tools = [t for t in prompt.get("tools") or [] if isinstance(t, dict)]
        self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(prompt.get("mode", "chat"))))
        self.offer_context(context)


class ActionBar(QWidget):
    """Run / Stop / Re-run / New seeds, Add lane / Sweep… / Same seed, the baseline lane and
    the heatmap, Save / Saved / Export.

    Args:
        slots: what the controls do, by name: run, stop, rerun, new_seeds, add_lane,
            sweep (toggled), seed_lock (toggled), baseline (an index), heatmap (toggled),
            save, fill_saved (the Saved menu is about to show), export (with "md" or "json").
    """

    def __init__(self, slots: dict[str, Callable], parent=None):
        super().__init__(parent)
        self.run_button = _button("Run", "compareRunButton", "Run every lane (Ctrl+Enter)", slots["run"], "send")
        self.stop_button = _button("Stop", "compareStopButton", "Stop all lanes (Esc)", slots["stop"], "stop")
        self.rerun_button = _button("Re-run", "compareRerunButton", "Run again with exactly the settings and seeds "
                                    "of the results shown", slots["rerun"], "regenerate")
        self.reseed_button = _button("New seeds", "compareNewSeedsButton", "Run again with a fresh seed for every "
                                     "lane (one shared seed when locked)", slots["new_seeds"])
        self.add_button = _button("Add lane", "addLaneButton", "Add a lane (a copy of the last one)",
                                  slots["add_lane"], "new")
        self.sweep_button = _button("Sweep…", "sweepButton", "Make one lane per value of one setting", slots["sweep"])
        self.sweep_button.setCheckable(True)
        self.seed_lock = _check("Same seed", "seedLockCheck", "Give every lane lane 1's seed, so only the other "
                                "settings differ", slots["seed_lock"])
        self.baseline_combo = QComboBox()
        self.baseline_combo.setObjectName("baselineCombo")
        self.baseline_combo.setAccessibleName("Baseline lane")
        self.baseline_combo.setToolTip("The lane the others are compared with")
        self.baseline_combo.currentIndexChanged.connect(slots["baseline"])
        self.heatmap_check = _check("Heatmap", "heatmapCheck", "Shade each token by how surprising it was (1 − p): "
                                    "the darker, the less likely the pick", slots["heatmap"])
        self.save_button = _button("Save", "compareSaveButton", "Save this comparison in the history", slots["save"])
        self.saved_button = _menu_button("Saved", "compareSavedButton", "Reopen a saved comparison", icon="open")
        self.saved_menu = self.saved_button.menu()
        self.saved_menu.aboutToShow.connect(slots["fill_saved"])
        self.export_button = _menu_button("Export", "compareExportButton", "", [
            ("Markdown…", lambda: slots["export"]("md")), ("JSON…", lambda: slots["export"]("json"))], icon="export")
        self._lay_out()
        # Narrower than the bar with every label: the buttons with an icon show only it (their
        # tooltips say what they do), so the window still fits an 800 px screen.
        self._iconic = [self.run_button, self.stop_button, self.rerun_button, self.add_button, self.saved_button,
                        self.export_button]
        self._full_width = self.layout().sizeHint().width()
        self._set_compact(True)
        self._compact_width = self.layout().sizeHint().width()
        self._set_compact(False)

    def _set_compact(self, on: bool) -> None:
        for b in self._iconic:
            b.setToolButtonStyle(Qt.ToolButtonIconOnly if on else Qt.ToolButtonTextBesideIcon)
        self.layout().invalidate()

    @property
    def compact(self) -> bool:
        """The icon buttons show only their icons (the bar is too narrow for every label)."""
        return self.run_button.toolButtonStyle() == Qt.ToolButtonIconOnly

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt API)
        return QSize(self._compact_width, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        if self.compact != (self.width() < self._full_width):
            self._set_compact(not self.compact)

    def _lay_out(self) -> None:
        bar = QHBoxLayout(self)
        bar.setContentsMargins(0, 0, 0, 0)
        bar.setSpacing(6)
        base_label = QLabel("Baseline")
        base_label.setBuddy(self.baseline_combo)
        for w in (self.run_button, self.stop_button, self.rerun_button, self.reseed_button):
            bar.addWidget(w)
        bar.addSpacing(12)
        for w in (self.add_button, self.sweep_button, self.seed_lock):
            bar.addWidget(w)
        bar.addSpacing(12)
        for w in (base_label, self.baseline_combo, self.heatmap_check):
            bar.addWidget(w)
        bar.addStretch(1)
        for w in (self.save_button, self.saved_button, self.export_button):
            bar.addWidget(w)
        guard_wheel(self)  # a wheel over the baseline combo does not change the baseline

    def fill_saved(self, conversations: list, open_one: Callable[[int], None]) -> None:
        """The Saved menu: ``conversations`` (saved comparisons) to reopen with ``open_one``."""
        self.saved_menu.clear()
        if not conversations:
            self.saved_menu.addAction("No saved comparisons").setEnabled(False)
        for conv in conversations:
            self.saved_menu.addAction(conv.title, lambda cid=conv.id: open_one(cid))

    def set_baselines(self, lanes: int, baseline: int) -> None:
        """Offer lanes 1…``lanes`` as the baseline, ``baseline`` chosen (no signal)."""
        self.baseline_combo.blockSignals(True)
        self.baseline_combo.clear()
        for i in range(lanes):
            self.baseline_combo.addItem(f"Lane {i + 1}", i)
        self.baseline_combo.setCurrentIndex(baseline)
        self.baseline_combo.blockSignals(False)

    def set_state(self, running: bool, lanes: int, has_results: bool) -> None:
        """What can be pressed: while lanes run only Stop; Re-run, Save and Export need results."""
        for w, on in ((self.run_button, lanes > 0), (self.rerun_button, has_results), (self.reseed_button, lanes > 0),
                      (self.add_button, lanes < MAX_LANES), (self.sweep_button, True), (self.save_button, has_results),
                      (self.export_button, has_results), (self.seed_lock, True)):
            w.setEnabled(not running and on)
        self.stop_button.setEnabled(running)


class LanesRow(QHBoxLayout):
    """The lanes side by side, as tall as the area. Not height-for-width: QScrollArea then
    gives the row its preferred height at that width (547 px where 423 are shown at
    800x600: every lane's stats under the fold) instead of its minimum, which fits while
    the lanes' text boxes give way and scroll."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt API)
        return False


class LanesArea(QScrollArea):
    """The lane columns side by side (objectName ``compareLanes``), scrolled sideways
    when they do not fit. One lane added beside the lanes shown (a branch, Add lane,
    Duplicate) is scrolled into view once it is laid out, in one move; lanes replaced
    together (a sweep, Undo, a saved comparison) scroll nothing."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("compareLanes")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAsNeeded)
        self.host = QWidget()
        self.lanes = LanesRow(self.host)
        self.lanes.setContentsMargins(0, 0, 0, 0)
        self.lanes.setSpacing(6)
        self.setWidget(self.host)
        self._shown: list[QWidget] = []
        self._before: list[QWidget] | None = None  # the lanes shown before this round of changes

    def show_lanes(self, columns: list[QWidget]) -> None:
        """Lay ``columns`` out in this order (the ones no longer there are taken out)."""
        if self._before is None:  # the first change since the event loop last ran: compare after all of them
            self._before = list(self._shown)
            QTimer.singleShot(0, self, self._scroll_to_added)  # dropped if the window goes first
        self._shown = list(columns)
        while self.lanes.count():
            self.lanes.takeAt(0)
        for col in columns:
            self.lanes.addWidget(col, 1)
            col.show()  # a lane put back (Undo) was hidden when it was taken out

    def _scroll_to_added(self, tries: int = 20) -> None:
        before = self._before or []
        added = [c for c in self._shown if c not in before]
        col = added[0] if len(added) == 1 and before and all(c in self._shown for c in before) else None
        if col is not None and shiboken6.isValid(col) and tries and (
                not col.isVisible() or self.host.width() < col.geometry().right()):  # not laid out yet
            QTimer.singleShot(0, self, lambda: self._scroll_to_added(tries - 1))
            return
        self._before = None
        if col is not None and shiboken6.isValid(col):
            self.ensureWidgetVisible(col, 0, 0)
