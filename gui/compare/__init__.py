"""Compare Settings (Ctrl+Shift+K): lanes of sampler settings and models side by side.

``view`` (CompareView: the window, composing the rest) lays out ``controls`` (prompt row,
action bar, lanes area) and one ``lane_column`` per lane, with the ``sweep_row``. A run is
planned and driven by ``runner`` (no widgets: one request per model or branch, refusals,
the retry split by draft model); ``models`` (LaneModel, ModelShelf) and ``model_picker``
say what a lane runs on; ``lanes`` compares a lane with the baseline; ``records`` saves,
reopens, exports and adopts; ``launch`` builds the window the main window owns. Token
runs and their HTML are :mod:`gui.widgets.token_run`, shared with the chat.
"""
