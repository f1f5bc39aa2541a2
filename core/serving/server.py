"""An OpenAI-compatible HTTP server over one model: ``python -m core serve MODEL``.

Starlette on uvicorn, streaming as server-sent events. One scheduler thread owns the
engine and runs :meth:`core.engine.engine.Engine.serve`, so a request that arrives while others
decode joins their batch at the next step (continuous batching); ``n > 1`` is one request
whose lanes share a prefill. Requests that speculate (prompt lookup or the server's draft
model: ``lookup`` / ``draft``, defaults ``serve --lookup N`` / ``--draft MODEL``) run in
batches of their own, through the engine's speculative loop: they join no running plain
batch and no plain request joins theirs, and one waits for the other's batch to end. A client that goes away sets its request's cancel event,
which the engine checks every decode step.

Requests and replies follow OpenAI's shapes (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``) plus the sampling fields vLLM and llama.cpp accept (``top_k``,
``min_p``, ``repetition_penalty``) and vLLM's ``return_token_ids`` / ``stop_reason``.
Fields this server cannot honour are refused with a 400 naming them, never ignored.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from core.engine.engine import Done, Engine, Joining, Prefilled, Token
from core.engine.lanes import tokenizer_fingerprint
from core.engine.constrain import Constraint
from core.errors import ConstraintError, LlamaDeskError, SettingsError
from core.prompt.prompting import render_chat, strips_reply_space
from core.engine.sampling import MAX_LOOKUP, SamplingParams

MAX_TOP_LOGPROBS = 20
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "abort"}
# Request fields that change what OpenAI would return; refused unless left at their no-op value.
UNSUPPORTED = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
               "echo": (False,), "suffix": ("",), "best_of": (1,), "tools": ([],), "tool_choice": ("none",),
               "functions": ([],), "function_call": ("none",)}


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


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- the scheduler thread ---------------------------------------------------------------------


@dataclass
class Job:
    """One HTTP request's generation: its lanes' events go to ``events`` on the loop."""
    prompt: list[int]
    lanes: list[SamplingParams]
    strip_leading_space: bool = False
    inspect: int = 0
    stop_ids: frozenset[int] = frozenset()  # this request's: a chat adds its format's end of turn
    forced: tuple[int, ...] = ()  # the reply's first tokens, given (a branch: forced_tokens)
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    done: list[Done | None] = field(default_factory=list)

    @property
    def speculative(self) -> bool:
        """Whether any lane drafts (prompt lookup or a draft model)."""
        return any(q.speculative for q in self.lanes)

    def emit(self, item) -> None:
        """Hand (choice, event), an exception, or None (finished) to the request's coroutine."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class Scheduler:
    """Owns the engine on one thread; jobs wait in a bounded queue and join the running
    batch while rows are free.

    Args:
        max_batch: most lanes decoded together.
        max_queue: most jobs waiting for rows; more are refused (:class:`QueueFull`).
        on_done: called on the scheduler thread with each finished job (tests, metrics).
    """

    def __init__(self, engine: Engine, *, max_batch: int = 16, max_queue: int = 64,
                 on_done: Callable[[Job], None] | None = None):
        self.engine, self.max_batch, self.max_queue = engine, max_batch, max_queue
        self.on_done = on_done
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._lanes: dict[int, tuple[Job, int]] = {}  # engine lane -> (job, choice index)
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="llamadesk-serve", daemon=True)

    @property
    def active_lanes(self) -> int:
        """Lanes decoding now."""
        return len(self._lanes)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Cancel everything, end the thread."""
        with self._cond:
            self._stopping = True
            for job in list(self._waiting):
                job.emit(None)
            self._waiting.clear()
            for job, _ in list(self._lanes.values()):
                job.cancel.set()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def submit(self, job: Job) -> None:
        if len(job.lanes) > self.max_batch:
            raise APIError(400, f"n must be at most {self.max_batch} (the server's --max-batch)", param="n")
        job.lanes = self.engine.check_request(job.prompt, job.lanes)
        job.done = [None] * len(job.lanes)
        with self._cond:
            if self._stopping:
                raise APIError(503, "the server is shutting down", type="server_error")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(len(self._waiting))
            self._waiting.append(job)
            self._cond.notify()

    def _main(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                speculative = self._waiting[0].speculative
            try:
                if speculative:
                    events = self._speculative_batch()
                else:
                    events = self.engine.serve(self._admit, max_rows=self.max_batch)
                for ev in events:
                    self._dispatch(ev)
            except Exception as e:  # a bug or out of memory: fail the requests, keep serving
                self.engine.cache.reset()  # it may hold a half-written step: never reuse it
                with self._cond:
                    jobs = {id(j): j for j, _ in self._lanes.values()}.values()
                    self._lanes.clear()
                for job in jobs:
                    job.emit(e)

    def _speculative_batch(self):
        """The speculative jobs at the head of the queue (as many lanes as fit), decoded
        together from the start by the engine's speculative loop; nobody joins later."""
        from core.engine.speculative import speculative_loop
        joining = self._admit(self.max_batch, 0, speculative=True)
        return speculative_loop(self.engine, joining) if joining else iter(())

    def _admit(self, free: int, next_lane: int, *, speculative: bool = False) -> list[Joining]:
        """Start the jobs at the head of the queue that fit in ``free`` lanes and are of the
        kind asked for: a speculative job at the head waits for the plain batch to end
        (then it runs, with the speculative jobs behind it), and the other way round."""
        out = []
        with self._cond:
            while self._waiting and not self._stopping:
                job = self._waiting[0]
                if job.cancel.is_set():  # its client left while it waited
                    self._waiting.popleft()
                    job.emit(None)
                    continue
                if len(job.lanes) > free or job.speculative != speculative:
                    break
                self._waiting.popleft()
                for c in range(len(job.lanes)):
                    self._lanes[next_lane + c] = (job, c)
                next_lane += len(job.lanes)
                free -= len(job.lanes)
                out.append(Joining(job.prompt, job.lanes, job.cancel, job.strip_leading_space, job.inspect,
                                   job.stop_ids, job.forced))
        return out

    def _dispatch(self, ev) -> None:
        lane = ev.lanes[0] if isinstance(ev, Prefilled) else ev.lane
        job, choice = self._lanes[lane]
        if isinstance(ev, Prefilled):
            return
        job.emit((choice, ev))
        if isinstance(ev, Done):
            job.done[choice] = ev
            del self._lanes[lane]
            if all(d is not None for d in job.done):
                job.emit(None)
                if self.on_done is not None:
                    self.on_done(job)


# -- request parsing ------------------------------------------------------------------------


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


# SamplingParams' names in its messages, as the API names them.
_API_NAMES = {"max_new_tokens": "max_tokens"}


def _schema_text(schema, field: str) -> str:
    try:
        return json.dumps(schema)
    except RecursionError:  # the body's reader took it; the schema's depth bound says more
        raise APIError(400, f"{field}: the JSON schema nests objects or arrays too deeply", param=field) from None


def constraint_from_request(body: dict) -> tuple[Constraint | None, str | None]:
    """(the constraint a request asks for, the field that asked); APIError 400 naming the
    field for a malformed one or for more than one. Fields: OpenAI's response_format
    (json_object, json_schema), llama.cpp's json_schema and grammar (GBNF, or Lark), regex."""
    found: list[tuple[str, Constraint]] = []
    rf = body.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise APIError(400, 'response_format must be {"type": "text"}, {"type": "json_object"} or '
                           '{"type": "json_schema", "json_schema": {"schema": {...}}}', param="response_format")
        if kind == "json_object":
            found.append(("response_format", Constraint("json_object")))
        elif kind == "json_schema":
            js = rf.get("json_schema")
            schema = js.get("schema") if isinstance(js, dict) else None
            if not isinstance(schema, (dict, bool)):
                raise APIError(400, "response_format.json_schema.schema must be a JSON schema (an object)",
                               param="response_format")
            found.append(("response_format", Constraint("json_schema", _schema_text(schema, "response_format"))))
    if body.get("json_schema") is not None:
        if not isinstance(body["json_schema"], (dict, bool)):
            raise APIError(400, "json_schema must be a JSON schema (an object)", param="json_schema")
        found.append(("json_schema", Constraint("json_schema", _schema_text(body["json_schema"], "json_schema"))))
    for key in ("regex", "grammar"):
        if body.get(key) is not None:
            if not isinstance(body[key], str):
                raise APIError(400, f"{key} must be a string", param=key)
            found.append((key, Constraint(key, body[key])))
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
    """(lookup, draft) for a request: its ``lookup`` (0 to MAX_LOOKUP) and ``draft`` (true,
    false, or the server's draft model's name) extension fields over the server's defaults
    ``lookup`` / ``draft`` (the draft model's name, "" for none). A field left out keeps
    the server's default, except that turning one kind on turns the other's default off.
    APIError 400 naming the field."""
    given_lookup, given_draft = body.get("lookup"), body.get("draft")
    if given_lookup is not None:
        if isinstance(given_lookup, bool) or not isinstance(given_lookup, int) or not 0 <= given_lookup <= MAX_LOOKUP:
            raise APIError(400, f"lookup must be a whole number from 0 (off) to {MAX_LOOKUP}, "
                           f"got {json.dumps(given_lookup)[:40]}", param="lookup")
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


MAX_FORCED = 64  # forced_tokens a request may give


def _token_ids(body: dict, key: str, vocab: int, *, most: int) -> list[int]:
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
    from core.engine.sampling import parse_logit_bias
    items = body.get("logit_bias_text")
    if items is None:
        return ()
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise APIError(400, 'logit_bias_text must be a list of "TEXT=BIAS" strings', param="logit_bias_text")
    for spec in items:
        try:
            parse_logit_bias(spec, lambda text: [0])  # the form; the ids come from the tokenizer
        except SettingsError as e:
            raise APIError(400, f"logit_bias_text: {e}", param="logit_bias_text") from None
    return tuple(items)


def sampling_from_request(body: dict, *, default_max_tokens: int, vocab: int | None = None,
                          lookup: int = 0, draft: str = "") -> list[SamplingParams]:
    """One SamplingParams per choice (``n``) of an OpenAI request body; APIError 400 naming
    the first bad field. Validation is SamplingParams.validate, the same as the CLI's.
    ``vocab``: the model's vocabulary size, to refuse logit_bias ids past it; ``lookup`` /
    ``draft``: the server's speculative defaults (:func:`speculation_from_request`)."""
    for key, ok in UNSUPPORTED.items():
        if key in body and body[key] is not None and body[key] not in ok:
            raise APIError(400, f"{key} is not supported by this server", param=key)
    num = (int, float)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise APIError(400, "stop must be a string or a list of strings", param="stop")
    top_k = _get(body, "top_k", (int,), 0, what="a whole number")
    n = _get(body, "n", (int,), 1, what="a whole number")
    if n < 1:
        raise APIError(400, f"n must be at least 1, got {n}", param="n")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _get(body, key, (int,), default_max_tokens, what="a whole number")
    params = SamplingParams(
        temperature=_get(body, "temperature", num, 1.0), top_p=_get(body, "top_p", num, 1.0),
        top_k=0 if top_k == -1 else top_k,  # vLLM's "off"
        min_p=_get(body, "min_p", num, 0.0), repetition_penalty=_get(body, "repetition_penalty", num, 1.0),
        seed=_get(body, "seed", (int,), None, what="a whole number"), max_new_tokens=max_tokens, stop=tuple(stop),
        constraint=constraint_from_request(body)[0], logit_bias=_logit_bias(body, vocab),
        logit_bias_text=_logit_bias_text(body))
    params.lookup, params.draft = speculation_from_request(body, lookup=lookup, draft=draft)
    try:
        params.validate()
    except SettingsError as e:
        msg, name = str(e), str(e).split(" ", 1)[0]
        if name in _API_NAMES:
            msg, name = msg.replace(name, key, 1), key
        raise APIError(400, msg, param=name if name in SamplingParams.KEYS or name in (key, "stop") else None) from None
    params = params.resolved()
    # n choices differ: each draws from its own seed, seed + i, so the request reproduces.
    lanes = [SamplingParams.from_dict({**params.to_dict(), "seed": params.seed + i}) for i in range(n)]
    return lanes


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise APIError(400, f"messages[{i}] needs a role of system, user or assistant", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string", param="messages")
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


# -- responses ------------------------------------------------------------------------------


class _Reply:
    """Builds one request's response objects (whole or as chunks) from engine events."""

    def __init__(self, server: "ServerState", body: dict, chat: bool, job: Job, top: int | None):
        self.server, self.chat, self.job, self.body = server, chat, job, body
        self.top = top  # None: no logprobs; k: the chosen token plus the k most likely
        self.token_ids = bool(body.get("return_token_ids"))
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.offsets = [0] * len(job.lanes)

    def head(self) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.server.model_id,
                "system_fingerprint": self.server.fingerprint}

    def _entry(self, tok: Token) -> dict:
        # "id" (an extension) names each token by id, as a branch at an alternative needs:
        # two tokens may spell the same text.
        def one(piece: str, lp: float, tid: int) -> dict:
            return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8")), "id": tid}
        e = one(tok.piece, tok.logprob, tok.token_id)
        alts = []
        if self.top and tok.top:
            names = tok.top["pieces"]
            alts = [(names[i], math.log(p), i) for i, p in tok.top["raw"][: self.top]]
        e["top_logprobs"] = [one(p, lp, i) for p, lp, i in alts]
        return e

    def logprobs(self, toks: list[Token], choice: int) -> dict | None:
        if self.top is None:
            return None
        entries = [self._entry(t) for t in toks]
        if self.chat:
            return {"content": entries}
        offsets = []
        for t in toks:
            offsets.append(self.offsets[choice])
            self.offsets[choice] += len(t.piece)
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries]
                if self.top else None, "text_offset": offsets,
                # an extension: the alternatives' ids, in top_logprobs' order (a dict keyed by text cannot hold them)
                **({"top_token_ids": [[a["id"] for a in e["top_logprobs"]] for e in entries]} if self.top else {})}

    def stop_reason(self, d: Done):
        """vLLM's stop_reason: the stop string or token id that ended the choice."""
        if d.stop_reason == "eos":
            return d.stop_token
        if d.stop_reason == "stop":
            text = self.server.tokenizer.decode(d.tokens)
            hits = [(text.find(s), s) for s in d.params.stop if s in text]
            return min(hits)[1] if hits else None
        return None

    def failure(self, done: Done | None = None) -> APIError | None:
        """The error a choice that stopped on one (``done``, else the first such) answers
        with: a constraint that went past the grammar engine's limits mid-reply is a 400
        naming the request's constraint field; anything else (NaN logits) a 500."""
        failed = [d for d in ([done] if done is not None else self.job.done) if d is not None and d.stop_reason == "error"]
        if not failed:
            return None
        d = failed[0]
        msg = d.error or "the reply stopped on an error"
        if d.params.constraint is not None:
            field = constraint_from_request(self.body)[1]
            return APIError(400, f"{field}: {msg}", param=field)
        return APIError(500, f"generation failed: {msg}", type="server_error")

    def usage(self) -> dict:
        done = [d for d in self.job.done if d is not None]
        completion = sum(len(d.tokens) + (d.stop_token is not None) for d in done)
        out = {"prompt_tokens": len(self.job.prompt), "completion_tokens": completion,
               "total_tokens": len(self.job.prompt) + completion}
        if done and done[0].stats is not None:  # OpenAI's field: prompt tokens the KV cache held
            out["prompt_tokens_details"] = {"cached_tokens": done[0].stats.cached_tokens}
        spec = [s for s in (speculative_stats(d) for d in done) if s is not None]
        if spec:  # all choices together; each choice's own are on the choice
            drafted, accepted = sum(s["drafted"] for s in spec), sum(s["accepted"] for s in spec)
            out["speculative"] = {"kind": spec[0]["kind"], "lookup": spec[0]["lookup"], "draft": spec[0]["draft"],
                                  "drafted": drafted, "accepted": accepted,
                                  "acceptance_rate": accepted / drafted if drafted else 0.0,
                                  "forwards": sum(s["forwards"] for s in spec)}
        return out

    def whole(self, tokens: list[list[Token]]) -> dict:
        choices = []
        for i, d in enumerate(self.job.done):
            c: dict[str, Any] = {"index": i}
            if self.chat:
                c["message"] = {"role": "assistant", "content": d.text}
            else:
                c["text"] = d.text
            c["logprobs"] = self.logprobs(tokens[i], i)
            c["finish_reason"] = FINISH[d.stop_reason]
            c["stop_reason"] = self.stop_reason(d)
            if (spec := speculative_stats(d)) is not None:
                c["speculative"] = spec
            if self.token_ids:
                c["token_ids"] = list(d.tokens)
                c["prompt_token_ids"] = list(self.job.prompt)
            choices.append(c)
        return {**self.head(), "choices": choices, "usage": self.usage()}

    def chunk(self, choice: int, *, text: str = "", tok: Token | None = None, done: Done | None = None,
              first: bool = False) -> dict:
        c: dict[str, Any] = {"index": choice}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if tok is not None:
                delta["content"] = text
            c["delta"] = delta
        else:
            c["text"] = text
        c["logprobs"] = self.logprobs([tok], choice) if tok is not None else None
        c["finish_reason"] = FINISH[done.stop_reason] if done is not None else None
        if done is not None:
            c["stop_reason"] = self.stop_reason(done)
            if (spec := speculative_stats(done)) is not None:
                c["speculative"] = spec
        if self.token_ids:
            c["token_ids"] = [tok.token_id] if tok is not None else []
            if first:
                c["prompt_token_ids"] = list(self.job.prompt)
        return {**self.head(), "object": self.object + ".chunk" if self.chat else self.object, "choices": [c]}


def speculative_stats(d: Done) -> dict | None:
    """How one choice's drafting went (None when it did not draft): the kind (lookup or
    draft), drafted and accepted tokens, the acceptance rate, verification forwards and
    the engine's speed-up estimate."""
    sp = d.stats.speculative if d.stats is not None else None
    if not sp:
        return None
    return {"kind": sp["kind"], "lookup": sp["lookup"], "draft": sp["draft"] or None, "drafted": sp["drafted"],
            "accepted": sp["accepted"], "acceptance_rate": sp["acceptance"], "mean_draft": sp["mean_draft"],
            "forwards": sp["forwards"], "speedup": sp["speedup"]}


# -- the app --------------------------------------------------------------------------------


class ServerState:
    """What the app serves: one loaded model behind a scheduler.

    ``lookup``: requests' default prompt lookup (0: off). ``draft``: a draft model's path,
    loaded now by the app's own draft loader and listed by its name; requests draft with it
    by default (DraftModelError when its vocabulary differs from the model's, a
    CheckpointError when it cannot be read). Requests never load models of their own.
    ``compile``: decode through torch.compile (``serve --compile``; :mod:`core.model.decode_step`).
    """

    def __init__(self, loaded, *, model_id: str | None = None, api_key: str | None = None,
                 max_batch: int = 16, max_queue: int = 64, on_done: Callable[[Job], None] | None = None,
                 lookup: int = 0, draft: str | None = None, compile: bool | str = False):
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.model_id = model_id or loaded.name
        self.api_key = api_key or None
        self.engine = Engine(loaded.model, loaded.tokenizer, stop_ids=loaded.stop_ids, compile=compile)
        if (isinstance(lookup, bool) or not isinstance(lookup, int) or not 0 <= lookup <= MAX_LOOKUP):
            raise SettingsError(f"--lookup must be a whole number from 0 (off) to {MAX_LOOKUP}, got {lookup!r}")
        if lookup and draft:
            raise SettingsError("choose --lookup or --draft, not both")
        self.lookup, self.draft = int(lookup), ""
        if draft:
            from core.worker.worker import draft_loader
            self.draft = draft_loader(self.engine, named=True)(draft).name
        self.scheduler = Scheduler(self.engine, max_batch=max_batch, max_queue=max_queue, on_done=on_done)
        info = loaded.info
        self.fingerprint = "fp_llamadesk_" + "_".join(
            str(info.get(k, "?")) for k in ("dtype", "device")).replace(":", "")
        self.created = int(time.time())

    def model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "llamadesk",
                "max_model_len": self.engine.max_context,
                "llamadesk": {"chat_format": self.loaded.chat_format.name, "vocab_size": self.loaded.model.args.vocab_size,
                              "tokenizer": tokenizer_fingerprint(self.tokenizer, self.loaded.model.args.vocab_size),
                              # the defaults of the lookup / draft request fields
                              "speculative": {"lookup": self.lookup, "draft": self.draft or None}}}


def build_app(state: ServerState, *, on_startup: Callable[[], None] | None = None):
    """The Starlette app serving ``state``; its lifespan starts and stops the scheduler."""
    from contextlib import asynccontextmanager

    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def error(e: APIError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    def check_key(request: Request) -> None:
        if state.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode(), state.api_key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    async def read_body(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise APIError(400, "the request body nests objects or arrays too deeply to be read") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != state.model_id:
            raise APIError(404, f"the model '{model}' does not exist here; this server has '{state.model_id}'",
                           param="model", code="model_not_found")
        return body

    async def models(request: Request):
        try:
            check_key(request)
        except APIError as e:
            return error(e)
        return JSONResponse({"object": "list", "data": [state.model_card()]})

    async def model(request: Request):
        try:
            check_key(request)
            if request.path_params["name"] != state.model_id:
                raise APIError(404, f"the model '{request.path_params['name']}' does not exist here",
                               param="model", code="model_not_found")
        except APIError as e:
            return error(e)
        return JSONResponse(state.model_card())

    def completion_job(body: dict) -> tuple[Job, int | None]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = state.tokenizer.encode(prompt, bos=True)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise APIError(400, "prompt must be one string or one list of token ids", param="prompt")
        ids = ids + _token_ids(body, "reply_prefix", state.engine.model.args.vocab_size, most=state.engine.max_context)
        lp = body.get("logprobs")
        if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_TOP_LOGPROBS):
            raise APIError(400, f"logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}", param="logprobs")
        vocab = state.engine.model.args.vocab_size
        forced = _token_ids(body, "forced_tokens", vocab, most=MAX_FORCED)
        stops = _token_ids(body, "stop_token_ids", vocab, most=256)
        if len(ids) + len(forced) >= state.engine.max_context:
            check_context(len(ids) + len(forced), None, state.engine.max_context, what="the prompt")
        lanes = sampling_from_request(body, default_max_tokens=16, vocab=vocab, lookup=state.lookup, draft=state.draft)
        # A completion stops only on the model's own stop tokens (and stop_token_ids: a chat
        # reply continued as a completion ends at its turn's end): no chat turn to end.
        return Job(ids, lanes, False, lp or 0, frozenset(state.loaded.stop_ids) | frozenset(stops), tuple(forced)), lp

    def chat_job(body: dict) -> tuple[Job, int | None]:
        msgs = _messages(body)
        try:
            ids = render_chat(state.loaded.chat_format, msgs)
        except SettingsError as e:
            raise APIError(400, str(e), param="messages") from None
        vocab = state.engine.model.args.vocab_size
        # A branch of a reply (extensions, as the app's own requests): the reply's tokens
        # before the branch point end the prompt, the chosen alternative is forced.
        prefix = _token_ids(body, "reply_prefix", vocab, most=state.engine.max_context)
        forced = _token_ids(body, "forced_tokens", vocab, most=MAX_FORCED)
        ids = ids + prefix
        lp = body.get("logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise APIError(400, "logprobs must be true or false", param="logprobs")
        top = body.get("top_logprobs")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise APIError(400, f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}", param="top_logprobs")
        if top and not lp:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        context = state.engine.max_context
        asked = body.get("max_completion_tokens")
        asked = body.get("max_tokens") if asked is None else asked
        check_context(len(ids) + len(forced),
                      asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else None,
                      context, what="the messages")
        lanes = sampling_from_request(body, default_max_tokens=context - len(ids),
                                      vocab=state.engine.model.args.vocab_size, lookup=state.lookup, draft=state.draft)
        # the reply's leading space is dropped at its start only, not after a kept prefix
        strip = strips_reply_space(state.tokenizer, state.loaded.chat_format) and not prefix
        # The end of a chat turn stops this request only: a completion batched beside it
        # must run on past the same token.
        stops = (frozenset(state.loaded.stop_ids) | frozenset(state.loaded.chat_format.stop_ids())
                 | frozenset(_token_ids(body, "stop_token_ids", state.engine.model.args.vocab_size, most=256)))
        return Job(ids, lanes, strip, top or 0, stops, tuple(forced)), (top or 0) if lp else None

    async def generate(request: Request, chat: bool):
        try:
            check_key(request)
            body = await read_body(request)
            job, top = chat_job(body) if chat else completion_job(body)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise APIError(400, "stream must be true or false", param="stream")
            opts = body.get("stream_options") or {}
            if not isinstance(opts, dict):
                raise APIError(400, "stream_options must be an object", param="stream_options")
            job.loop, job.events = asyncio.get_running_loop(), asyncio.Queue()
            try:
                state.scheduler.submit(job)
            except ConstraintError as e:  # the schema/regex/grammar does not compile
                field = constraint_from_request(body)[1]
                raise APIError(400, f"{field}: {e}", param=field) from None
            except SettingsError as e:  # the prompt, or a logit_bias_text TEXT the tokenizer makes nothing of
                param = "logit_bias_text" if str(e).startswith("bad logit bias") else ("messages" if chat else "prompt")
                raise APIError(400, str(e), param=param) from None
        except APIError as e:
            return error(e)
        reply = _Reply(state, body, chat, job, top)
        if stream:
            return EventSourceResponse(_stream(reply, bool(opts.get("include_usage"))), ping=15, sep="\n")
        return await _whole(request, reply)

    async def _whole(request: Request, reply: _Reply):
        job = reply.job
        tokens: list[list[Token]] = [[] for _ in job.lanes]

        async def until_disconnect():
            while (await request.receive())["type"] != "http.disconnect":
                pass
            job.cancel.set()

        watch = asyncio.ensure_future(until_disconnect())
        try:
            while (item := await job.events.get()) is not None:
                if isinstance(item, Exception):
                    return error(APIError(500, f"generation failed: {item}", type="server_error"))
                choice, ev = item
                if isinstance(ev, Token):
                    tokens[choice].append(ev)
        finally:
            watch.cancel()
            job.cancel.set()
        if any(d is None for d in job.done):
            return error(APIError(503, "the server stopped before the reply was done", type="server_error"))
        if (failed := reply.failure()) is not None:
            return error(failed)
        return JSONResponse(reply.whole(tokens))

    async def _stream(reply: _Reply, include_usage: bool):
        job = reply.job
        started = [False] * len(job.lanes)
        try:
            if reply.chat:
                for c in range(len(job.lanes)):
                    started[c] = True
                    yield {"data": json.dumps(reply.chunk(c, first=True))}
            while (item := await job.events.get()) is not None:
                if isinstance(item, Exception):
                    yield {"data": json.dumps(APIError(500, f"generation failed: {item}", type="server_error").body())}
                    return
                choice, ev = item
                first, started[choice] = not started[choice], True  # completions: no role chunk came first
                if isinstance(ev, Token):
                    if ev.text or reply.top is not None or reply.token_ids:
                        yield {"data": json.dumps(reply.chunk(choice, text=ev.text, tok=ev, first=first))}
                elif isinstance(ev, Done):
                    if (failed := reply.failure(ev)) is not None:  # what streamed stays; the error ends it
                        yield {"data": json.dumps(failed.body())}
                        return
                    yield {"data": json.dumps(reply.chunk(choice, done=ev, first=first))}
            if include_usage and all(d is not None for d in job.done):
                yield {"data": json.dumps({**reply.head(), "object": reply.object + (".chunk" if reply.chat else ""),
                                           "choices": [], "usage": reply.usage()})}
            yield {"data": "[DONE]"}
        finally:
            job.cancel.set()  # a client that left stops its lanes at the next decode step

    async def not_found(request: Request, exc: HTTPException):
        status = exc.status_code
        msg = f"no such endpoint: {request.method} {request.url.path}" if status in (404, 405) else str(exc.detail)
        return error(APIError(status, msg, code="not_found" if status == 404 else None))

    @asynccontextmanager
    async def lifespan(app):
        state.scheduler.start()
        if on_startup is not None:
            on_startup()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, state.scheduler.stop)

    async def completions(request):
        return await generate(request, chat=False)

    async def chat_completions(request):
        return await generate(request, chat=True)

    routes = [Route("/v1/models", models), Route("/v1/models/{name:path}", model),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found})


# -- running it -------------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(256)
    sock.set_inheritable(True)
    return sock


class RunningServer:
    """A server on its own thread (tests, benchmarks, the app): ``url``, ``stop()``.

    ``wrap`` puts ASGI middleware around the app."""

    def __init__(self, state: ServerState, *, host: str = "127.0.0.1", port: int = 0,
                 wrap: Callable | None = None):
        import uvicorn
        self.state = state
        self._sock = bind(host, port)
        h, p = self._sock.getsockname()[:2]
        self.url = f"http://{h}:{p}/v1"
        started = threading.Event()
        app = build_app(state, on_startup=started.set)
        if wrap is not None:  # ASGI middleware around the app (tests: a server that lacks features)
            app = wrap(app)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="llamadesk-http", daemon=True)
        self._thread.start()
        if not started.wait(60):
            self.stop()
            raise RuntimeError("the server did not start")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def serve_forever(state: ServerState, host: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve until interrupted (the CLI's ``serve``); ``announce`` gets the base URL once listening."""
    import uvicorn
    sock = bind(host, port)
    h, p = sock.getsockname()[:2]
    shown = f"[{h}]" if ":" in h else h
    app = build_app(state, on_startup=lambda: announce(f"http://{shown}:{p}/v1"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
