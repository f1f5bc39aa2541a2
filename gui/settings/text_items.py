"""Comma-separated text items, as the settings panel and a comparison lane take them:
stop strings and TEXT=BIAS logit biases (a backslash escapes a comma, a newline, a tab,
a backslash or a space kept at an item's edge)."""
from __future__ import annotations

from core.engine.settings import parse_logit_bias
from core.errors import SettingsError

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", ",": ",", " ": " "}


def parse_stop_strings(text: str) -> tuple[str, ...]:
    """'###, \\nUser:, a\\,b' → ('###', '\\nUser:', 'a,b'). Items are comma-separated;
    backslash escapes \\n, \\t, \\\\, \\, and '\\ ' (a space kept at an item's edge);
    unescaped spaces around items are trimmed and empty items dropped."""
    items: list[str] = []
    chars: list[tuple[str, bool]] = []  # (char, escaped)

    def flush():
        # Trim only unescaped whitespace at the ends.
        lo, hi = 0, len(chars)
        while lo < hi and not chars[lo][1] and chars[lo][0].isspace():
            lo += 1
        while hi > lo and not chars[hi - 1][1] and chars[hi - 1][0].isspace():
            hi -= 1
        s = "".join(c for c, _ in chars[lo:hi])
        if s:
            items.append(s)
        chars.clear()

    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            chars.append((_ESCAPES[text[i + 1]], True))
            i += 2
            continue
        if ch in ",\n":
            flush()
        else:
            chars.append((ch, False))
        i += 1
    flush()
    return tuple(items)


def format_stop_strings(stop: tuple[str, ...] | list[str]) -> str:
    """Inverse of :func:`parse_stop_strings`."""
    out = []
    for s in stop:
        e = s.replace("\\", "\\\\").replace(",", "\\,").replace("\n", "\\n").replace("\t", "\\t")
        if e.startswith(" "):
            e = "\\" + e
        if e.endswith(" ") and not e.endswith("\\ "):
            e = e[:-1] + "\\ "
        out.append(e)
    return ", ".join(out)


def bias_items(text: str) -> tuple[tuple[str, ...], list[str]]:
    """A logit bias field's text ('dragon=+5, Once=-inf', commas as in Stop at): its
    well-formed TEXT=BIAS items, and a reason for each other one (they are left out)."""
    good, bad = [], []
    for spec in parse_stop_strings(text):
        try:
            parse_logit_bias(spec, lambda text: [0])
            good.append(spec)
        except SettingsError as e:
            bad.append(str(e))
    return tuple(good), bad


