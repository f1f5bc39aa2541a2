"""Where the settings panel keeps its values and presets between runs: QSettings groups
"sampling" (one key per value) and "presets" (the user's, as one JSON value, and the
selected one's name)."""
from __future__ import annotations

import json
import math

from PySide6.QtCore import QObject, QSettings, QTimer

from core.engine.settings import SCHEMA
from core.paths import settings_path

SYNC_DELAY_MS = 400
# The panel's own keys beside the settings' (whose kinds the schema gives).
PANEL_KINDS = {"seed_value": int, "random_seed": bool, "stop": list, "system_prompt": str, "chat_format": str,
               "speculative": str, "lookup_n": int, "draft_path": str, "logit_bias_text": list,
               "constraint_kind": str, "constraint_text": str}
# The seed and lookup are kept as the panel shows them (random_seed + seed_value,
# speculative + lookup_n), so a fixed seed or an n survives being switched off.
STORED_KINDS = {**{s.name: s.kind for s in SCHEMA.values() if s.numeric and s.name not in ("seed", "lookup")},
                **PANEL_KINDS}


def default_settings() -> QSettings:
    """The app's settings: one INI file in :func:`core.paths.config_dir`, which follows
    ``LLAMADESK_CONFIG_DIR`` / ``LLAMADESK_DATA_DIR``; never Qt's per-organisation default,
    which ignores both (a fresh data folder would start with another one's settings)."""
    return QSettings(str(settings_path()), QSettings.IniFormat)


class PanelStore(QObject):
    """The panel's QSettings. Values reach QSettings at once (shared in-process); the
    disk sync is batched so a slider drag does not write the file on every step."""

    def __init__(self, settings: QSettings, parent: QObject | None = None):
        super().__init__(parent)
        self.settings = settings
        self._sync_timer = QTimer(self, singleShot=True, interval=SYNC_DELAY_MS)
        self._sync_timer.timeout.connect(self.settings.sync)

    def save(self, values: dict, user_presets: dict, selected: str | None) -> None:
        s = self.settings
        s.beginGroup("sampling")
        for k, v in values.items():
            s.setValue(k, json.dumps(v) if isinstance(v, (list, tuple, dict)) else ("" if v is None else v))
        s.endGroup()
        s.beginGroup("presets")
        # One JSON value: preset names may hold '/' or other characters QSettings keys can't.
        s.setValue("user", json.dumps(user_presets, ensure_ascii=False))
        s.setValue("selected", selected or "")
        s.endGroup()
        self._sync_timer.start()

    def load(self) -> tuple[dict | None, dict, str | None]:
        """(the stored values, typed, or None on a first run; the user's presets; the
        selected preset's name). Junk is skipped, never raised."""
        s = self.settings
        s.beginGroup("presets")
        try:
            user = json.loads(s.value("user", "{}") or "{}")
            user = {str(k): dict(v) for k, v in user.items() if isinstance(v, dict)}
        except (ValueError, TypeError, AttributeError):
            user = {}
        selected = s.value("selected", None)
        s.endGroup()
        s.beginGroup("sampling")
        stored = {k: s.value(k) for k in s.childKeys()}
        s.endGroup()
        return (coerce_stored(stored) if stored else None), user, selected


def coerce_stored(stored: dict) -> dict:
    """QSettings (INI) hands back strings; turn each known key into its type, skipping junk."""
    out: dict = {}
    for k, kind in STORED_KINDS.items():
        if k not in stored or stored[k] is None:
            continue
        try:
            out[k] = _typed(stored[k], kind)
        except (ValueError, TypeError):
            continue
        if isinstance(out[k], float) and not math.isfinite(out[k]):
            del out[k]
    return out


def _typed(v, kind: type):
    if kind is bool:
        return v if isinstance(v, bool) else str(v).lower() in ("true", "1", "yes")
    if kind is list:
        items = json.loads(v) if isinstance(v, str) else list(v)
        return [str(x) for x in items if str(x)]
    if kind is str:
        return str(v)
    return kind(float(v)) if kind is int else kind(v)
