"""Light and dark looks that follow the system, SVG icons tinted to match, one stylesheet.

``apply(app, mode)`` sets a Fusion palette and the stylesheet; ``mode`` is "system"
(follow the platform's colour scheme, re-applied when it changes), "light" or "dark".
Widgets that render HTML (the transcript) ask :func:`colors` for the current colours.
"""
from __future__ import annotations

from functools import lru_cache

from PySide6.QtCore import QByteArray, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer

from core.paths import assets_dir

ICONS = assets_dir() / "icons"

LIGHT = {
    "window": "#f6f7f9", "base": "#ffffff", "alt": "#eef0f3", "text": "#1d2125",
    "muted": "#646c75", "border": "#d5d9de", "accent": "#2f6fde", "accent_text": "#ffffff",
    "user_bg": "#e8f0fe", "assistant_bg": "#ffffff", "code_bg": "#f3f4f6",
    "notice_bg": "#fff4d6", "notice_text": "#5c4400", "error": "#c62828", "pygments": "default",
}
DARK = {
    "window": "#1e2024", "base": "#26292e", "alt": "#2d3137", "text": "#e6e8eb",
    "muted": "#9aa3ad", "border": "#3a3f46", "accent": "#5b9bff", "accent_text": "#0d1117",
    "user_bg": "#2a3548", "assistant_bg": "#26292e", "code_bg": "#1b1d21",
    "notice_bg": "#4a3b12", "notice_text": "#f3dc9a", "error": "#ef6b6b", "pygments": "monokai",
}

_state = {"dark": False, "mode": "system"}


def system_is_dark() -> bool:
    """What the platform asks for; falls back to the palette's window lightness."""
    app = QGuiApplication.instance()
    if app is None:
        return False
    try:
        scheme = app.styleHints().colorScheme()
        if scheme == Qt.ColorScheme.Dark:
            return True
        if scheme == Qt.ColorScheme.Light:
            return False
    except AttributeError:  # Qt < 6.5
        pass
    return app.palette().color(QPalette.Window).lightness() < 128


def is_dark() -> bool:
    return _state["dark"]


def colors() -> dict:
    """The current theme's named colours (hex strings)."""
    return DARK if _state["dark"] else LIGHT


def palette(dark: bool) -> QPalette:
    c = DARK if dark else LIGHT
    p = QPalette()
    roles = {
        QPalette.Window: c["window"], QPalette.WindowText: c["text"], QPalette.Base: c["base"],
        QPalette.AlternateBase: c["alt"], QPalette.Text: c["text"], QPalette.Button: c["alt"],
        QPalette.ButtonText: c["text"], QPalette.ToolTipBase: c["base"], QPalette.ToolTipText: c["text"],
        QPalette.Highlight: c["accent"], QPalette.HighlightedText: c["accent_text"],
        QPalette.Link: c["accent"], QPalette.PlaceholderText: c["muted"], QPalette.BrightText: c["error"],
    }
    for role, col in roles.items():
        p.setColor(role, QColor(col))
    for role in (QPalette.Text, QPalette.WindowText, QPalette.ButtonText):
        p.setColor(QPalette.Disabled, role, QColor(c["muted"]))
    return p


def mix(a: str, b: str, t: float) -> str:
    """``t`` of colour ``a`` over ``b`` (#rrggbb). The context bar's fill is a light tint of the
    accent so that its text, drawn in one colour across fill and track, reads on both."""
    ca, cb = QColor(a), QColor(b)
    return QColor(*(round(t * x + (1 - t) * y) for x, y in zip(ca.getRgb()[:3], cb.getRgb()[:3]))).name()


def stylesheet(dark: bool) -> str:
    c = DARK if dark else LIGHT
    return f"""
    QToolTip {{ color: {c['text']}; background: {c['base']}; border: 1px solid {c['border']}; }}
    #conversationList {{ background: {c['alt']}; border: none; }}
    #conversationList::item {{ padding: 6px 8px; border-radius: 4px; }}
    #conversationList::item:selected {{ background: {c['accent']}; color: {c['accent_text']}; }}
    #transcript, #transcriptInner {{ background: {c['base']}; border: none; }}
    QFrame#message {{ border: 1px solid {c['border']}; border-radius: 8px; }}
    QFrame#message[role="user"] {{ background: {c['user_bg']}; }}
    QFrame#message[role="assistant"] {{ background: {c['assistant_bg']}; }}
    QFrame#message QTextBrowser {{ background: transparent; border: none; }}
    QLabel#roleLabel {{ font-weight: 600; }}
    QLabel#messageFooter, QLabel#promptHint, QLabel#versionLabel {{ color: {c['muted']}; }}
    QLabel#contextNotice {{ background: {c['notice_bg']}; color: {c['notice_text']};
        padding: 4px 8px; border-radius: 4px; }}
    QLabel#emptyHint {{ color: {c['muted']}; font-size: 15px; }}
    QPlainTextEdit#promptEditor {{ background: {c['base']}; border: 1px solid {c['border']};
        border-radius: 6px; padding: 4px; }}
    QPlainTextEdit#promptEditor:focus {{ border: 1px solid {c['accent']}; }}
    QPushButton#sendButton {{ background: {c['accent']}; color: {c['accent_text']}; border: none;
        border-radius: 6px; padding: 6px 14px; font-weight: 600; }}
    QPushButton#sendButton:disabled {{ background: {c['border']}; color: {c['muted']}; }}
    QPushButton#stopButton {{ border: 1px solid {c['border']}; border-radius: 6px; padding: 6px 14px; }}
    QFrame#message QToolButton {{ border: none; padding: 2px; border-radius: 4px; }}
    QFrame#message QToolButton:hover {{ background: {c['alt']}; }}
    QProgressBar#contextBar {{ border: 1px solid {c['border']}; border-radius: 3px; background: {c['alt']};
        text-align: center; max-height: 14px; }}
    QProgressBar#contextBar::chunk {{ background: {mix(c['accent'], c['alt'], 0.35)}; border-radius: 2px; }}
    """


def apply(app, mode: str = "system") -> bool:
    """Apply a theme to the application; returns whether it is dark."""
    _state["mode"] = mode
    dark = system_is_dark() if mode == "system" else mode == "dark"
    _state["dark"] = dark
    app.setStyle("Fusion")
    app.setPalette(palette(dark))
    app.setStyleSheet(stylesheet(dark))
    icon.cache_clear()
    return dark


def follow_system(app, on_change=None) -> None:
    """Re-apply the theme when the platform's colour scheme changes (mode "system" only)."""
    def changed(*_):
        if _state["mode"] == "system":
            apply(app, "system")
            if on_change is not None:
                on_change()
    try:
        app.styleHints().colorSchemeChanged.connect(changed)
    except AttributeError:
        pass


@lru_cache(maxsize=None)
def icon(name: str, color: str | None = None) -> QIcon:
    """An SVG icon from assets/icons, drawn in the theme's text colour (sharp at any scale)."""
    path = ICONS / f"{name}.svg"
    if not path.exists():
        return QIcon()
    col = color or colors()["text"]
    data = path.read_text().replace("currentColor", col).encode()
    renderer = QSvgRenderer(QByteArray(data))
    out = QIcon()
    for size in (16, 24, 32, 48, 64):
        pm = QPixmap(QSize(size, size))
        pm.fill(Qt.transparent)
        painter = QPainter(pm)
        renderer.render(painter)
        painter.end()
        out.addPixmap(pm)
    return out
