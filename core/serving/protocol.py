"""OpenAI's request shapes, parsed and validated: what a request body asks the engine for.

Fields follow OpenAI (``/v1/completions``, ``/v1/chat/completions``) plus the sampling
fields vLLM and llama.cpp accept (``top_k``, ``min_p``, ``repetition_penalty``), their
constraint fields, and this server's extensions (``lookup``, ``draft``, ``forced_tokens``,
``reply_prefix``, ``logit_bias_text``). Fields this server cannot honour are refused with a
400 naming them (:class:`APIError`), never ignored.
"""
from __future__ import annotations

import json
import math

from core.engine.constraint import Constraint
from core.engine.settings import LLAMADESK, NUMBERS, SCHEMA, SamplingParams, parse_logit_bias
from core.errors import ConstraintError, LlamaDeskError, SettingsError

MAX_TOP_LOGPROBS = 20
MAX_FORCED = 64  # forced_tokens a request may give
MAX_STOP_IDS = 256  # stop_token_ids a request may give
# Every count a request gives is bounded before any work is done for it: a stop string is
# searched for after every token, a logit_bias_text item is tokenized at submit.
MAX_STOPS = 32  # OpenAI takes 4; vLLM clients send a handful
MAX_STOP_CHARS = 1024
MAX_BIAS_TEXTS = 256
MAX_BIAS_TEXT_CHARS = 1024
MAX_CHOICES = 256  # guided_choice strings
REGEX_META = set("\\.+*?()|[]{}^$#&-~")  # escaped in a guided_choice string: it is a literal
# Request fields that change what OpenAI would return; refused unless left at their no-op value.
# (tools, tool_choice and parallel_tool_calls are the chat path's: core.serving.tools_api)
UNSUPPORTED = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
               "echo": (False,), "suffix": ("",), "best_of": (1,), "functions": ([],), "function_call": ("none",)}
# Said instead of "not supported" where another field does the same.
NOT_YET = {"functions": "functions is OpenAI's old form of tools: send tools instead",
           "function_call": "function_call is OpenAI's old form of tool_choice: send tool_choice instead"}


class APIError(LlamaDeskError):
    """An error answered as OpenAI's error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.type = status, param, code, type

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


class QueueFull(APIError):
    def __init__(self, size: int):
        super().__init__(503, f"the server's queue is full ({size} requests waiting): retry later",
                         code="queue_full", type="server_error")


def parse_body(raw: bytes, model_id: str | tuple[str, ...], *, any_model: bool = False) -> dict:
    """The request body as a JSON object naming this server's model (``model_id``: its
    name, or its names), or none; ``any_model``: whatever model it names (llama.cpp and LM
    Studio answer so with one model loaded)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError(400, "the request body nests objects or arrays too deeply to be read") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    n_predict(body)
    model = body.get("model")
    names = (model_id,) if isinstance(model_id, str) else model_id
    if model is not None and model not in names and not any_model:
        raise APIError(404, f"the model '{model}' does not exist here; this server has '{names[0]}'",
                       param="model", code="model_not_found")
    return body


def n_predict(body: dict) -> None:
    """llama.cpp's ``n_predict`` as ``max_tokens`` when the request gives no OpenAI limit
    (-1: no limit but the context's, as llama.cpp means it); APIError 400 naming it."""
    n = body.get("n_predict")
    if n is None or body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or not (n == -1 or n >= 1):
        raise APIError(400, f"n_predict must be -1 (up to the context) or a whole number of at least 1, "
                       f"got {json.dumps(n)[:40]}", param="n_predict")
    if n >= 1:
        body["max_tokens"] = n


def stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage) as the request asks."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, "stream must be true or false", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise APIError(400, "stream_options must be an object", param="stream_options")
    return stream, bool(opts.get("include_usage"))


def _get(body: dict, key: str, kinds: tuple, default=None, *, what: str = "a number"):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in kinds:
        raise APIError(400, f"{key} must be {what}, got {json.dumps(v)}", param=key)
    if not isinstance(v, kinds):
        raise APIError(400, f"{key} must be {what}, got {json.dumps(v)[:40]}", param=key)
    if isinstance(v, float) and not math.isfinite(v):
        raise APIError(400, f"{key} must be a finite number", param=key)
    return v


def _schema_text(schema, field: str) -> str:
    try:
        return json.dumps(schema)
    except RecursionError:  # the body's reader took it; the schema's depth bound says more
        raise APIError(400, f"{field}: the JSON schema nests objects or arrays too deeply", param=field) from None


def _schema(value, field: str) -> Constraint:
    """A JSON schema given as an object or as its JSON text (vLLM's guided_json takes both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise APIError(400, f"{field} must be a JSON schema (an object or its JSON text)", param=field) from None
    if not isinstance(value, (dict, bool)):
        raise APIError(400, f"{field} must be a JSON schema (an object)", param=field)
    return Constraint("json_schema", _schema_text(value, field))


def _text(value, field: str, kind: str) -> Constraint:
    if not isinstance(value, str):
        raise APIError(400, f"{field} must be a string", param=field)
    return Constraint(kind, value)


def _choice(value, field: str) -> Constraint:
    """vLLM's guided_choice: the output is exactly one of the strings, as a regex of
    literal alternatives (every regex metacharacter escaped)."""
    if (not isinstance(value, list) or not value or len(value) > MAX_CHOICES
            or not all(isinstance(c, str) and c for c in value)):
        raise APIError(400, f"{field} must be a list of 1 to {MAX_CHOICES} non-empty strings", param=field)
    return Constraint("regex", "(" + "|".join("".join("\\" + ch if ch in REGEX_META else ch for ch in c)
                                            for c in value) + ")")


def _response_format(rf) -> Constraint | None:
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise APIError(400, 'response_format must be {"type": "text"}, {"type": "json_object"} or '
                       '{"type": "json_schema", "json_schema": {"schema": {...}}}', param="response_format")
    if kind == "json_object":  # llama.cpp's form carries a schema beside the type
        return Constraint("json_object") if rf.get("schema") is None else _schema(rf["schema"], "response_format")
    if kind == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise APIError(400, "response_format.json_schema.schema must be a JSON schema (an object)",
                           param="response_format")
        return Constraint("json_schema", _schema_text(schema, "response_format"))
    return None


def _structured_outputs(so) -> list[tuple[str, Constraint]]:
    """vLLM's structured_outputs object: one of json, regex, choice, grammar, json_object."""
    if not isinstance(so, dict):
        raise APIError(400, "structured_outputs must be an object such as {\"regex\": \"...\"}",
                       param="structured_outputs")
    known = {"json", "regex", "choice", "grammar", "json_object", "disable_fallback", "disable_any_whitespace",
             "disable_additional_properties", "whitespace_pattern"}
    if unknown := sorted(set(so) - known):
        raise APIError(400, f"structured_outputs.{unknown[0]} is not supported by this server", param="structured_outputs")
    if so.get("whitespace_pattern") is not None:
        raise APIError(400, "structured_outputs.whitespace_pattern is not supported by this server",
                       param="structured_outputs")
    f = "structured_outputs"
    makers = {"json": lambda v: _schema(v, f), "regex": lambda v: _text(v, f, "regex"),
              "grammar": lambda v: _text(v, f, "grammar"), "choice": lambda v: _choice(v, f),
              "json_object": lambda v: Constraint("json_object") if v is True else None}
    return [(f, c) for key, make in makers.items() if so.get(key) is not None and (c := make(so[key])) is not None]


# Fields that hold the output to a constraint, by name: llama.cpp's json_schema and
# grammar, this server's regex, vLLM's guided_* (structured_outputs and response_format apart).
CONSTRAINT_FIELDS = {"json_schema": lambda v: _schema(v, "json_schema"),
                     "regex": lambda v: _text(v, "regex", "regex"), "grammar": lambda v: _text(v, "grammar", "grammar"),
                     "guided_json": lambda v: _schema(v, "guided_json"),
                     "guided_regex": lambda v: _text(v, "guided_regex", "regex"),
                     "guided_grammar": lambda v: _text(v, "guided_grammar", "grammar"),
                     "guided_choice": lambda v: _choice(v, "guided_choice")}


def constraint_from_request(body: dict) -> tuple[Constraint | None, str | None]:
    """(the constraint a request asks for, the field that asked); APIError 400 naming the
    field for a malformed one or for more than one. Fields: OpenAI's response_format
    (json_object, json_schema; llama.cpp's json_object with a schema), llama.cpp's
    json_schema and grammar (GBNF, or Lark), regex, vLLM's guided_* and structured_outputs."""
    found: list[tuple[str, Constraint]] = []
    if body.get("response_format") is not None and (c := _response_format(body["response_format"])) is not None:
        found.append(("response_format", c))
    for key, make in CONSTRAINT_FIELDS.items():
        if body.get(key) is not None:
            found.append((key, make(body[key])))
    if body.get("structured_outputs") is not None:
        found += _structured_outputs(body["structured_outputs"])
    if len(found) > 1:
        raise APIError(400, f"give one constraint: {found[0][0]} and {found[1][0]} were both given", param=found[1][0])
    if not found:
        return None, None
    field, c = found[0]
    try:
        return c.validate(), field
    except ConstraintError as e:
        raise APIError(400, f"{field}: {e}", param=field) from None


def _logit_bias(body: dict, vocab: int | None) -> dict[int, float]:
    """OpenAI's ``logit_bias``: {"token id": bias from -100 to 100}, added to the logits
    before the filters (-100 all but bans the token; the string "-inf", an extension, bans it)."""
    lb = body.get("logit_bias")
    if lb is None:
        return {}
    if not isinstance(lb, dict):
        raise APIError(400, "logit_bias must map token ids to numbers", param="logit_bias")
    if vocab is not None and len(lb) > vocab:  # more keys than tokens: some repeat or lie outside
        raise APIError(400, f"logit_bias gives {len(lb)} entries; the vocabulary has {vocab} tokens", param="logit_bias")
    out = {}
    for k, v in lb.items():
        try:
            tok = int(k)
        except (TypeError, ValueError):
            raise APIError(400, f"logit_bias: {json.dumps(k)[:40]} is not a token id", param="logit_bias") from None
        if isinstance(v, str) and v.strip().lower() in ("-inf", "-infinity"):
            v = -math.inf
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise APIError(400, f'logit_bias for token {tok} must be a number from -100 to 100 (or "-inf")',
                           param="logit_bias")
        if tok < 0 or (vocab is not None and tok >= vocab):
            raise APIError(400, f"logit_bias: token id {tok} is outside the vocabulary"
                           + (f" (size {vocab})" if vocab is not None else ""), param="logit_bias")
        out[tok] = float(v)
    return out


def speculation_from_request(body: dict, *, lookup: int = 0, draft: str = "") -> tuple[int, str]:
    """(lookup, draft) for a request: its ``lookup`` (the schema's range) and ``draft`` (true,
    false, or the server's draft model's name) extension fields over the server's defaults
    ``lookup`` / ``draft`` (the draft model's name, "" for none). A field left out keeps
    the server's default, except that turning one kind on turns the other's default off.
    APIError 400 naming the field."""
    given_lookup, given_draft = body.get("lookup"), body.get("draft")
    if given_lookup is not None and (not isinstance(given_lookup, int) or not SCHEMA["lookup"].accepts(given_lookup)):
        raise APIError(400, f"lookup must be {SCHEMA['lookup'].range_text()}, got {json.dumps(given_lookup)[:40]}",
                       param="lookup")
    want = None
    if given_draft is not None:
        if given_draft is False or given_draft == "":
            want = ""
        elif given_draft is True or (isinstance(given_draft, str) and given_draft == draft):
            if not draft:
                raise APIError(400, "this server has no draft model (start it with serve --draft MODEL)", param="draft")
            want = draft
        elif isinstance(given_draft, str):
            has = f"its draft model is '{draft}'" if draft else "it has none (serve --draft MODEL)"
            raise APIError(400, f"draft: this server has no draft model '{given_draft[:80]}': {has}", param="draft")
        else:
            raise APIError(400, f"draft must be true, false or the server's draft model's name, "
                           f"got {json.dumps(given_draft)[:40]}", param="draft")
    if given_lookup and want:
        raise APIError(400, "choose lookup or draft, not both", param="draft")
    if given_lookup:
        return given_lookup, ""
    if want:
        return 0, want
    return (lookup if given_lookup is None else 0), (draft if want is None else "")


def token_ids(body: dict, key: str, vocab: int, *, most: int) -> list[int]:
    """A list of token ids of this vocabulary (``forced_tokens``, vLLM's ``stop_token_ids``);
    APIError 400 naming ``key``."""
    v = body.get(key)
    if v is None:
        return []
    if (not isinstance(v, list) or len(v) > most
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in v)):
        raise APIError(400, f"{key} must be a list of at most {most} token ids from 0 to {vocab - 1}", param=key)
    return list(v)


def _logit_bias_text(body: dict) -> tuple[str, ...]:
    """The ``logit_bias_text`` extension: ["TEXT=BIAS", ...] (BIAS -100 to 100, or -inf), each
    TEXT split into tokens by the served model's tokenizer as plain text, as the app and the
    CLI's --logit-bias do."""
    items = body.get("logit_bias_text")
    if items is None:
        return ()
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise APIError(400, 'logit_bias_text must be a list of "TEXT=BIAS" strings', param="logit_bias_text")
    if len(items) > MAX_BIAS_TEXTS or any(len(i) > MAX_BIAS_TEXT_CHARS for i in items):
        raise APIError(400, f"logit_bias_text takes at most {MAX_BIAS_TEXTS} items of at most "
                       f"{MAX_BIAS_TEXT_CHARS} characters", param="logit_bias_text")
    for spec in items:
        try:
            parse_logit_bias(spec, lambda text: [0])  # the form; the ids come from the tokenizer
        except SettingsError as e:
            raise APIError(400, f"logit_bias_text: {e}", param="logit_bias_text") from None
    return tuple(items)


def sampling_from_request(body: dict, *, default_max_tokens: int, vocab: int | None = None,
                          lookup: int = 0, draft: str = "", max_n: int | None = None) -> list[SamplingParams]:
    """One SamplingParams per choice (``n``) of an OpenAI request body; APIError 400 naming
    the first bad field. Validation is SamplingParams.validate, the same as the CLI's.
    ``vocab``: the model's vocabulary size, to refuse logit_bias ids past it; ``lookup`` /
    ``draft``: the server's speculative defaults (:func:`speculation_from_request`);
    ``max_n``: the most choices a request may ask for (the server's --max-batch), checked
    before any choice's settings are built."""
    for key, ok in UNSUPPORTED.items():
        if key in body and body[key] is not None and body[key] not in ok:
            raise APIError(400, NOT_YET.get(key) or f"{key} is not supported by this server", param=key)
    n = _get(body, "n", (int,), 1, what="a whole number")
    if n < 1:
        raise APIError(400, f"n must be at least 1, got {n}", param="n")
    if max_n is not None and n > max_n:
        raise APIError(400, f"n must be at most {max_n} (the server's --max-batch), got {n}", param="n")
    fields, _ = sampling_fields(body, default_max_tokens)
    params = SamplingParams(**fields, constraint=constraint_from_request(body)[0],
                            logit_bias=_logit_bias(body, vocab), logit_bias_text=_logit_bias_text(body))
    params.lookup, params.draft = speculation_from_request(body, lookup=lookup, draft=draft)
    try:
        params.validate()
    except SettingsError as e:  # what no one field says (lookup and draft both, ...): ranges came first
        name = str(e).split(" ", 1)[0]
        raise APIError(400, str(e), param=name if name in SCHEMA else None) from None
    params = params.resolved()
    # n choices differ: each draws from its own seed, seed + i, so the request reproduces.
    lanes = [SamplingParams.from_dict({**params.to_dict(), "seed": params.seed + i}) for i in range(n)]
    return lanes


# The schema's numbers a request gives by their OpenAI names. lookup has its own parser
# (speculation_from_request): it pairs with draft and the server's defaults.
REQUEST_NUMBERS = tuple(s for s in NUMBERS if LLAMADESK in s.backends and s.name != "lookup")


def sampling_fields(body: dict, default_max_tokens: int) -> tuple[dict, str]:
    """(the sampler settings a request gives, as SamplingParams keywords; the field that
    gave the token limit: max_completion_tokens or max_tokens). Each number's kind and
    declared range (core.engine.settings.SCHEMA) are checked here: APIError 400 naming the
    field. A field left out takes OpenAI's default where the schema names one."""
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise APIError(400, "stop must be a string or a list of strings", param="stop")
    if len(stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise APIError(400, f"stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters",
                       param="stop")
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    kw: dict = {"stop": tuple(stop)}
    for s in REQUEST_NUMBERS:
        key, default = s.request_field, (s.default if s.api_default is None else s.api_default)
        if s.name == "max_new_tokens":
            key, default = max_key, default_max_tokens
        whole = s.kind is int
        v = _get(body, key, (int,) if whole else (int, float), default, what="a whole number" if whole else "a number")
        if v is not None and v == s.api_off:
            v = s.off
        try:
            kw[s.name] = s.check(v, key)
        except SettingsError as e:
            raise APIError(400, str(e), param=key) from None
    return kw, max_key


def completion_logprobs(body: dict) -> int | None:
    """A completion's ``logprobs``: None, or how many alternatives to report (0 to 20)."""
    lp = body.get("logprobs")
    if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_TOP_LOGPROBS):
        raise APIError(400, f"logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}", param="logprobs")
    return lp


def chat_logprobs(body: dict) -> int | None:
    """A chat's ``logprobs`` / ``top_logprobs``: None (no logprobs), or how many alternatives."""
    lp = body.get("logprobs")
    if lp is not None and not isinstance(lp, bool):
        raise APIError(400, "logprobs must be true or false", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise APIError(400, f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}", param="top_logprobs")
    if top and not lp:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if lp else None


def requested_max_tokens(body: dict) -> int | None:
    """The token limit a request gives, when it is a positive whole number (else None: the
    sampler's validation names what is wrong with it)."""
    asked = body.get("max_completion_tokens")
    asked = body.get("max_tokens") if asked is None else asked
    return asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else None


def text_content(content, where: str) -> str:
    """A message's content as one text: a string, or a list of text parts (the only parts
    served); APIError 400 naming ``where`` otherwise."""
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise APIError(400, f"{where}.content: only text parts are supported", param="messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise APIError(400, f"{where}.content must be a string", param="messages")
    return content


def messages_from_request(body: dict, tool_message=None) -> list[dict]:
    """The conversation; ``tool_message(m, i)`` checks a ``tool`` message or an assistant's
    ``tool_calls`` (the chat path's :func:`core.serving.tools_api.tool_message`; without
    it they are refused)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if isinstance(m, dict) and (m.get("role") == "tool" or (m.get("role") == "assistant" and m.get("tool_calls"))):
            if tool_message is None:
                raise APIError(400, f"messages[{i}]: tool turns belong to a chat request", param="messages")
            out.append(tool_message(m, i))
            continue
        if isinstance(m, dict) and m.get("role") == "function":
            raise APIError(400, f"messages[{i}].role 'function' is OpenAI's old form: send a 'tool' message",
                           param="messages")
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise APIError(400, f"messages[{i}] needs a role of system, user, assistant or tool", param="messages")
        content = text_content(m.get("content"), f"messages[{i}]")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return out


def check_context(prompt_tokens: int, max_tokens: int | None, context: int, *, what: str) -> None:
    """APIError 400 (OpenAI's ``context_length_exceeded``) naming the limit when ``what``
    (the messages, the prompt) plus ``max_tokens`` cannot fit: nothing is dropped to make
    room, the client decides what to cut."""
    if prompt_tokens >= context:
        raise APIError(400, f"this model's maximum context length is {context} tokens, but {what} "
                       f"{'are' if what.endswith('s') else 'is'} {prompt_tokens} tokens: shorten {what}",
                       param="messages" if what == "the messages" else "prompt", code="context_length_exceeded")
    if max_tokens is not None and prompt_tokens + max_tokens > context:
        raise APIError(400, f"this model's maximum context length is {context} tokens, but {prompt_tokens} in "
                       f"{what} plus max_tokens {max_tokens} come to {prompt_tokens + max_tokens}: "
                       f"shorten {what} or lower max_tokens", param="max_tokens", code="context_length_exceeded")
