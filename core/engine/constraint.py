"""What a lane's output must match: a JSON schema, any JSON object, a regular expression
or a grammar (GBNF or Lark), declared as a :class:`Constraint` (kind + text).

This is the declaration only: it travels in SamplingParams and events and is checked here
without a tokenizer (llguidance compiles it; no torch). Holding a lane to it while decoding
(bitmasks, per-lane parser state) is :mod:`core.engine.constrain`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance as llg

from core.errors import ConstraintError, one_line
from core.limits import read_limited

#: json_schema: a JSON schema (text); json_object: any JSON object (no text);
#: regex: the whole output matches it; grammar: GBNF (llama.cpp) or Lark (llguidance) text.
KINDS = ("json_schema", "json_object", "regex", "grammar")
LABELS = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regular expression",
          "grammar": "grammar"}
MAX_CONSTRAINT_CHARS = 100_000
# A regular expression is a pattern, not a document: one longer than this is refused (a
# 100,000-character literal costs 0.2 s for its first mask and 30 ms for every one after
# at a 128k vocabulary, a decode step's worth of masking for nothing anyone writes).
MAX_REGEX_CHARS = 10_000
MAX_SCHEMA_DEPTH = 64  # objects and arrays nested in a JSON schema (llguidance's own recursion gives out near 500)
# llguidance's resource limits (its defaults in brackets). What one constraint may cost is
# bounded by counts, never by the clock: lexer states take 1-2 kB each (250,000 -> 100 MB at
# most here), and the grammar's size in symbols (500,000).
PARSER_LIMITS = {"max_lexer_states": 50_000, "max_grammar_size": 200_000}
# A new constraint is walked this many tokens ahead before a reply starts (always the
# lowest allowed token): a regex like a{99999999} compiles and gives its first mask, then
# exhausts the lexer at the second token; this way it is a ConstraintError up front.
DRY_RUN_TOKENS = 4
_ANY_OBJECT = '{"type": "object"}'
# One space after ":" and ",", none elsewhere: with llguidance's default (any whitespace
# between tokens) small models wander in newlines until max tokens and never close the
# object. A schema's own "x-guidance" options still override these.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """What a lane's output must match: ``kind`` is one of KINDS, ``text`` its source."""

    kind: str
    text: str = ""

    def validate(self) -> "Constraint":
        """Raise ConstraintError for an unknown kind, empty or oversized text; return self.
        (Whether the text compiles is checked against a tokenizer: :meth:`Vocabulary.check`.)"""
        if self.kind not in KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if not isinstance(self.text, str):
            raise ConstraintError(f"the {LABELS[self.kind]} must be text")
        if self.kind != "json_object" and not self.text.strip():
            raise ConstraintError(f"the {LABELS[self.kind]} is empty")
        most = MAX_REGEX_CHARS if self.kind == "regex" else MAX_CONSTRAINT_CHARS
        if len(self.text) > most:
            raise ConstraintError(f"the {LABELS[self.kind]} is {len(self.text):,} characters; "
                                  f"at most {most:,} are accepted")
        return self

    @classmethod
    def from_value(cls, value) -> "Constraint | None":
        """None, a Constraint, or its dict form ({"kind", "text"}); ConstraintError otherwise."""
        if value is None or isinstance(value, Constraint):
            return value
        if isinstance(value, dict) and isinstance(value.get("kind"), str):
            return cls(value["kind"], value.get("text") or "")
        raise ConstraintError("a constraint is an object with a kind and a text")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "text": self.text}

    def describe(self) -> str:
        return LABELS.get(self.kind, self.kind)

    def grammar(self) -> str:
        """This constraint as an llguidance grammar (not yet checked against a vocabulary)."""
        self.validate()
        if self.kind in ("json_schema", "json_object"):
            text = self.text if self.kind == "json_schema" else _ANY_OBJECT
            depth = json_depth(text)
            if depth > MAX_SCHEMA_DEPTH:
                raise ConstraintError(f"the JSON schema is nested {depth:,} levels deep; "
                                      f"at most {MAX_SCHEMA_DEPTH} are accepted")
            try:
                schema = json.loads(text)
            except (ValueError, RecursionError) as e:
                raise ConstraintError(f"the JSON schema is not valid JSON: {one_line(e)}") from None
            if not isinstance(schema, (dict, bool)):
                raise ConstraintError("a JSON schema must be a JSON object")
            try:
                return llg.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
            except (ValueError, TypeError) as e:
                raise ConstraintError(f"the JSON schema cannot be compiled: {one_line(e)}") from None
        if self.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(self.text)
        try:  # GBNF is converted to Lark; Lark passes through unchanged
            return llg.grammar_from("gbnf", self.text)
        except ValueError as e:
            raise ConstraintError(f"the grammar cannot be read: {one_line(e)}") from None


def json_depth(text: str) -> int:
    """How deeply objects and arrays nest in JSON ``text`` (brackets inside strings do not
    count); counted without parsing, so a schema nested 100,000 deep costs nothing."""
    depth = most = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            most = max(most, depth)
        elif ch in "]}":
            depth -= 1
    return most


_LIMITS = None


def parser_limits():
    """llguidance's LLParserLimits with PARSER_LIMITS (built once)."""
    global _LIMITS
    if _LIMITS is None:
        _LIMITS = llg.LLParserLimits(**PARSER_LIMITS)
    return _LIMITS


def first_lines(message: str) -> str:
    """llguidance's message as one line: where, then its "error:" line (the source excerpt
    and caret between them mean nothing on one line)."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not lines:
        return "unknown error"
    why = next((ln for ln in lines[1:] if ln.startswith("error:")), "")
    return lines[0].rstrip(":") + (f" ({why[6:].strip()})" if why else "")



def from_argument(kind: str, value: str) -> Constraint:
    """A Constraint from a command-line value: the text itself, or ``@PATH`` for a file's
    (read up to MAX_CONSTRAINT_CHARS; ConstraintError for a missing or unreadable file)."""
    if kind == "json_object":
        return Constraint("json_object")
    text = value
    if value.startswith("@"):
        data = read_limited(value[1:], MAX_CONSTRAINT_CHARS * 4, error=ConstraintError)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConstraintError(f"the {LABELS.get(kind, kind)} file {value[1:]} is not UTF-8 text") from None
    return Constraint(kind, text).validate()


def request_fields(constraint: Constraint | None) -> dict:
    """The OpenAI-style request fields that ask a server for ``constraint``: response_format
    for JSON, and the regex / grammar extension fields (LlamaDesk's serve, llama.cpp)."""
    if constraint is None:
        return {}
    if constraint.kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if constraint.kind == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "output", "schema": json.loads(constraint.text)}}}
    return {constraint.kind: constraint.text}


def from_editor(kind: str, text: str) -> Constraint | None:
    """What a settings editor's kind (a KINDS entry, "" for off) and text ask for: None
    when off or the text is still empty (nothing to hold the output to yet)."""
    if not kind or (kind != "json_object" and not text.strip()):
        return None
    return Constraint(kind, "" if kind == "json_object" else text)


def syntax_error(constraint: Constraint) -> str:
    """Why ``constraint`` cannot compile, checked without a vocabulary (for a settings
    panel, as the user types); "" when it can. A vocabulary may still refuse it
    (:meth:`Vocabulary.check`)."""
    try:
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(constraint.grammar(), limits=parser_limits())
    except ConstraintError as e:
        return str(e)
    return f"the {constraint.describe()} cannot be compiled: {first_lines(messages[0])}" if is_error else ""
