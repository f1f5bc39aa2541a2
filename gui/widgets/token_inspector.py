"""The token inspector: one generated token's probability and its top alternatives,
before and after its lane's temperature / top-k / top-p / min-p filtering.

It only shows numbers the engine computed (the Token events' ``top``); it never touches
the model. Token ids are turned into text with a ``token_text`` callable when one is
given, else with the pieces seen in the lanes so far.
"""
from __future__ import annotations

import html
import math
from typing import Callable

from PySide6.QtCore import QRect, Qt, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (QFrame, QHeaderView, QLabel, QPushButton, QStyledItemDelegate,
                               QTableWidget, QTableWidgetItem, QVBoxLayout)

from gui import theme

PROB_ROLE = Qt.UserRole + 1
NAME_WIDTH = 90  # px of a token's name in the action buttons' text


def _visible(piece: str) -> str:
    """A token's text with its spaces and line breaks made visible."""
    if piece == "":
        return "∅"
    return piece.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥")


def fmt_prob(p: float | None) -> str:
    if p is None:
        return "–"
    if p == 0:
        return "cut"
    return f"{100 * p:.2f}%" if p >= 0.0001 else f"{100 * p:.1e}%"


def inspector_rows(top: dict | None, chosen_id: int) -> list[dict]:
    """Rows for a token's alternatives: ``{"id", "raw", "filtered", "chosen", "constrained"}``.

    Ids come from both lists, ordered by raw probability. A token missing from the
    filtered list has probability 0 after filtering when that list is shorter than the
    raw one (the filters cut it), else its value is unknown (None). An empty filtered
    list means nobody said (a server reports only the model's probabilities): unknown.
    ``constrained``: the lane's output constraint (JSON schema, regex, grammar) removed it
    (probability 0).
    """
    if not top:
        return []
    raw = {int(i): float(p) for i, p in top.get("raw", [])}
    filt = {int(i): float(p) for i, p in top.get("filtered", [])}
    removed = {int(i) for i in top.get("constrained") or ()}
    cut_known = bool(filt) and len(filt) < len(raw)
    order = sorted(raw, key=lambda i: -raw[i]) + [i for i in sorted(filt, key=lambda i: -filt[i]) if i not in raw]
    rows = []
    for i in order:
        f = 0.0 if i in removed else filt.get(i, 0.0 if cut_known else None)
        rows.append({"id": i, "raw": raw.get(i), "filtered": f, "chosen": i == chosen_id, "constrained": i in removed})
    return rows


class _BarDelegate(QStyledItemDelegate):
    """Draws a probability cell as a bar behind its text."""

    def paint(self, painter: QPainter, option, index) -> None:
        p = index.data(PROB_ROLE)
        if isinstance(p, float) and p > 0:
            c = QColor(theme.colors()["accent"])
            c.setAlpha(70)
            r: QRect = option.rect.adjusted(2, 3, -2, -3)
            r.setWidth(max(2, round(r.width() * min(p, 1.0))))
            painter.fillRect(r, c)
        super().paint(painter, option, index)


class TokenInspector(QFrame):
    """Side panel for one token (objectName ``tokenInspector``).

    The compare view and the chat transcript call :meth:`show_token` and :meth:`clear`.
    With :attr:`can_branch` set (the chat), a row of the table can be chosen and acted on.

    Signals:
        branchRequested(int, int, int): continue from the shown token with the chosen
            alternative instead: lane (or message id), token index, the alternative's id.
        banRequested(int, int, int): the same token, generated again with the chosen row's
            token banned.

    Attributes:
        rows: the alternatives now shown (see :func:`inspector_rows`), for tests and
            accessibility tools.
    """

    branchRequested = Signal(int, int, int)
    banRequested = Signal(int, int, int)

    def __init__(self, *, token_text: Callable[[int], str | None] | None = None, parent=None):
        super().__init__(parent)
        self.setObjectName("tokenInspector")
        self.setAccessibleName("Token inspector")
        self.setFrameShape(QFrame.StyledPanel)
        self.token_text = token_text
        self.known: dict[int, str] = {}  # id -> piece, learned from streamed tokens
        self.rows: list[dict] = []
        self.current: tuple[int, int] | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.setSpacing(6)
        self.title = QLabel("Token inspector")
        self.title.setObjectName("inspectorTitle")
        self.title.setStyleSheet("font-weight: 600;")
        self.summary = QLabel("Hover or click a generated token to see how likely it was "
                              "and what else the model considered.")
        self.summary.setObjectName("inspectorSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.table = self._table()
        # A reply offered tools: at its first token, calling vs. answering; at a tool's name,
        # which tools the alternatives begin (gui.widgets.tool_odds).
        self.tool_odds = QLabel()
        self.tool_odds.setObjectName("inspectorToolOdds")
        self.tool_odds.setWordWrap(True)
        self.tool_odds.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.tool_odds.hide()
        self.note = QLabel()
        self.note.setObjectName("inspectorNote")
        self.note.setWordWrap(True)
        self.note.setStyleSheet(f"color: {theme.colors()['muted']};")
        # Branching: pick a row, then continue with it or ban it (the chat sets can_branch).
        self.can_branch = False
        self.ban_label = "Ban “{}” and retry"  # the comparison's ban edits a lane instead
        self.actions = self._actions_row()
        self.actions.hide()
        self.table.itemSelectionChanged.connect(self._update_actions)
        self.table.cellDoubleClicked.connect(lambda r, c: self._act(self.branchRequested))
        lay.addWidget(self.title)
        lay.addWidget(self.summary)
        lay.addWidget(self.tool_odds)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.actions)
        lay.addWidget(self.note)
        self.setMinimumWidth(230)

    def _table(self) -> QTableWidget:
        """The alternatives: token, the model's probability, the probability after filters."""
        table = QTableWidget(0, 3)
        table.setObjectName("inspectorTable")
        table.setHorizontalHeaderLabels(["token", "model", "after filters"])
        table.verticalHeader().setVisible(False)
        table.setEditTriggers(QTableWidget.NoEditTriggers)
        table.setSelectionMode(QTableWidget.NoSelection)
        table.setShowGrid(False)
        table.setFocusPolicy(Qt.NoFocus)
        h = table.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.Stretch)
        h.setSectionResizeMode(1, QHeaderView.ResizeToContents)
        h.setSectionResizeMode(2, QHeaderView.ResizeToContents)
        table.setItemDelegateForColumn(1, _BarDelegate(table))
        table.setItemDelegateForColumn(2, _BarDelegate(table))
        return table

    def _actions_row(self) -> QFrame:
        """"Continue with this" and "Ban and retry" for the chosen row (shown with can_branch)."""
        actions = QFrame(self)
        actions.setObjectName("inspectorActions")
        # One above the other: side by side, "Ban “…” in this lane" was cut in a 270 px panel.
        al = QVBoxLayout(actions)
        al.setContentsMargins(0, 0, 0, 0)
        al.setSpacing(6)
        self.branch_button = QPushButton("Continue with this")
        self.branch_button.setObjectName("branchButton")
        self.branch_button.setToolTip("A new version of the reply: the same text up to this token, then the "
                                      "chosen alternative, and the model carries on from there")
        self.ban_button = QPushButton("Ban and retry")
        self.ban_button.setObjectName("banButton")
        self.ban_button.setToolTip("A new version of the reply from this token, with the chosen token "
                                   "banned (never generated) for the rest of it")
        for b in (self.branch_button, self.ban_button):
            b.setAccessibleName(b.toolTip())
            al.addWidget(b)
        self.branch_button.clicked.connect(lambda: self._act(self.branchRequested))
        self.ban_button.clicked.connect(lambda: self._act(self.banRequested))
        return actions

    def set_can_branch(self, on: bool) -> None:
        """Offer "Continue with this" and "Ban and retry" for the rows (the chat's replies)."""
        self.can_branch = on
        self.table.setSelectionMode(QTableWidget.SingleSelection if on else QTableWidget.NoSelection)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self._update_actions()

    def selected_row(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows() if self.can_branch else []
        return self.rows[rows[0].row()] if rows and rows[0].row() < len(self.rows) else None

    def select_row(self, token_id: int) -> bool:
        """Choose the row of ``token_id`` (as a click would); False when it is not shown."""
        for r, row in enumerate(self.rows):
            if row["id"] == token_id:
                self.table.selectRow(r)
                return True
        return False

    def _update_actions(self) -> None:
        self.actions.setVisible(self.can_branch and self.current is not None and bool(self.rows))
        row = self.selected_row()
        ok = row is not None and row["id"] >= 0  # a server's stand-in ids name nothing
        self.branch_button.setEnabled(ok and not row["chosen"])
        self.ban_button.setEnabled(ok)
        # A long token's name is cut to fit the panel; the table row beside shows all of it.
        name = self.fontMetrics().elidedText(self.text_of(row["id"]), Qt.ElideMiddle, NAME_WIDTH) if ok else ""
        self.branch_button.setText(f"Continue with “{name}”" if ok and not row["chosen"] else "Continue with this")
        self.ban_button.setText(self.ban_label.format(name) if ok else self.ban_label.replace("“{}”", "this"))

    def _act(self, signal) -> None:
        row = self.selected_row()
        if self.current is None or row is None or row["id"] < 0:
            return
        if signal is self.branchRequested and row["chosen"]:
            return
        signal.emit(self.current[0], self.current[1], int(row["id"]))

    def learn(self, token_id: int, piece: str) -> None:
        self.known.setdefault(int(token_id), piece)

    def text_of(self, token_id: int) -> str:
        t = None
        if self.token_text is not None:
            try:
                t = self.token_text(token_id)
            except Exception:  # a lookup must never break the panel
                t = None
        if t is None:
            t = self.known.get(token_id)
        return _visible(t) if t is not None else f"#{token_id}"

    def clear(self) -> None:
        self.current = None
        self.rows = []
        self.table.setRowCount(0)
        self._update_actions()
        self.title.setText("Token inspector")
        self.summary.setText("Hover or click a generated token to see how likely it was "
                             "and what else the model considered.")
        self.note.setText("")
        self.set_tool_odds("")

    def show_token(self, lane: int, index: int, rec, lane_label: str = "", *, title: str | None = None) -> None:
        """Show token ``index`` of ``lane``; ``rec`` has token_id, piece, logprob, top.

        ``title`` replaces "Lane N · token I" (the chat has replies, not lanes; it passes
        the message id as ``lane``).
        """
        self.current = (lane, index)
        self.set_tool_odds("")
        p = math.exp(rec.logprob)
        self.title.setText(title or f"Lane {lane + 1} · token {index + 1}")
        self.summary.setText(
            f"<b style='font-size: 15px;'>{_html(_visible(rec.piece))}</b> (id {rec.token_id})<br>"
            f"p = {fmt_prob(p)} · log p = {rec.logprob:.3f}"
            + (f"<br><span style='color: {theme.colors()['muted']};'>{_html(lane_label)}</span>" if lane_label else ""))
        # A server names alternatives by text under stand-in ids (-1, -2, ...) that mean
        # something else at every token: this token's own names come first.
        names = {int(tid): piece for tid, piece in ((rec.top or {}).get("pieces") or {}).items()}
        for tid, piece in names.items():
            if tid >= 0:
                self.learn(tid, piece)
        self.rows = inspector_rows(rec.top, rec.token_id)
        self.table.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            name = QTableWidgetItem(_visible(names[row["id"]]) if row["id"] in names else self.text_of(row["id"]))
            name.setToolTip(f"id {row['id']}" if row["id"] >= 0 else "the server does not report this token's id")
            cells = [name]
            for key in ("raw", "filtered"):
                it = QTableWidgetItem(fmt_prob(row[key]))
                it.setData(PROB_ROLE, row[key])
                it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                cells.append(it)
            if row.get("constrained"):
                cells[2].setText("constraint")
                cells[2].setToolTip("Removed by the output constraint (JSON schema, regex or grammar) "
                                    "before the other filters")
                f = name.font()
                f.setStrikeOut(True)
                name.setFont(f)
            for c, it in enumerate(cells):
                if row["chosen"]:
                    f = it.font()
                    f.setBold(True)
                    it.setFont(f)
                self.table.setItem(r, c, it)
        self.table.clearSelection()
        self._update_actions()
        if not self.rows:
            self.note.setText("No alternatives recorded for this token (run with inspection on).")
        elif not (rec.top or {}).get("filtered"):
            self.note.setText("model: the model's probabilities as the server reported them · after filters: "
                              "not reported (the server does not say what its filters kept). Bold: chosen.")
        else:
            self.note.setText("model: the raw softmax · after filters: what was sampled from "
                              "(temperature, top-k, top-p, min-p, repetition penalty). Bold: chosen; "
                              "cut: removed by the filters."
                              + (" Pick a row to branch the reply there." if self.can_branch else "")
                              + (" constraint (struck out): removed by the output format's JSON schema, "
                                 "regex or grammar." if any(r["constrained"] for r in self.rows) else ""))

    def set_tool_odds(self, text: str) -> None:
        """What the shown token says about tool calls (HTML; "" hides the line)."""
        self.tool_odds.setText(text)
        self.tool_odds.setVisible(bool(text))

    def shown_values(self) -> list[tuple[str, str, str]]:
        """The table's text, row by row (what a user reads)."""
        return [tuple(self.table.item(r, c).text() for c in range(3)) for r in range(self.table.rowCount())]


def _html(text: str) -> str:
    return html.escape(text)
