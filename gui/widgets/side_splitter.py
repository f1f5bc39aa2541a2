"""A splitter whose middle pane keeps a fair share of a narrowing window.

QSplitter gives all of a resize to the panes that stretch: at 800 px the main window's
sidebar and settings panel kept their widths and the chat column fell to ~240 px. Here the
side panes give up width (down to their own minimum) before the middle pane drops below
:data:`MIDDLE_SHARE` of the splitter, and get it back, up to the widths last set (by
:meth:`setSizes` or by dragging a handle), as the window widens again.
"""
from __future__ import annotations

from PySide6.QtWidgets import QSplitter

MIDDLE_SHARE = 0.45


class SideSplitter(QSplitter):
    """Side panes | middle pane (index ``middle``) | side panes."""

    def __init__(self, orientation, parent=None, *, middle: int = 1):
        super().__init__(orientation, parent)
        self.middle = middle
        self.wanted: dict[int, int] = {}  # side pane -> the width it was given
        self.splitterMoved.connect(lambda *_: self._remember(self.sizes()))

    def _remember(self, sizes) -> None:
        self.wanted = {i: s for i, s in enumerate(sizes) if i != self.middle and s > 0}

    def setSizes(self, sizes) -> None:  # noqa: N802 (Qt API)
        self._remember(sizes)
        super().setSizes(sizes)
        self.keep_middle()

    def restoreState(self, state) -> bool:  # noqa: N802 (Qt API)
        ok = super().restoreState(state)
        if ok:
            self._remember(self.sizes())
        return ok

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        self.keep_middle()

    def keep_middle(self) -> None:
        """Side panes at the widths wanted unless that leaves the middle pane less than its
        share: then they give it what it lacks, each in proportion to what it can spare."""
        sizes = self.sizes()
        if self.middle >= len(sizes) or not sum(sizes):
            return
        total = sum(sizes)
        sides = [i for i, s in enumerate(sizes) if i != self.middle and s > 0 and self.widget(i).isVisible()]
        want = {i: max(self.wanted.get(i, sizes[i]), self.widget(i).minimumSizeHint().width()) for i in sides}
        others = sum(s for i, s in enumerate(sizes) if i != self.middle and i not in want)  # hidden: 0
        lack = int(total * MIDDLE_SHARE) - (total - others - sum(want.values()))
        if lack > 0:
            spare = {i: want[i] - self.widget(i).minimumSizeHint().width() for i in sides}
            room = sum(spare.values())
            for i in sides:
                want[i] -= min(spare[i], lack * spare[i] // room) if room else 0
        new = [want.get(i, s) for i, s in enumerate(sizes)]
        new[self.middle] = total - sum(s for i, s in enumerate(new) if i != self.middle)
        if new != sizes:
            super().setSizes(new)
