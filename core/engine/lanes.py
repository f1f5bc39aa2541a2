"""Pure helpers for comparing sampler settings side by side (no Qt, no torch).

Everything here works on plain token-id lists, log-probability lists and dicts, so the
compare view, the CLI and tests share one definition of "where two lanes part", "how
repetitive a text is", "what a sweep over a parameter means" and "what a lane spec says".
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Sequence

from core.engine.constraint import LABELS, from_argument
from core.engine.settings import MAX_BIAS, SCHEMA, parse_logit_bias
from core.errors import SettingsError

MAX_LANES = 8

# The numbers a sweep can vary; their kinds and ranges are the schema's, so a sweep is
# refused before any lane is built exactly where SamplingParams.validate would refuse it.
SWEEP_PARAMS = {s.name: s for s in SCHEMA.values() if s.sweep and s.numeric}
# Settings a sweep can vary that are not one number: a logit bias (one TEXT over several
# biases: "girl=-inf, -5, 0, 5"), the output format (lane 1's, "on, off") and the draft model
# of speculative decoding ("off, /models/a.gguf, /models/b.gguf"), in the order offered.
SWEEP_OTHER = ("logit_bias_text", "constraint", "draft")
SWEEP_KEYS = (*SWEEP_PARAMS, *SWEEP_OTHER)

# The per-lane settings a comparison shows and stores.
LANE_KEYS = tuple(s.name for s in SCHEMA.values() if s.lane)

# A lane spec's keys (``compare --lane KEY=VALUE,...``): the lane's numbers and draft model
# by the schema, a logit bias by text (logit_bias=TEXT=BIAS) or by token id
# (logit_bias_id=ID=BIAS), each repeatable, and the output format.
SPEC_SETTINGS = {s.name: s for s in SCHEMA.values() if s.lane and (s.numeric or s.kind in (str, bool))}
SPEC_BIAS_KEYS = ("logit_bias", "logit_bias_id")
CONSTRAINT_KEYS = ("json_schema", "json_object", "regex", "grammar", "constraint")
LANE_SPEC_KEYS = (*SPEC_SETTINGS, *SPEC_BIAS_KEYS)


# --------------------------------------------------------------------------- divergence


def divergence_index(baseline: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where ``other`` departs from ``baseline``.

    None when both are identical. When one is a prefix of the other, the lanes part at
    the shorter one's length (one stopped, the other went on).
    """
    n = min(len(baseline), len(other))
    for i in range(n):
        if baseline[i] != other[i]:
            return i
    return None if len(baseline) == len(other) else n


@dataclass(frozen=True)
class TokenDiff:
    """A token-level diff of one lane against the baseline.

    ``changed[i]`` is True for each token of the lane that has no counterpart in the
    baseline's alignment (inserted or replaced); ``divergence`` is the first index where
    the lane departs (None: identical); ``removed`` counts baseline tokens the lane lacks.
    """
    divergence: int | None
    changed: tuple[bool, ...]
    removed: int

    @property
    def changed_count(self) -> int:
        return sum(self.changed)


def token_diff(baseline: Sequence[int], other: Sequence[int]) -> TokenDiff:
    """Align ``other`` to ``baseline`` (longest matching blocks) and mark its changed tokens.

    Tokens before the divergence point are always unchanged; after it, runs that
    re-align with the baseline (the same phrase a little later) count as unchanged.
    """
    div = divergence_index(baseline, other)
    changed = [False] * len(other)
    removed = 0
    if div is not None:
        sm = difflib.SequenceMatcher(a=list(baseline), b=list(other), autojunk=False)
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag in ("replace", "insert"):
                for j in range(j1, j2):
                    changed[j] = True
            if tag in ("replace", "delete"):
                removed += i2 - i1
        # The divergence point is a change by definition, even if the matcher re-aligned it.
        if div < len(other):
            changed[div] = True
    return TokenDiff(div, tuple(changed), removed)


_UNIT = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")  # a word or mark with the space before it


def _units(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    spans = [m.span() for m in _UNIT.finditer(text)]
    return [text[a:b] for a, b in spans], spans


def text_diff(baseline: str, pieces: Sequence[str], *, align: bool = True) -> TokenDiff:
    """The diff of a lane whose tokenizer differs from the baseline's: token ids mean
    different things there, so the two texts are aligned instead.

    ``pieces`` are the lane's tokens as text (each token's share of the reply, "" for one
    that added nothing yet). The texts are aligned word by word (each word or punctuation
    mark with the space before it: a character-level alignment costs too much on long
    replies); a token is changed when any of its characters lies in a changed word;
    ``align`` False skips the alignment (every token from the divergence on counts as
    changed: cheap, for replies still streaming). The divergence is
    the token holding the first character that departs (the token count when the lane is
    a strict prefix of the baseline); ``removed`` counts baseline characters the lane lacks.
    """
    text = "".join(pieces)
    at = divergence_index(baseline, text)  # works on any sequences: here, characters
    changed = [False] * len(pieces)
    if at is None:
        return TokenDiff(None, tuple(changed), 0)
    owner = [k for k, p in enumerate(pieces) for _ in p]  # character -> its token
    if not align:
        for j in range(at, len(text)):
            changed[owner[j]] = True
        return TokenDiff(owner[at] if at < len(text) else len(pieces), tuple(changed), len(baseline) - at)
    a_units, a_spans = _units(baseline)
    b_units, b_spans = _units(text)
    hit = [False] * len(text)
    removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a_units, b=b_units, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            for j in range(b_spans[j1][0], b_spans[j2 - 1][1]):
                hit[j] = True
        if tag in ("replace", "delete"):
            removed += a_spans[i2 - 1][1] - a_spans[i1][0]
    if at < len(text):
        hit[at] = True
    for j in range(at, len(text)):  # the shared beginning is never a change
        if hit[j]:
            changed[owner[j]] = True
    div = owner[at] if at < len(text) else len(pieces)
    return TokenDiff(div, tuple(changed), removed)


# --------------------------------------------------------------------------- statistics


def distinct_n(tokens: Sequence[int], n: int) -> float | None:
    """Distinct n-grams over all n-grams (1.0: no repetition); None when there are none."""
    if n < 1:
        raise ValueError("n must be at least 1")
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return None
    return len(set(grams)) / len(grams)


def mean_logprob(logprobs: Sequence[float]) -> float | None:
    """Mean natural-log probability per token; None for no tokens."""
    vals = [float(x) for x in logprobs]
    return sum(vals) / len(vals) if vals else None


def perplexity(logprobs: Sequence[float]) -> float | None:
    """exp(-mean log-prob): how surprised the model is by the lane's own text."""
    m = mean_logprob(logprobs)
    if m is None:
        return None
    try:
        return math.exp(-m)
    except OverflowError:
        return math.inf


def lane_stats(tokens: Sequence[int], logprobs: Sequence[float], engine_stats: dict | None = None,
               stop_reason: str | None = None) -> dict:
    """The numbers a lane shows: tokens, tokens/s, stop reason, mean log-prob, perplexity,
    distinct-1 and distinct-2."""
    st = engine_stats or {}
    return {
        "tokens": len(tokens),
        "tokens_per_s": float(st.get("decode_tok_s") or 0.0),
        "stop_reason": stop_reason,
        "mean_logprob": mean_logprob(logprobs),
        "perplexity": perplexity(logprobs),
        "distinct_1": distinct_n(tokens, 1),
        "distinct_2": distinct_n(tokens, 2),
        **({"speculative": st["speculative"]} if st.get("speculative") else {}),
        **({"beam": st["beam"]} if st.get("beam") else {}),  # a beam search lane: its best beam
        # how much of the prompt the KV cache held (a branch reuses its source lane's tokens)
        **({k: st[k] for k in ("prompt_tokens", "cached_tokens")} if st.get("cached_tokens") else {}),
    }


# --------------------------------------------------------------------------- sweeps


def _number(text: str) -> float | int:
    """A typed value: an int when written as one (a 19-digit seed keeps every digit), else a float."""
    try:
        return int(text.strip())
    except ValueError:
        pass
    try:
        v = float(text)
    except ValueError:
        raise SettingsError(f"{text.strip()!r} is not a number") from None
    if not math.isfinite(v):
        raise SettingsError(f"{text.strip()!r} is not a finite number")
    return v


def parse_sweep(text: str, param: str = "temperature") -> list[float | int]:
    """Values of a sweep: a list "0.2, 0.7, 1.2" or an inclusive range "start:stop:step".

    Values are converted to the parameter's type, checked against its bounds and kept in
    order without duplicates. Raises SettingsError (one readable line) on bad input or
    more than MAX_LANES values.
    """
    if param not in SWEEP_KEYS:
        raise SettingsError(f"cannot sweep {param!r}: choose one of {', '.join(SWEEP_KEYS)}")
    if param == "logit_bias_text":
        return _bias_sweep(text)
    if param == "constraint":
        return _switch_sweep(text)
    if param == "draft":
        return _draft_sweep(text)
    setting = SWEEP_PARAMS[param]
    values: list[float | int] = []
    for v in _raw_values(text):
        if setting.kind is int:
            if abs(v - round(v)) > 1e-9:
                raise SettingsError(f"{param} takes whole numbers, got {v:g}")
            v = int(round(v))
        else:
            v = float(round(v, 10))  # 0.2 + 2 * 0.4 prints as 1.0, not 1.0000000000000002
        values.append(setting.check(v))
    return _lane_values(values, "values")


def _lane_values(values: list, what: str) -> list:
    """``values`` without repeats (first kept), one lane each: at least one, at most MAX_LANES."""
    out = list(dict.fromkeys(values))
    if not out:
        raise SettingsError(f"no {what} given")
    if len(out) > MAX_LANES:
        raise SettingsError(f"{len(out)} values; a comparison has at most {MAX_LANES} lanes")
    return out


def _raw_values(text: str) -> list[float]:
    """A list "0.2, 0.7, 1.2" or an inclusive range "start:stop:step" as numbers."""
    text = (text or "").strip()
    if not text:
        raise SettingsError("enter values like 0.2, 0.7, 1.2 or a range like 0.2:1.4:0.4")
    if ":" in text:
        parts = [p.strip() for p in text.split(":")]
        if len(parts) not in (2, 3) or not all(parts):
            raise SettingsError("a range is start:stop:step, e.g. 0.2:1.4:0.4")
        start, stop = _number(parts[0]), _number(parts[1])
        step = _number(parts[2]) if len(parts) == 3 else 1
        if step <= 0:
            raise SettingsError("a range's step must be above 0")
        if stop < start:
            raise SettingsError("a range's stop must not be below its start")
        count = int(math.floor((stop - start) / step + 1e-9)) + 1
        if count > MAX_LANES:
            raise SettingsError(f"that range has {count} values; a comparison has at most {MAX_LANES} lanes")
        return [start + i * step for i in range(count)]
    return [_number(p) for p in text.replace(";", ",").split(",") if p.strip()]


def _bias_sweep(text: str) -> list[str]:
    """'TEXT=B1, B2, …' or 'TEXT=start:stop:step' (biases -100..100, or -inf) as TEXT=B items."""
    word, eq, rest = (text or "").partition("=")
    if not eq or not word.strip() or not rest.strip():
        raise SettingsError("a logit bias sweep is TEXT=biases, e.g. girl=-inf, -5, 0, 5 or girl=-10:10:5")
    items = [p.strip() for p in rest.replace(";", ",").split(",")]
    biases: list[float] = []
    for item in filter(None, items):
        if item.lower() == "-inf":
            biases.append(-math.inf)
        else:
            biases += [round(b, 10) for b in _raw_values(item)]
    out: list[str] = []
    for b in biases:
        if b != -math.inf and (b < -MAX_BIAS or b > MAX_BIAS):
            raise SettingsError(f"a logit bias must be between -{MAX_BIAS:g} and {MAX_BIAS:g} (or -inf), got {b:g}")
        spec = f"{word}={'-inf' if b == -math.inf else f'{b:g}'}"
        parse_logit_bias(spec, lambda t: [0])
        out.append(spec)
    return _lane_values(out, "biases")


def _switch_sweep(text: str) -> list[bool]:
    """'on, off' (or 'off, on', or one of them) as [True, False]."""
    words = {"on": True, "off": False}
    out: list[bool] = []
    for item in filter(None, (p.strip().lower() for p in (text or "").replace(";", ",").split(","))):
        if item not in words:
            raise SettingsError(f"the output format sweeps over on and off, got {item!r}")
        if words[item] not in out:
            out.append(words[item])
    if not out:
        raise SettingsError("enter on, off")
    return out


def _draft_sweep(text: str) -> list[str]:
    """'off, /models/a.gguf, /models/b' as ["", "/models/a.gguf", "/models/b"] (a path each,
    "" for no draft model); whether a path loads is found out when its lane runs."""
    out = ["" if p.lower() == "off" else p for p in (p.strip() for p in (text or "").split(",")) if p]
    if not out:
        raise SettingsError("enter off and draft models' paths, e.g. off, /models/small.gguf")
    return _lane_values(out, "draft models")


def sweep_lanes(base: dict, param: str, values: Sequence) -> list[dict]:
    """One lane settings dict per value: ``base`` with ``param`` replaced. A logit bias
    value (TEXT=B) replaces base's item for the same TEXT and keeps its others; the output
    format's on/off keeps or drops base's constraint. Prompt lookup and a draft model
    exclude each other: a lane swept to one turns the other off."""
    if param not in SWEEP_KEYS:
        raise SettingsError(f"cannot sweep {param!r}")
    if param == "logit_bias_text":
        def text(item: str) -> str:
            return str(item).rpartition("=")[0]
        return [{**base, param: [x for x in base.get(param) or () if text(x) != text(v)] + [v]} for v in values]
    if param == "constraint":
        if True in values and not base.get("constraint"):
            raise SettingsError("lane 1 has no output format to switch on: choose one for it first")
        return [{**base, "constraint": base.get("constraint") if v else None} for v in values]
    if param == "draft":
        return [{**base, "draft": v, **({"lookup": 0} if v else {})} for v in values]
    if param == "lookup":
        return [{**base, "lookup": v, **({"draft": ""} if v else {})} for v in values]
    return [{**base, param: v} for v in values]


def draft_name(path: str | None) -> str:
    """How a lane's draft model is named where space is short: its file or folder name ("off": none)."""
    path = str(path or "").strip().rstrip("/\\")
    return re.split(r"[/\\]", path)[-1] if path else "off"


def lock_seeds(lanes: Sequence[dict], seed: int) -> list[dict]:
    """Every lane with the same seed (so only the other settings differ)."""
    return [{**lane, "seed": int(seed)} for lane in lanes]


# --------------------------------------------------------------------------- labels


def settings_label(settings: dict, differs_from: dict | None = None) -> str:
    """A short label for a lane: 'T 0.7 · top-p 0.9 · seed 7', only the keys that differ
    from ``differs_from`` when given (falls back to temperature)."""
    keys = [k for k in LANE_KEYS if k in settings]
    if differs_from is not None:
        keys = [k for k in keys if settings.get(k) != differs_from.get(k)] or ["temperature"]
    out = []
    for k in keys:
        v = settings.get(k)
        if k == "constraint":  # {"kind", "text"} or None: name the kind only
            v = LABELS.get(v.get("kind"), "?") if isinstance(v, dict) else "free"
        elif k == "logit_bias_text":  # TEXT=BIAS items
            v = ", ".join(v or ()) or "none"
        elif k == "draft":  # a model's path: its file or folder name says enough
            v = draft_name(v)
        elif k == "lookup" and not v:
            v = "off"
        elif isinstance(v, bool):
            v = "on" if v else "off"
        name = SCHEMA[k].short or k
        out.append(f"{name} {v:g}" if isinstance(v, float) else f"{name} {v}")
    return " · ".join(out)


# --------------------------------------------------------------------------- lane specs


def parse_lane_spec(spec: str) -> dict:
    """A lane spec's sampler part ("temperature=0.7,top_k=40,logit_bias=girl=-inf") as
    SamplingParams keyword arguments. Numbers are checked against the schema's ranges;
    logit_bias=TEXT=BIAS items become logit_bias_text, logit_bias_id=ID=BIAS items
    logit_bias; json_schema=, regex=, grammar= (text or @FILE), json_object=1 and
    constraint=none set the constraint. SettingsError (one line) names the bad part."""
    kw: dict = {}
    for part in filter(None, (s.strip() for s in spec.split(","))):
        key, eq, val = part.partition("=")
        key = key.strip().replace("-", "_")
        if eq and key in CONSTRAINT_KEYS:
            if key == "constraint" and val.strip() != "none":
                raise SettingsError(f"constraint= takes only 'none' in lane '{spec}': use json_schema=, regex= or grammar=")
            kw["constraint"] = None if key == "constraint" else from_argument(key, val.strip())
        elif not eq or key not in LANE_SPEC_KEYS:
            raise SettingsError(f"bad lane setting '{part}': use key=value with key one of {', '.join(LANE_SPEC_KEYS)}")
        elif key == "logit_bias":  # TEXT as typed: a space before it is part of the text
            kw["logit_bias_text"] = (*kw.get("logit_bias_text", ()), val)
        elif key == "logit_bias_id":
            kw["logit_bias"] = {**kw.get("logit_bias", {}), **id_bias(val.strip())}
        else:
            try:
                kw[key] = SPEC_SETTINGS[key].from_text(val)
            except SettingsError:  # out of range: the schema's message says so
                raise
            except ValueError:
                raise SettingsError(f"bad value for {key} in lane '{spec}': {val.strip()!r}") from None
    return kw


def id_bias(spec: str) -> dict[int, float]:
    """``ID=BIAS`` (a lane's logit_bias_id) as {ID: BIAS}."""
    def one_id(text: str) -> list[int]:
        try:
            return [int(text.strip())]
        except ValueError:
            raise SettingsError(f"bad logit bias by id {spec!r}: {text.strip()!r} is not a token id (use ID=BIAS)") from None
    return parse_logit_bias(spec, one_id)
