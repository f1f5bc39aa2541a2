"""How a comparison lane compares with the baseline lane: the diff (by token ids under one
tokenizer, else by text), the line over the lane that says where it parts (and where its
tool calls differ), and the text that bans one of its tokens. Token runs themselves live in
:mod:`gui.widgets.token_run`."""
from __future__ import annotations

import html
import json

from core.engine.lanes import TokenDiff, text_diff, token_diff
from core.prompt.tool_format import OFF

from gui.widgets.token_run import LaneRun, TokenRec


def lane_diff(base: LaneRun, run: LaneRun, match: bool | None) -> TokenDiff:
    """``run`` against the baseline: by token ids under one tokenizer, else by text
    (aligned once both are finished; until then only where they part). A diff is
    computed again only when either side changed (kept in ``run.diff_cache``)."""
    key = (id(base), len(base.tokens), len(run.tokens), len(base.text), len(run.text),
           base.finished, run.finished, match)
    hit = run.diff_cache
    if hit is not None and hit[0] == key and hit[2] is base:
        return hit[1]
    if match:
        diff = token_diff(base.ids, run.ids)
    else:
        diff = text_diff(base.text, [t.text for t in run.tokens], align=base.finished and run.finished)
    run.diff_cache = (key, diff, base)
    return diff


def divergence_label(run: LaneRun, base: LaneRun, diff: TokenDiff, match: bool | None, colors: dict) -> str:
    """The line over a lane's text: where it parts from the baseline (``diff``), or that
    it has not; ``match``: whether the two lanes' tokenizers are one (None: not known)."""
    both_done = run.finished and base.finished
    if diff.divergence is None:
        label = ("Identical to the baseline" if match else "Same text as the baseline") if both_done \
            else ("Same as the baseline so far" if match else "Same text as the baseline so far")
    else:
        label = (f"<span style='color: {colors['mark']}; font-weight: 600;'>Diverges at token "
                 f"{diff.divergence + 1}</span> · {diff.changed_count} of {len(run.tokens)} tokens differ")
    if not match:
        why = "different tokenizers" if match is False else "tokenizer not known"
        label += f"<br><span style='color: {colors['muted']};'>{why}: divergence and diff by text only</span>"
    return label


def ban_text(rec: TokenRec | None, token_id: int, names: dict[int, str], dummy_prefix: bool) -> str:
    """The text that bans ``token_id`` by logit bias where ``rec`` was generated: its piece
    as the lane's tokenizer would encode it alone ("" when it is only space or unknown).
    ``names``: id -> piece learned for the lane's tokenizer, when ``rec`` does not name it."""
    piece = ((rec.top or {}).get("pieces") or {}).get(token_id) if rec is not None else None
    piece = piece if piece is not None else names.get(token_id)
    if dummy_prefix and piece and piece.startswith(" ") and piece.strip():
        piece = piece[1:]  # SentencePiece adds the word-start space itself
    return piece if piece and piece.strip() else ""


def _call(c: dict) -> tuple[str, object]:
    """(name, arguments) of an OpenAI-shaped call, its arguments parsed when they are JSON."""
    fn = c.get("function") or {}
    args = fn.get("arguments", "")
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        pass
    return str(fn.get("name", "?")), args


def _show(calls: list[tuple[str, object]]) -> str:
    return ", ".join(html.escape(n) for n, _ in calls)


def _tools_off(run: LaneRun) -> bool:
    return (run.params or {}).get("tool_choice") == OFF


def calls_label(run: LaneRun, base: LaneRun, colors: dict) -> str:
    """Where the lane's tool calls differ from the baseline's ("" when neither called and
    both had the tools): one answered and the other called, other tools, or the same tools
    with other arguments (which ones); first, when one of them had its tools off (left out
    of its prompt, not only its calls masked), that it did."""
    if not (run.finished and base.finished):
        return ""
    calls = _calls_differ(run, base, colors)
    if _tools_off(run) == _tools_off(base):
        return calls
    mark = f"color: {colors['mark']}; font-weight: 600;"
    whose = "this lane's prompt" if _tools_off(run) else "the baseline's prompt"
    note = f"<span style='{mark}'>Tools off</span>: {whose} declares no tools"
    return f"{note} · {calls}" if calls else note


def _calls_differ(run: LaneRun, base: LaneRun, colors: dict) -> str:
    mine, theirs = [_call(c) for c in run.tool_calls], [_call(c) for c in base.tool_calls]
    if not (mine or theirs):
        return ""
    if mine == theirs:
        return f"Same tool calls as the baseline: {_show(mine)}"
    mark = f"color: {colors['mark']}; font-weight: 600;"
    if not theirs:
        return f"<span style='{mark}'>Calls {_show(mine)}</span> where the baseline answers"
    if not mine:
        return f"<span style='{mark}'>Answers</span> where the baseline calls {_show(theirs)}"
    if [n for n, _ in mine] != [n for n, _ in theirs]:
        return f"<span style='{mark}'>Calls {_show(mine)}</span> · the baseline calls {_show(theirs)}"
    keys = sorted({k for (_, a), (_, b) in zip(mine, theirs) if isinstance(a, dict) and isinstance(b, dict)
                   for k in set(a) | set(b) if a.get(k) != b.get(k)})
    what = f"other arguments: {html.escape(', '.join(keys))}" if keys else "other arguments"
    return f"<span style='{mark}'>Calls {_show(mine)} with {what}</span> than the baseline"
