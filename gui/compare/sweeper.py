"""What the Sweep row's "Make lanes" does to the lanes there, and its Undo.

A sweep used to replace every lane at once, results, branched lanes and bans with them.
:class:`LaneSweep` asks first when the lanes hold anything a sweep would not make again
(results, a branch, lanes the user made or edited): replace them, add the sweep's lanes
beside them, or cancel. Whatever it did, Undo puts the lanes back as they were (their
columns are kept whole, results included) until the lanes run again or another sweep
replaces them. The view keeps its lanes; this only calls its public methods.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject

from core.engine.lanes import MAX_LANES, parse_sweep, sweep_lanes
from core.engine.settings import SamplingParams
from core.errors import LlamaDeskError

from gui.compare.sweep_row import SweepRow, describe_sweep

REPLACE, ADD, CANCEL = "replace", "add", "cancel"


@dataclass
class LaneSet:
    """The lanes as they were: their columns (results, branches and models in them), which
    one was the baseline, and the saved comparison and prompt their results belong to."""
    columns: list
    baseline: int
    saved_id: int | None
    last_prompt: dict | None


def at_stake(columns: list, made: list[tuple[object, dict]]) -> str:
    """What replacing ``columns`` would lose, in words; '' when nothing would: no results,
    no branch, and besides lane 1 (whose settings the sweep copies) only the last sweep's
    own lanes, untouched. ``made``: (column, settings) of the lanes the last sweep made."""
    results = sum(1 for c in columns if c.run is not None)
    branched = sum(1 for c in columns if c.branch)
    # Lane 1's settings are the sweep's base, so only the other lanes' own settings can be lost.
    edited = any(not any(c is m and c.settings() == s for m, s in made) for c in columns[1:])
    if not (results or branched or edited):
        return ""
    n = len(columns)
    parts = [f"{results} with results" if results else "", f"{branched} branched" if branched else ""]
    detail = ", ".join(p for p in parts if p)
    return f"the {n} lane{'s' if n != 1 else ''} here" + (f" ({detail})" if detail else "")


class LaneSweep(QObject):
    """The Sweep row's actions over a :class:`~gui.compare.view.CompareView`: Make lanes
    (asking replace / add beside / cancel when something is at stake) and Undo."""

    def __init__(self, view, row: SweepRow):
        super().__init__(view)
        self.view, self.row = view, row
        self.made: list[tuple[object, dict]] = []  # the last sweep's lanes, as it made them
        self.undo_to = None  # the lanes before the last sweep (view.take_lanes()), for Undo
        row.applyRequested.connect(lambda: self.apply())
        row.undoRequested.connect(self.undo)

    def apply(self, param: str | None = None, values: str | None = None, mode: str | None = None) -> bool:
        """One lane per value of ``param`` (default: the row's), replacing the lanes or beside
        them (``mode``; None: asked when something is at stake). False when nothing changed."""
        view, row = self.view, self.row
        if view.running:
            return False
        param = param or row.key()
        try:
            vals = parse_sweep(row.values.text() if values is None else values, param)
            base = view.lane_settings()[0] if view.columns else SamplingParams().to_dict()
            lanes = sweep_lanes(base, param, vals)
        except LlamaDeskError as e:
            row.error.setText(str(e))
            return False
        stake = at_stake(view.columns, self.made)
        room = MAX_LANES - len(view.columns)
        mode = mode or (row.ask(stake, len(lanes), room) if stake else REPLACE)
        if mode == ADD and len(lanes) > room:
            row.error.setText(f"only {room} more lane{'s' if room != 1 else ''} fit beside these "
                              f"({MAX_LANES} at most): replace them, or sweep fewer values")
            return False
        if mode not in (REPLACE, ADD):
            return False
        row.error.setText("")
        if param == "seed" and view.bar.seed_lock.isChecked():
            view.bar.seed_lock.setChecked(False)  # a seed sweep needs different seeds
        self._drop_undo()
        self.undo_to = view.take_lanes(keep_shown=mode == ADD)
        before = len(view.columns)
        model = self.undo_to.columns[0].model if self.undo_to.columns else None  # lane 1's, as its settings
        for s in lanes:
            view.add_lane(s, model=model)
        self.made = [(c, c.settings()) for c in view.columns[before:]]
        row.offer_undo(True)
        where = "added beside the others" if mode == ADD else "in place of the others" if stake else ""
        view.status.setText(describe_sweep(param, vals) + (f" · {where} · Undo brings them back" if where else ""))
        return True

    def undo(self) -> bool:
        """Put back the lanes the last sweep replaced or added to (results kept)."""
        if self.undo_to is None or self.view.running:
            return False
        taken, self.undo_to = self.undo_to, None
        for col in self.view.put_lanes(taken).columns:
            if col not in taken.columns:  # the sweep's lanes
                col.deleteLater()
        self.made = []
        self.row.offer_undo(False)
        self.view.status.setText("The lanes before the sweep are back.")
        return True

    def forget(self) -> None:
        """The lanes ran (or the window closes): Undo would now lose results, so it goes."""
        self._drop_undo()
        self.row.offer_undo(False)

    def _drop_undo(self) -> None:
        taken, self.undo_to = self.undo_to, None
        if taken is not None:
            shown = set(map(id, self.view.columns))
            for col in taken.columns:
                if id(col) not in shown:
                    col.deleteLater()
