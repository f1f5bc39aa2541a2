"""A client for OpenAI-compatible servers (``python -m core serve``, vLLM, llama.cpp's
server, Ollama, LM Studio) that yields the engine's own events.

A remote reply streams as :class:`core.engine.engine.Token` events and ends with one
:class:`core.engine.engine.Done`, so the CLI (and anything else that consumes a local engine's
events) runs a model on a server exactly as a local one. Every failure is a
:class:`RemoteError` whose ``kind`` says what went wrong, with a message a user can act on.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx

from core.engine.constraint import request_fields
from core.remote.tool_calls import CallDeltas, tool_fields
from core.tools.spec import Tool
from core.engine.events import Done, Stats, Token
from core.errors import LlamaDeskError
from core.engine.settings import SamplingParams

# finish_reason -> the engine's stop reasons; "stop" is split into eos and stop strings below.
_FINISH = {"length": "length", "abort": "cancelled", "cancelled": "cancelled", "tool_calls": "tool_calls",
           "function_call": "tool_calls"}


class RemoteError(LlamaDeskError):
    """A server that cannot be reached or refused a request.

    ``kind`` is one of: connection (refused, DNS), timeout, auth (401/403), rate_limit
    (429), busy (503), bad_request (400/422), not_found (404), cut (the stream ended
    mid-reply), unsupported (a setting only LlamaDesk's serve takes), http (anything else). ``status`` is the HTTP status when there was one.
    """

    def __init__(self, message: str, *, kind: str, status: int | None = None, param: str | None = None):
        super().__init__(message)
        self.kind, self.status, self.param = kind, status, param


_KINDS = {400: "bad_request", 401: "auth", 403: "auth", 404: "not_found", 422: "bad_request",
          429: "rate_limit", 503: "busy"}


def public_url(url: str) -> str:
    """``url`` without any user:password part, for showing and storing (keys never are)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL urllib can split (a broken [IPv6] host): cut the authority by hand
        scheme, sep, rest = url.partition("://")
        authority, slash, path = rest.partition("/")
        return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def base_url(url: str) -> str:
    """``http://host:port`` or ``.../v1`` -> ``.../v1`` (every server above mounts there)."""
    url = url.strip().rstrip("/")
    shown = public_url(url)
    if not url.startswith(("http://", "https://")):
        raise RemoteError(f"a server URL starts with http:// or https://, got {shown!r}", kind="bad_request")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        raise RemoteError(f"not a valid server URL: {shown!r} ({str(e).replace(url, shown)})",
                          kind="bad_request") from None
    if not parsed.host or (parsed.port is not None and not 0 < parsed.port < 65536):
        raise RemoteError(f"not a valid server URL: {shown!r} (it needs a host, and a port from 1 to 65535)",
                          kind="bad_request")
    return url if url.endswith("/v1") else url + "/v1"


@dataclass
class RemoteModel:
    """One model on one server.

    Args:
        url: the server (``http://127.0.0.1:8000`` or ``.../v1``).
        api_key: sent as ``Authorization: Bearer``; never stored anywhere by this class.
        model: the model id; None takes the server's first model.
        timeout: seconds to wait for a connection or for the next streamed bytes.
    """
    url: str
    api_key: str | None = None
    model: str | None = None
    timeout: float = 60.0

    def __post_init__(self) -> None:
        self.url = base_url(self.url)
        self.shown = public_url(self.url)  # what messages and printed output name: no credentials
        self.card: dict | None = None
        self.caps: Capabilities | None = None  # set by probe(): fields the server lacks are not sent

    # -- plumbing ---------------------------------------------------------------------------

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _fail(self, r: httpx.Response) -> RemoteError:
        try:
            err = r.json().get("error") or {}
            msg, param = (err.get("message") if isinstance(err, dict) else str(err)), (
                err.get("param") if isinstance(err, dict) else None)
        except (ValueError, AttributeError):
            msg, param = r.text[:200].strip(), None
        what = {401: "the server refused the API key", 403: "the server refused the API key",
                429: "the server is rate-limiting requests", 503: "the server is busy"}.get(r.status_code)
        text = f"{what}: {msg}" if what and msg else (what or msg or r.reason_phrase)
        return RemoteError(f"{self.shown} answered {r.status_code}: {text}", kind=_KINDS.get(r.status_code, "http"),
                           status=r.status_code, param=param)

    def _request(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            r = httpx.request(method, self.url + path, headers=self._headers(), timeout=self.timeout, **kw)
        except httpx.TimeoutException:
            raise RemoteError(f"{self.shown} did not answer within {self.timeout:g} s", kind="timeout") from None
        except httpx.TransportError as e:
            raise RemoteError(f"cannot connect to {self.shown}: {e}", kind="connection") from None
        if r.status_code >= 400:
            raise self._fail(r)
        return r

    # -- models ------------------------------------------------------------------------------

    def models(self) -> list[dict]:
        """The server's ``/v1/models`` list."""
        data = self._request("GET", "/models").json().get("data")
        if not isinstance(data, list):
            raise RemoteError(f"{self.shown}/models did not answer a model list", kind="http")
        return data

    def connect(self) -> dict:
        """Look the model up (the first one when none was named); returns its model card."""
        models = self.models()
        if not models:
            raise RemoteError(f"{self.shown} serves no models", kind="not_found")
        if self.model is None:
            self.card = models[0]
            self.model = self.card["id"]
        else:
            self.card = next((m for m in models if m.get("id") == self.model), None)
            if self.card is None:
                ids = ", ".join(str(m.get("id")) for m in models)
                raise RemoteError(f"{self.shown} has no model '{self.model}' (it has: {ids})", kind="not_found")
        return self.card

    @property
    def is_llamadesk(self) -> bool:
        return bool(self.card and "llamadesk" in self.card)

    @property
    def dialect(self) -> str:
        """Whose extension fields the server speaks: "llamadesk", "vllm", "llama.cpp" (its
        model cards say owned_by "llamacpp") or "openai" (OpenAI's fields only)."""
        card = self.card or {}
        if "llamadesk" in card:
            return "llamadesk"
        return {"vllm": "vllm", "llamacpp": "llama.cpp"}.get(card.get("owned_by"), "openai")

    def in_dialect(self, body: dict) -> dict:
        """``body`` (this app's field names, which LlamaDesk's serve takes) in the server's
        own: llama.cpp's repeat_penalty, vLLM's structured_outputs for a regex or grammar.
        RemoteError "unsupported" for a constraint the server has no field for."""
        out, dialect = dict(body), self.dialect
        if dialect == "llama.cpp" and "repetition_penalty" in out:
            out["repeat_penalty"] = out.pop("repetition_penalty")
        for kind in ("regex", "grammar"):
            if kind not in out:
                continue
            if dialect == "vllm":
                out["structured_outputs"] = {kind: out.pop(kind)}
            elif dialect == "llama.cpp" and kind == "regex":
                raise RemoteError(f"{self.shown} (llama.cpp's server) has no regular-expression constraint: use a "
                                  "grammar or a JSON schema", kind="unsupported")
        return out

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """The model's tokenizer hash where the server says it (LlamaDesk servers), else None."""
        return (self.card or {}).get("llamadesk", {}).get("tokenizer")

    # -- capabilities ----------------------------------------------------------------------------

    def complete(self, body: dict) -> dict:
        """One non-streamed chat request (``body`` without model and stream); the reply object."""
        if self.card is None:
            self.connect()
        return self._request("POST", "/chat/completions",
                             json=self.in_dialect({"model": self.model, **body, "stream": False})).json()

    def probe(self) -> Capabilities:
        """Find what the server honours with a few short requests (about ten, 8 tokens or fewer).

        Servers differ: some refuse a field (400), some accept and ignore it. Each field is
        tried where its effect is visible: ``top_k=1`` and ``min_p=0.999`` must turn a
        near-uniform draw (temperature 5) back into the greedy reply, ``seed`` must repeat a
        draw, a huge ``repetition_penalty`` must change the greedy reply.
        """
        self.caps = Capabilities()  # what the probe finds decides what later requests send
        probe = _Probe(self, self.caps)
        greedy = probe.logprobs()
        probe.filters(greedy)
        probe.penalty_and_n(greedy)
        probe.streaming()
        return self.caps

    # -- generation ----------------------------------------------------------------------------

    def body(self, params: SamplingParams, *, prompt: str | list[int] | None = None, messages: list[dict] | None = None,
             logprobs: bool = True, top_logprobs: int = 0, stream: bool = True, tools: list[Tool] | None = None,
             parallel_tool_calls: bool = True) -> dict:
        """The request body for one reply under ``params`` (fields left at their off value
        are not sent, so servers that lack them still answer). ``tools``: the functions a
        chat reply may call, sent as OpenAI's ``tools`` with the lane's tool_choice."""
        p = params.resolved()
        has = (lambda f: True) if self.caps is None else (lambda f: getattr(self.caps, f))
        b: dict = {"model": self.model, "max_tokens": p.max_new_tokens, "temperature": p.temperature,
                   "top_p": p.top_p, "stream": stream}
        if has("seed"):
            b["seed"] = p.seed
        if stream:
            b["stream_options"] = {"include_usage": True}
        if p.stop:
            b["stop"] = list(p.stop)
        for key, off in (("top_k", 0), ("min_p", 0.0), ("repetition_penalty", 1.0)):
            if getattr(p, key) != off and has(key):
                b[key] = getattr(p, key)
        logprobs = logprobs and has("logprobs")
        top_logprobs = top_logprobs if has("top_logprobs") else 0
        if messages is not None:
            b["messages"] = messages
            if logprobs:
                b["logprobs"] = True
                if top_logprobs:
                    b["top_logprobs"] = top_logprobs
        else:
            b["prompt"] = prompt
            if logprobs:
                b["logprobs"] = top_logprobs
        if self.dialect in ("llamadesk", "vllm"):
            b["return_token_ids"] = True
        b.update(request_fields(p.constraint))
        if tools and messages is not None:
            b.update(tool_fields(tools, p.tool_choice, parallel_tool_calls))
        if p.logit_bias:  # token ids: the server's own (e.g. a ban picked from its replies' tokens)
            b["logit_bias"] = {str(t): (v if math.isfinite(v) else "-inf") for t, v in p.logit_bias.items()}
        extensions = {"logit_bias_text": list(p.logit_bias_text), "lookup": p.lookup, "draft": p.draft}
        asked = {k: v for k, v in extensions.items() if v}
        if not p.tool_constraint:  # calls written unheld: LlamaDesk's extension (others always hold or never)
            asked["tool_constraint"] = False
        if asked and not self.is_llamadesk:
            raise RemoteError(f"{self.shown} is not a LlamaDesk server: {', '.join(asked)} need LlamaDesk's serve "
                              "(or a local model)", kind="unsupported")
        b.update(asked)
        return self.in_dialect(b)

    def stream(self, params: SamplingParams, *, prompt: str | list[int] | None = None,
               messages: list[dict] | None = None, lane: int = 0, logprobs: bool = True, top_logprobs: int = 0,
               cancel: threading.Event | None = None, meta: dict | None = None,
               extra: dict | None = None, tools: list[Tool] | None = None,
               parallel_tool_calls: bool = True) -> Iterator[Token | Done]:
        """Stream one reply (a completion of ``prompt``, text or token ids, or a chat reply to
        ``messages``) as the engine's Token events and one Done; closing the generator or
        setting ``cancel`` closes the connection, which cancels the reply on the server.

        ``meta``, when given, receives ``prompt_token_ids`` where the server reports them and
        ``cached_tokens`` where it says how much of the prompt its KV cache held; ``extra``
        fields go into the request as they are.
        """
        if self.card is None:
            self.connect()
        params = params.resolved()
        chat = messages is not None
        body = self.body(params, prompt=prompt, messages=messages, logprobs=logprobs, top_logprobs=top_logprobs,
                         tools=tools, parallel_tool_calls=parallel_tool_calls)
        body.update(extra or {})
        path = "/chat/completions" if chat else "/completions"
        got = _Collected(self.shown, lane, chat, meta, tools or [])
        try:
            with httpx.stream("POST", self.url + path, json=body, headers=self._headers(),
                              timeout=self.timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    raise self._fail(r)
                for data in _sse_data(r):
                    if data == "[DONE]":
                        break
                    yield from got.take(json.loads(data))
                    if cancel is not None and cancel.is_set():
                        got.finish = "abort"
                        break
        except httpx.TimeoutException:
            raise RemoteError(f"{self.shown} stopped answering for {self.timeout:g} s", kind="timeout") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as e:
            raise RemoteError(f"the connection to {self.shown} was cut mid-reply ({e})", kind="cut") from None
        except httpx.TransportError as e:
            raise RemoteError(f"cannot connect to {self.shown}: {e}", kind="connection") from None
        if got.finish is None:
            err = RemoteError(f"the connection to {self.shown} ended mid-reply", kind="cut")
            err.unfinished = True  # a stream that ended cleanly without a finish reason (runner.py)
            raise err
        yield got.done(params)

    def branch(self, params: SamplingParams, prompt_ids: list[int], forced: list[int], *,
               stop_ids: list[int] = (), lane: int = 0, logprobs: bool = True, top_logprobs: int = 0,
               cancel: threading.Event | None = None, meta: dict | None = None) -> Iterator[Token | Done]:
        """Continue a reply from given token ids with ``forced`` taken as its next tokens (a
        branch at one of a token's alternatives), on a LlamaDesk server: a completion whose
        prompt is ``prompt_ids`` (the reply's prompt ids, BOS included, as the server reported
        them in ``prompt_token_ids``, then the reply's tokens before the branch point) and
        whose first tokens are ``forced`` (the ``forced_tokens`` extension: they come back as
        the reply's first tokens, with their log-probabilities and alternatives, as a local
        branch's do). ``stop_ids``: token ids that end it besides the model's own end of text
        (a chat reply's end of turn: vLLM's ``stop_token_ids``). The server reuses the
        prefix its KV cache holds (``meta["cached_tokens"]``). The events are those of
        :meth:`stream`: Token events for the forced tokens and what follows, then Done.

        Raises:
            RemoteError: kind "unsupported" when the server is not LlamaDesk's serve.
        """
        if self.card is None:
            self.connect()
        if forced and not self.is_llamadesk:
            raise RemoteError(f"{self.shown} is not a LlamaDesk server: it cannot continue a reply with a forced token",
                              kind="unsupported")
        extra: dict = {}
        if forced:
            extra["forced_tokens"] = [int(t) for t in forced]
        if stop_ids:
            extra["stop_token_ids"] = [int(t) for t in stop_ids]
        return self.stream(params, prompt=[int(t) for t in prompt_ids], lane=lane, logprobs=logprobs,
                           top_logprobs=top_logprobs, cancel=cancel, meta=meta, extra=extra)


@dataclass
class Capabilities:
    """What a server does with each request field, found by :meth:`RemoteModel.probe`.

    A field is supported only when the server was seen to honour it; ``why`` says, for
    each unsupported one, whether the server refused it or ignored it (for a tooltip).
    """
    streaming: bool = False
    seed: bool = False
    logprobs: bool = False
    top_logprobs: bool = False
    top_k: bool = False
    min_p: bool = False
    repetition_penalty: bool = False
    n: bool = False
    why: dict = field(default_factory=dict)

    FIELDS = ("streaming", "seed", "logprobs", "top_logprobs", "top_k", "min_p", "repetition_penalty", "n")


class _Probe:
    """The requests :meth:`RemoteModel.probe` sends, each finding out about one or two fields."""

    MESSAGES = [{"role": "user", "content": "Count with me: one, two, three, four, five, six, seven, eight."}]
    HOT = {"temperature": 5.0, "seed": 7}  # a near-uniform draw, repeatable where seed works

    def __init__(self, model: RemoteModel, caps: Capabilities):
        self.model, self.caps = model, caps
        self.base = {"messages": self.MESSAGES, "max_tokens": 8}

    @staticmethod
    def text(r: dict, i: int = 0) -> str:
        return r["choices"][i]["message"].get("content") or ""

    def ask(self, body: dict) -> dict:
        return self.model.complete({**self.base, **body})

    def attempt(self, name: str, body: dict) -> dict | None:
        """The reply, or None when the server refused the request (``name`` unsupported)."""
        try:
            return self.ask(body)
        except RemoteError as e:
            if e.kind != "bad_request":
                raise
            self.caps.why[name] = f"the server refused {name}: {e}"
            return None

    def logprobs(self) -> str:
        """logprobs and top_logprobs; the greedy reply's text, which the other probes compare to."""
        caps = self.caps
        greedy = self.attempt("logprobs", {"temperature": 0, "logprobs": True, "top_logprobs": 2})
        if greedy is None:
            caps.why["top_logprobs"] = caps.why["logprobs"]
            return self.text(self.ask({"temperature": 0}))
        content = (greedy["choices"][0].get("logprobs") or {}).get("content") or []
        caps.logprobs = bool(content) and all(e.get("logprob") is not None for e in content)
        caps.top_logprobs = caps.logprobs and all(len(e.get("top_logprobs") or []) == 2 for e in content)
        if not caps.logprobs:
            caps.why["logprobs"] = "the server ignores logprobs: replies carry no log-probabilities"
        if not caps.top_logprobs:
            caps.why.setdefault("top_logprobs", "the server returns no top_logprobs alternatives")
        return self.text(greedy)

    def filters(self, want: str) -> None:
        """seed (two hot draws agree), then top_k and min_p (a hot draw turns greedy)."""
        caps = self.caps
        a = self.attempt("seed", self.HOT)
        if a is not None:
            caps.seed = self.text(a) == self.text(self.ask(self.HOT))
            if not caps.seed:
                caps.why["seed"] = "the server ignores seed: the same seed gave different replies"
        control = a if a is not None else self.ask({"temperature": 5.0})
        for name, value in (("top_k", 1), ("min_p", 0.999)):
            r = self.attempt(name, {**(self.HOT if caps.seed else {"temperature": 5.0}), name: value})
            if r is not None:
                setattr(caps, name, self.text(r) == want)
                if not getattr(caps, name):
                    caps.why[name] = f"the server ignores {name}: {name}={value} did not make its draws greedy"
        if self.text(control) == want:  # the model is too sure of itself to tell: trust what was accepted
            for name in ("top_k", "min_p"):
                if name not in caps.why or "ignores" in caps.why[name]:
                    setattr(caps, name, True)
                    caps.why.pop(name, None)

    def penalty_and_n(self, want: str) -> None:
        """repetition_penalty (a huge one changes the greedy reply) and n (two choices come)."""
        caps = self.caps
        r = self.attempt("repetition_penalty", {"temperature": 0, "repetition_penalty": 1000.0})
        if r is not None:
            caps.repetition_penalty = self.text(r) != want
            if not caps.repetition_penalty:
                caps.why["repetition_penalty"] = "the server ignores repetition_penalty: the reply did not change"
        r = self.attempt("n", {"temperature": 1.0, "n": 2, "max_tokens": 2})
        if r is not None:
            caps.n = len(r.get("choices") or []) == 2
            if not caps.n:
                caps.why["n"] = "the server ignores n: it answered one choice for two"

    def streaming(self) -> None:
        try:
            self.caps.streaming = any(isinstance(ev, Done) for ev in self.model.stream(
                SamplingParams(temperature=0, max_new_tokens=2), messages=self.MESSAGES, logprobs=False))
        except RemoteError as e:
            self.caps.why["streaming"] = f"streaming failed: {e}"


class _Collected:
    """What one streamed reply has brought so far: its tokens, how it finished, the usage."""

    def __init__(self, url: str, lane: int, chat: bool, meta: dict | None, tools: list[Tool] = ()):
        self.url, self.lane, self.chat, self.meta = url, lane, chat, meta
        self.calls = CallDeltas(list(tools))  # the reply's tool calls, as their deltas come
        self.t0 = time.perf_counter()
        self.first: float | None = None  # when the first token came
        self.text: list[str] = []
        self.tokens: list[int] = []
        self.lps: list[float | None] = []
        self.finish: str | None = None
        self.stop_reason = None
        self.stop_token_id = None  # a LlamaDesk server's extension: the end token, where stop_reason is null
        self.usage: dict | None = None

    def take(self, chunk: dict) -> Iterator[Token]:
        """One streamed chunk's Token events (``meta`` gets what the chunk reports)."""
        if "error" in chunk:
            err = chunk["error"]
            raise RemoteError(f"{self.shown} failed mid-reply: {err.get('message', err)}", kind="http")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            cached = (self.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            if self.meta is not None and cached is not None:
                self.meta["cached_tokens"] = cached
        for c in chunk.get("choices") or []:
            if self.meta is not None and "prompt_token_ids" in c:
                self.meta["prompt_token_ids"] = c["prompt_token_ids"]
            self.calls.take((c.get("delta") or {}).get("tool_calls") if self.chat else None)
            for ev in _chunk_tokens(c, self.chat, self.lane, len(self.tokens)):
                if self.first is None:
                    self.first = time.perf_counter()
                self.text.append(ev.text)
                self.tokens.append(ev.token_id)
                self.lps.append(ev.logprob)
                yield ev
            if c.get("finish_reason"):
                self.finish, self.stop_reason = c["finish_reason"], c.get("stop_reason")
                self.stop_token_id = c.get("stop_token_id")

    def done(self, params: SamplingParams) -> Done:
        """The reply's Done event, once it finished."""
        end = time.perf_counter()
        if self.finish == "stop":
            # vLLM-style servers name what stopped the reply: a stop string, or a token id / None for end of turn.
            reason = "stop" if isinstance(self.stop_reason, str) else "eos"
        else:
            reason = _FINISH.get(self.finish, "length")
        usage = self.usage or {}
        stats = Stats()
        stats.prompt_tokens = usage.get("prompt_tokens", 0)
        stats.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        stats.speculative = _speculative(usage.get("speculative"))
        stats.generated_tokens = len(self.tokens)
        stats.ttft_s = stats.prefill_s = (self.first or end) - self.t0
        stats.decode_s = end - (self.first or end)
        ids = list(self.tokens) if all(t >= 0 for t in self.tokens) else []
        # the token id that ended it (a chat's end of turn: what a branch stops on): LlamaDesk's
        # stop_token_id, else a vLLM-style stop_reason that names one
        given = self.stop_token_id if isinstance(self.stop_token_id, int) else self.stop_reason
        stop_token = given if reason == "eos" and isinstance(given, int) and not isinstance(given, bool) else None
        calls = self.calls.done()
        if calls and reason in ("eos", "tool_calls"):
            reason = "tool_calls"
        return Done(self.lane, reason, ids, "".join(self.text), self.lps if all(lp is not None for lp in self.lps) else [],
                    params, stats, stop_token, tool_calls=calls if reason == "tool_calls" else [])


def _speculative(sp) -> dict | None:
    """A LlamaDesk server's ``usage.speculative`` (see core.serving.responses.speculative_stats) as the
    engine's own Stats.speculative, so a lane on the server shows its drafting as a local one."""
    if not isinstance(sp, dict) or not sp:
        return None
    try:
        return {"kind": str(sp["kind"]), "lookup": int(sp.get("lookup") or 0), "draft": str(sp.get("draft") or ""),
                "drafted": int(sp["drafted"]), "accepted": int(sp["accepted"]),
                "acceptance": float(sp["acceptance_rate"]), "mean_draft": float(sp.get("mean_draft") or 0.0),
                "forwards": int(sp.get("forwards") or 0), "speedup": sp.get("speedup")}
    except (KeyError, TypeError, ValueError):
        return None  # another shape: the reply stands, its drafting is just not shown


def _sse_data(r: httpx.Response) -> Iterator[str]:
    """The data of each server-sent event (multi-line data joined with newlines)."""
    buf: list[str] = []
    for line in r.iter_lines():
        if not line:
            if buf:
                yield "\n".join(buf)
                buf = []
        elif line.startswith("data:"):
            buf.append(line[5:].removeprefix(" "))
    if buf:
        yield "\n".join(buf)


def _chunk_tokens(c: dict, chat: bool, lane: int, index: int) -> Iterator[Token]:
    """Token events in one streamed choice: one per token where the server reports tokens
    (logprobs or token ids), else one for the text delta."""
    delta = (c.get("delta") or {}).get("content") if chat else c.get("text")
    delta = delta or ""
    ids = c.get("token_ids") or []
    lp = c.get("logprobs")
    if chat:
        entries = (lp or {}).get("content") or []
        pieces = [(e.get("token", ""), e.get("logprob"), _top(e.get("top_logprobs"))) for e in entries]
    elif lp:
        tops = lp.get("top_logprobs") or [None] * len(lp.get("tokens") or [])
        top_ids = lp.get("top_token_ids") or [[] for _ in tops]  # LlamaDesk's serve names them by id too
        pieces = [(t, l, _top([{"token": k, "logprob": v, **({"id": ids[j]} if j < len(ids) else {})}
                               for j, (k, v) in enumerate(top.items())]) if top else None)
                  for t, l, top, ids in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], tops, top_ids)]
    else:
        pieces = []
    n = max(len(ids), len(pieces))
    if n == 0:
        if delta:
            yield Token(lane, index, -1, delta, delta, None)
        return
    for k in range(n):
        piece, logprob, top = pieces[k] if k < len(pieces) else (None, None, None)
        tid = ids[k] if k < len(ids) else -1
        # The text delta belongs to the chunk as a whole: give it to its last token.
        yield Token(lane, index + k, tid, delta if k == n - 1 else "", piece if piece is not None else "", logprob, top)


def _top(entries) -> dict | None:
    """A server's top_logprobs in the engine's inspection shape. Servers name tokens by
    text, not id, so each alternative gets a stand-in key (-1, -2, ...) named in "pieces",
    except where the server gives its id (LlamaDesk's serve: "id", what a branch at it
    needs); "filtered" is empty: the server does not say what its filters kept."""
    if not entries:
        return None

    def key(j: int, e: dict) -> int:
        tid = e.get("id")
        return tid if isinstance(tid, int) and not isinstance(tid, bool) and tid >= 0 else -1 - j
    raw = [(key(j, e), math.exp(e["logprob"])) for j, e in enumerate(entries) if e.get("logprob") is not None]
    return {"raw": raw, "filtered": [], "pieces": {key(j, e): e.get("token", "") for j, e in enumerate(entries)}}
