"""A comparison kept: what is saved in the history (the prompt, each lane's settings with
the seed it used, its model, tokens and branch), read back as data when it is opened,
exported as Markdown or JSON, and a lane's reply adopted into the chat. No widgets: the
view gathers and shows."""
from __future__ import annotations

import json
from pathlib import Path

from core.history import export as chat_export

from gui.widgets.token_run import LaneRun
from gui.compare.models import LaneModel


def is_id(x) -> bool:
    """A whole number that is not a bool (saved data is checked, not trusted)."""
    return isinstance(x, int) and not isinstance(x, bool)


def lane_record(run: LaneRun | None, settings: dict, model: LaneModel, branch: dict | None = None,
                from_lane: int | None = None, documents: dict | None = None) -> dict:
    """One lane as History.save_comparison stores it: its results (``run``, None before
    it ran) or only its ``settings``; a branch names its source lane (``from_lane``), its
    point and the tokens it kept; a lane grounded in documents its ``documents`` (the
    lane's spec, gui/compare/grounding.py) and how its run was grounded."""
    if run is not None:
        rec = run.to_dict(settings, model)
    else:
        rec = {"settings": settings, "seed": settings.get("seed"), "text": "", "tokens": [], "logprobs": [],
               "model": model.record(), "model_id": model.name}
    if documents:
        rec["documents"] = dict(documents)
    if run is not None and run.grounding:
        rec["grounding"] = run.grounding
    if branch:  # its kept tokens are its first ``at`` tokens
        rec["branch"] = {"from_lane": from_lane, "at": branch["at"], "token_id": branch["token_id"],
                         "kept_tokens": branch["kept"].ids}
        for key in ("prompt_ids", "stop_ids"):  # a branch on a server: what Run sends it again
            if key in branch:
                rec["branch"][key] = list(branch[key])
    return rec


def branch_from_record(lane: dict, run: LaneRun | None, columns: list) -> dict | None:
    """A saved lane's branch (data, checked: whole numbers, and its kept tokens must be
    the start of its own tokens); None when it was not one or does not hold together.
    ``columns``: the lanes now, one of which it names as its source."""
    b = lane.get("branch")
    if not isinstance(b, dict) or run is None:
        return None
    at, tok, src = b.get("at"), b.get("token_id"), b.get("from_lane")
    kept = b.get("kept_tokens")
    if not all(is_id(x) for x in (at, tok, src)) \
            or not 0 <= at < len(run.tokens) or not isinstance(kept, list) or kept != run.ids[:at]:
        return None
    out = {"src": columns[src - 1] if 1 <= src <= len(columns) else None, "from": src,
           "at": at, "token_id": tok, "kept": LaneRun.branch_of(run, at)}
    for key in ("prompt_ids", "stop_ids"):  # a branch on a server
        ids = b.get(key)
        if isinstance(ids, list) and all(is_id(t) and t >= 0 for t in ids):
            out[key] = ids
    return out


def run_from_record(lane: dict) -> LaneRun | None:
    """A saved lane's results (None when it never ran), with how it was grounded."""
    if not (lane.get("tokens") or lane.get("text")):
        return None
    run = LaneRun.from_dict(lane)
    run.grounding = str(lane.get("grounding") or "")
    return run


def documents_of(lane: dict) -> dict | None:
    """A saved lane's documents spec (checked: a dict naming its documents), or None."""
    d = lane.get("documents")
    return dict(d) if isinstance(d, dict) and isinstance(d.get("documents"), str) else None


def title_for(prompt: dict) -> str:
    """A saved comparison's default title: 'Compare: ' and the prompt's first 40 characters."""
    first = " ".join((prompt.get("text") or "comparison").split())
    return f"Compare: {first[:40]}" + ("…" if len(first) > 40 else "")


def context_of(prompt: dict) -> list[dict]:
    """The conversation a saved chat prompt was sent with, without the prompt's own turn."""
    text = prompt.get("text", "")
    msgs = list(prompt.get("messages") or [])
    if msgs and text.strip() and msgs[-1].get("content") == text and msgs[-1].get("role") == "user":
        msgs = msgs[:-1]
    return msgs


def export_comparison(history, conv_id: int, kind: str, path: str) -> None:
    """Write saved comparison ``conv_id`` to ``path`` as Markdown ("md") or JSON."""
    if kind == "md":
        Path(path).write_text(chat_export.export_markdown(history, conv_id), encoding="utf-8")
    else:
        Path(path).write_text(json.dumps(chat_export.export_json(history, conv_id), ensure_ascii=False, indent=1),
                              encoding="utf-8")


def adopt_into(conv, prompt: dict, run: LaneRun, info: dict, model: LaneModel, saved_id: int | None) -> int:
    """Write a lane's reply into the chat's conversation model ``conv``: the prompt as a
    user message first, unless it was empty (the reply answers the conversation's last
    message); ``info`` is what :meth:`CompareView.adopt` reports (settings, stats, lane).
    Returns the reply's message id."""
    if (prompt.get("text") or "").strip():
        parent = conv.add_user(prompt["text"]).id
    else:
        parent = conv.leaf_id()
    settings = info["settings"]
    msg = conv.add_reply(parent, run.text, settings=settings, seed=settings.get("seed"), stats=info["stats"],
                         stop_reason=run.stop_reason, model_id=model.name,
                         meta={"adopted_from_comparison": saved_id, "lane": info["lane"], "model": model.record()})
    conv.pathChanged.emit()
    return msg.id
