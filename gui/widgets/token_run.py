"""A run of generated tokens and how it is drawn, without Qt widgets or torch: a
comparison lane's reply, or a chat reply's token record.

A :class:`LaneRun` keeps one lane's (or reply's) generated tokens as records (text, id,
log-prob and the inspector's alternatives), so a view can render every token as its own
anchor (``tok:LANE:INDEX`` in a lane, ``tok:INDEX`` in a chat reply), mark a diff and
shade a heatmap. :func:`render_lane_html` turns a run into the HTML a QTextBrowser shows.
"""
from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field

from core.engine.lanes import LANE_KEYS, TokenDiff, lane_stats

ANCHOR_SCHEME = "tok"


@dataclass
class TokenRec:
    """One generated token: ``text`` is what it added to the visible reply (may be "")."""
    token_id: int
    text: str
    piece: str
    logprob: float
    top: dict | None = None

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)


@dataclass
class LaneRun:
    """One lane's output: streaming tokens, then the Done facts (resolved settings, stats)."""
    tokens: list[TokenRec] = field(default_factory=list)
    text: str = ""  # the reply as streamed, replaced by the final text on Done
    stop_reason: str | None = None
    params: dict | None = None  # settings actually used (concrete seed), from Done
    engine_stats: dict = field(default_factory=dict)
    first_at: float | None = None  # monotonic time of the first and last token (live rate)
    last_at: float | None = None
    error: str | None = None  # why the lane's request failed (what streamed before stays)
    kept_text: str = ""  # a branch: the text of the tokens it kept from its source lane
    # A lane on a server: its prompt as the server tokenized it and the token that ended
    # the reply (a chat's end of turn), what a branch of it sends back (not saved: a
    # reopened server lane is run again before it branches)
    prompt_ids: list[int] = field(default_factory=list)
    stop_token: int | None = None
    # The calls the reply made (OpenAI-shaped dicts), when it ended with stop reason "tool_calls".
    tool_calls: list[dict] = field(default_factory=list)
    diff_cache: tuple | None = field(default=None, repr=False, compare=False)  # the view's last diff of it
    grounding: str = ""  # a comparison lane grounded in documents: how (gui/compare/grounding.py)

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    @property
    def ids(self) -> list[int]:
        return [t.token_id for t in self.tokens]

    @property
    def logprobs(self) -> list[float]:
        return [t.logprob for t in self.tokens]

    def add(self, deltas) -> None:
        """Append the engine's Token events of this lane."""
        now = time.monotonic()
        if deltas:
            self.first_at = self.first_at if self.first_at is not None else now
            self.last_at = now
        for d in deltas:
            self.tokens.append(TokenRec(int(d.token_id), d.text, d.piece, float(d.logprob), d.top))
            self.text += d.text

    def finish(self, done) -> None:
        """Take a Done event's final text, reason, settings and stats."""
        self.text = self.kept_text + done.text
        self.stop_reason = done.stop_reason
        self.params = done.params.to_dict()
        self.engine_stats = done.stats.to_dict()
        if getattr(done, "beams", None):  # a beam search lane shows its best beam
            self.engine_stats["beam"] = {"rank": 1, "of": len(done.beams), "score": done.beams[0].score}
        self.prompt_ids = list(getattr(done, "prompt_ids", None) or [])
        self.stop_token = getattr(done, "stop_token", None)
        self.tool_calls = [c.to_openai() for c in getattr(done, "tool_calls", None) or []]

    def fail(self, message: str) -> None:
        """The lane's request failed: keep what streamed, stop with reason "error"."""
        self.error = message
        if self.stop_reason is None:
            self.stop_reason = "error"

    def tail(self) -> str:
        """Final text that no token's delta carried (a flushed partial character)."""
        streamed = "".join(t.text for t in self.tokens)
        return self.text[len(streamed):] if self.text.startswith(streamed) else ""

    def stats(self) -> dict:
        st = self.engine_stats
        if not st.get("decode_tok_s") and self.first_at is not None and self.last_at > self.first_at:
            # Streaming: the engine's rate comes with Done; until then, the rate seen here.
            st = {**st, "decode_tok_s": (len(self.tokens) - 1) / (self.last_at - self.first_at)}
        return lane_stats(self.ids, self.logprobs, st, self.stop_reason)

    def to_dict(self, settings: dict, model=None) -> dict:
        """The lane as History.save_comparison stores it (settings carry the seed used;
        ``model``: where it ran, a :class:`gui.compare.models.LaneModel`: its ``record()``
        and ``name``)."""
        used = {k: v for k, v in (self.params or settings).items() if k in LANE_KEYS or k == "stop"}
        where = {"model": model.record(), "model_id": model.name} if model is not None else {}
        return {**where,
            "settings": used, "seed": used.get("seed"), "text": self.text,
            "tokens": self.ids, "logprobs": self.logprobs,
            "token_texts": [t.text for t in self.tokens], "pieces": [t.piece for t in self.tokens],
            "top": [t.top for t in self.tokens], "stop_reason": self.stop_reason,
            **({"error": self.error} if self.error else {}),
            **({"tool_calls": self.tool_calls} if self.tool_calls else {}),
            "stats": {**self.engine_stats, **self.stats()},
        }

    def token_record(self) -> dict:
        """Just the tokens, compact and JSON-safe, in :meth:`to_dict`'s key names so
        :meth:`from_dict` reads it back. A chat reply keeps this in its message meta (the
        message stores its text, settings and stats itself); probabilities keep 6
        significant digits, far below what the inspector shows."""
        def r(x: float) -> float:
            return float(f"{x:.6g}")

        tops = []
        for t in self.tokens:
            top = t.top
            if top:
                top = {"raw": [[int(i), r(p)] for i, p in top.get("raw", [])],
                       "filtered": [[int(i), r(p)] for i, p in top.get("filtered", [])],
                       "pieces": {str(i): str(s) for i, s in (top.get("pieces") or {}).items()}}
            tops.append(top)
        return {"tokens": self.ids, "token_texts": [t.text for t in self.tokens],
                "pieces": [t.piece for t in self.tokens], "logprobs": [r(t.logprob) for t in self.tokens],
                "top": tops}

    @classmethod
    def branch_of(cls, source: "LaneRun", at: int) -> "LaneRun":
        """A branch's run before it starts: ``source``'s first ``at`` tokens, kept."""
        run = cls(tokens=[TokenRec(t.token_id, t.text, t.piece, t.logprob, t.top) for t in source.tokens[:at]])
        run.kept_text = run.text = "".join(t.text for t in run.tokens)
        return run

    @classmethod
    def from_dict(cls, d: dict) -> "LaneRun":
        ids = list(d.get("tokens") or [])
        n = len(ids)
        texts = list(d.get("token_texts") or [""] * n)
        pieces = list(d.get("pieces") or texts)
        lps = list(d.get("logprobs") or [0.0] * n)
        tops = list(d.get("top") or [None] * n)
        run = cls()
        for i in range(n):
            top = tops[i] if i < len(tops) else None
            if isinstance(top, dict):  # JSON turned (id, prob) tuples into lists
                top = {k: ({int(i): str(p) for i, p in v.items()} if k == "pieces"
                           else [int(a) for a in v] if k == "constrained"  # ids the constraint removed
                           else [(int(a), float(b)) for a, b in v]) for k, v in top.items()}
            run.tokens.append(TokenRec(int(ids[i]), texts[i] if i < len(texts) else "",
                                       pieces[i] if i < len(pieces) else "", float(lps[i]), top))
        run.text = str(d.get("text", ""))
        run.stop_reason = d.get("stop_reason") or "length"
        run.error = d.get("error") or None
        run.tool_calls = [c for c in d.get("tool_calls") or [] if isinstance(c, dict)]
        run.params = dict(d.get("settings") or {}) or None
        stats = dict(d.get("stats") or {})
        run.engine_stats = {k: stats[k] for k in ("decode_tok_s", "prompt_tokens", "generated_tokens",
                                                  "prefill_s", "decode_s", "ttft_s", "cached_tokens") if k in stats}
        return run


# --------------------------------------------------------------------------- rendering


def _hex(c: str) -> tuple[int, int, int]:
    c = c.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


def blend(base: str, over: str, alpha: float) -> str:
    """``over`` laid on ``base`` with opacity ``alpha`` (0..1), as #rrggbb (Qt's rich text
    has no rgba backgrounds everywhere, so shades are mixed here)."""
    a = min(max(alpha, 0.0), 1.0)
    b, o = _hex(base), _hex(over)
    return "#%02x%02x%02x" % tuple(round(x + (y - x) * a) for x, y in zip(b, o))


def lane_colors(theme_colors: dict, dark: bool) -> dict:
    """Colours the lanes use, derived from the app theme's named colours."""
    return {
        "text": theme_colors["text"], "muted": theme_colors["muted"], "base": theme_colors["base"],
        "accent": theme_colors["accent"], "accent_text": theme_colors["accent_text"],
        "diff_bg": "#5a4413" if dark else "#fff0c2", "diff_text": "#ffd479" if dark else "#7a4a00",
        "mark": "#ff7a59" if dark else "#d2401c", "heat": "#e0533d" if dark else "#f0603c",
    }


def _escape(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")


def token_href(lane: int | None, index: int) -> str:
    """A token's anchor: ``tok:LANE:I`` in a comparison lane, ``tok:I`` in a chat reply."""
    return f"{ANCHOR_SCHEME}:{index}" if lane is None else f"{ANCHOR_SCHEME}:{lane}:{index}"


def render_lane_html(lane: int | None, run: LaneRun, *, diff: TokenDiff | None = None, heatmap: bool = False,
                     selected: int | None = None, colors: dict, lead: str = "", branch_at: int | None = None) -> str:
    """The lane's reply as HTML: one ``<a href="tok:LANE:I">`` per token (``tok:I`` when
    ``lane`` is None: a chat reply, which has no lanes). ``lead``: text before the first
    token that no token covers (a continued chat reply's older part), shown muted.

    Tokens the diff marks as changed get the diff colours (an underline only, when the
    heatmap is on and owns the background), the divergence point gets a marker; the
    heatmap shades each token by its surprise (1 - p) so unlikely picks stand out.
    ``branch_at``: a branched lane's forced token, marked in the accent colour.
    """
    parts = [f'<div style="white-space: pre-wrap; color: {colors["text"]};">']
    if lead:
        parts.append(f'<span style="color: {colors["muted"]};">{_escape(lead)}</span>')
    for i, t in enumerate(run.tokens):
        if not t.text:
            continue  # held back (partial character / possible stop): shown with a later token
        style = [f"color: {colors['text']}", "text-decoration: none"]
        changed = diff is not None and i < len(diff.changed) and diff.changed[i]
        if i == branch_at:
            parts.append(f'<span style="color: {colors["accent"]}; font-weight: 700;">\u2503</span>')
        elif diff is not None and diff.divergence == i:
            parts.append(f'<span style="color: {colors["mark"]}; font-weight: 700;">\u2503</span>')
        if heatmap:
            style.append(f"background-color: {blend(colors['base'], colors['heat'], 0.6 * (1.0 - t.prob))}")
        if changed:
            if heatmap:
                style.append("text-decoration: underline")
            else:
                style.append(f"background-color: {colors['diff_bg']}")
            style[0] = f"color: {colors['diff_text']}"
        if i == selected:
            style = [f"color: {colors['accent_text']}", f"background-color: {colors['accent']}",
                     "text-decoration: none"]
        parts.append(f'<a href="{token_href(lane, i)}" style="{"; ".join(style)}">{_escape(t.text)}</a>')
    tail = run.tail()
    if tail:
        parts.append(_escape(tail))
    if not run.tokens and not run.text and not run.finished:
        parts.append(f'<span style="color: {colors["muted"]};">…</span>')
    parts.append("</div>")
    return "".join(parts)


def parse_anchor(href: str) -> tuple[int, int] | None:
    """(lane, index) of a ``tok:LANE:I`` anchor, else None."""
    bits = href.split(":")
    if len(bits) != 3 or bits[0] != ANCHOR_SCHEME:
        return None
    try:
        return int(bits[1]), int(bits[2])
    except ValueError:
        return None


def parse_token_index(href: str) -> int | None:
    """The index of a chat reply's ``tok:I`` anchor, else None."""
    bits = href.split(":")
    if len(bits) != 2 or bits[0] != ANCHOR_SCHEME:
        return None
    try:
        return int(bits[1])
    except ValueError:
        return None
