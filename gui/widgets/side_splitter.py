"""A splitter whose middle pane keeps a fair share of a narrowing window.

QSplitter gives all of a resize to the panes that stretch: at 800 px the main window's
sidebar and settings panel kept their widths and the chat column fell to ~240 px. Here the
side panes give up width (down to their own minimum) before the middle pane drops below
:data:`MIDDLE_SHARE` of the splitter; a wider window leaves the sizes as the user set them.
"""
from __future__ import annotations

from PySide6.QtWidgets import QSplitter

MIDDLE_SHARE = 0.45


class SideSplitter(QSplitter):
    """Side panes | middle pane (index ``middle``) | side panes."""

    def __init__(self, orientation, parent=None, *, middle: int = 1):
        super().__init__(orientation, parent)
        self.middle = middle

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        self.keep_middle()

    def keep_middle(self) -> None:
        """Take from the side panes, in proportion to what each can spare, what the middle
        pane lacks of its share."""
        sizes = self.sizes()
        if self.middle >= len(sizes):
            return
        short = int(sum(sizes) * MIDDLE_SHARE) - sizes[self.middle]
        spare = {i: max(0, s - self.widget(i).minimumSizeHint().width())
                 for i, s in enumerate(sizes) if i != self.middle and s > 0 and self.widget(i).isVisible()}
        if short <= 0 or not sum(spare.values()):
            return
        total_spare = sum(spare.values())
        take = min(short, total_spare)
        for i, can in spare.items():
            cut = take * can // total_spare
            sizes[i] -= cut
            sizes[self.middle] += cut
        self.setSizes(sizes)
