"""Replies from a server, delivered as the local worker's own events.

:class:`RemoteRunner` runs a :class:`~core.worker.protocol.GenerateRequest` or
:class:`~core.worker.protocol.CompareRequest` on a connected :class:`~core.remote.client.RemoteModel` and
emits exactly what :class:`~core.worker.worker.Worker` emits for a local model: ``Prompted``,
``Reply(request_id, Token)``…, ``Reply(request_id, Done)`` per lane, or ``Error`` (whose
``kind`` names a network failure: connection, timeout, auth, rate_limit, cut, ...).
Consumers (the GUI bridge, tests) cannot tell the two apart except by that kind.

Remote replies are network-bound, so each lane runs on its own short-lived daemon thread:
a remote reply never waits behind local torch work and never holds the worker. Request
ids are negative, so they never collide with the worker's (positive) ids on one event
callback. ``cancel(request_id)`` ends the request's lanes at once (a ``Done`` "cancelled"
with what streamed so far) and closes each HTTP stream at its next chunk, which cancels
the reply on the server. No Qt here.

Through the GUI::

    remote = RemoteModel(url, api_key=key, model=name); remote.connect(); remote.probe()
    stream = bridge.generate(request, backend=remote)   # same events as a local reply
    stream.cancel()                                      # per-request stop
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from core.remote.client import RemoteError, RemoteModel, public_url
from core.engine.events import Done, Stats, Token
from core.errors import one_line
from core.engine.settings import SamplingParams
from core.worker.protocol import MAX_INSPECT, CompareRequest, Error, GenerateRequest, Prompted
from core.engine.events import Reply

log = logging.getLogger(__name__)

__all__ = ["RemoteRunner", "context_length", "describe_error", "public_url"]


def context_length(model: RemoteModel) -> int:
    """The served model's context length where its model card says it (vLLM's and this
    app's ``max_model_len``; llama.cpp's ``meta.n_ctx_train``), else 0 (unknown)."""
    card = model.card or {}
    for v in (card.get("max_model_len"), (card.get("meta") or {}).get("n_ctx_train"), card.get("context_length")):
        if isinstance(v, int) and v > 0:
            return v
    return 0


_ADVICE = {
    "connection": "Check that the server is running and the address is right, then retry.",
    "timeout": "The server may be overloaded or the network slow; retry, or connect again later.",
    "auth": "Check the API key (Model → Connect to Server…), then retry.",
    "rate_limit": "The server limits how often it answers; wait a moment, then retry.",
    "busy": "The server's queue is full; wait a moment, then retry.",
    "cut": "The reply above is incomplete; retry to get a new one (the partial one is kept).",
}


def describe_error(kind: str, message: str) -> str:
    """A failed remote request in a user's words: what happened (the client's own line,
    which names the server), and what to do."""
    if kind not in _ADVICE:
        return message
    dns = kind == "connection" and any(s in message for s in (
        "Name or service not known", "nodename nor servname", "getaddrinfo", "No address associated",
        "Temporary failure in name resolution"))
    head = "Could not find the server (its name did not resolve)" if dns else {
        "connection": "Could not reach the server", "auth": "The server refused the API key (401)",
        "rate_limit": "The server is rate-limiting requests (429)", "busy": "The server is busy (503)"}.get(kind)
    # The client's lines for a cut or a timeout already say what happened.
    text = f"{head} — {message}" if head else (
        message if message.startswith("http") else message[:1].upper() + message[1:])
    return f"{text.rstrip('.')}. {_ADVICE[kind]}"


# A server that serves one request at a time and ends the running reply, without a finish
# reason, when the next request comes: llama-cpp-python's server does by default.
ONE_AT_A_TIME = ("this server runs one request at a time and ended a running reply when the next came "
                 "(llama-cpp-python's server does unless started with --interrupt_requests False)")
SERIAL = "lanes one after another (the server runs one request at a time)"


def _differs(now: list[str], before: list[str]) -> RemoteError:
    """A lane run again after a cut that did not stream what it had streamed before."""
    err = RemoteError(f"run again alone, it began {''.join(now)!r}, not {''.join(before)!r} as before the cut "
                      "(an unseeded lane?)", kind="cut")
    err.unfinished = True
    return err


def _chosen_top(tok: Token) -> Token:
    """Key the server's top alternative that is the chosen token by the chosen token's id,
    so the inspector marks it; the others keep stand-in ids that cannot equal it. A server
    that names its alternatives by id (LlamaDesk's serve) keeps its ids: a branch at one of
    them (RemoteModel.branch) forces that id."""
    top = tok.top
    if not top or not top.get("raw"):
        return tok
    if tok.token_id >= 0 and all(k >= 0 for k, _ in top["raw"]):
        tok.top = {**top, "filtered": [], "remote": True}
        return tok
    pieces = top.get("pieces") or {}
    order = [(pieces.get(i, ""), p) for i, p in top["raw"]]
    chosen = next((j for j, (piece, _) in enumerate(order) if piece == tok.piece), None)
    raw, names, stand_in = [], {}, itertools.count(-1, -1)
    for j, (piece, p) in enumerate(order):
        key = tok.token_id if j == chosen else next(k for k in stand_in if k != tok.token_id)
        raw.append((key, p))
        names[key] = piece
    tok.top = {"raw": raw, "filtered": [], "pieces": names, "remote": True}
    return tok


@dataclass
class _Lane:
    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)
    first: float | None = None
    closed: bool = False


class _Job:
    def __init__(self, rid: int, lanes: list[SamplingParams], seeded: bool = True):
        self.rid = rid
        self.seeded = seeded  # the server honours seed (else replies record none)
        self.cancel = threading.Event()
        self.lock = threading.Lock()
        self.lanes = [_Lane(p) for p in lanes]
        self.failed = False
        self.running = 0  # lane threads still streaming
        self.again: list[int] = []  # lanes the server cut off before any token: run again, one by one
        self.serial = False

    @property
    def open(self) -> bool:
        return not self.failed and not all(ln.closed for ln in self.lanes)


class RemoteRunner:
    """Runs requests on servers, one daemon thread per lane; see the module docstring.

    Args:
        on_event: called with every event, on the request's thread (or the caller's, for
            a cancel); must be thread-safe and quick, like the worker's.
    """

    def __init__(self, on_event: Callable[[object], None]):
        self._on_event = on_event
        self._ids = itertools.count(-1, -1)
        self._lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}
        # Servers seen cutting a reply off when the next request came: their lanes run one
        # after another from then on, for this runner's (the session's) life.
        self.one_at_a_time: set[str] = set()

    # -- public API (any thread) -------------------------------------------------------------

    def generate(self, request: GenerateRequest, model: RemoteModel) -> int:
        """One reply from ``model``: Prompted, Reply(Token)…, Reply(Done) (or Error)."""
        return self._submit(request, model, [request.params])

    def compare(self, request: CompareRequest, model: RemoteModel) -> int:
        """Each lane as its own parallel request to ``model``; lane-tagged tokens, one Done per
        lane. A lane that fails fails the request (Error) and stops the others."""
        return self._submit(request, model, list(request.lanes))

    def cancel(self, request_id: int) -> None:
        """Stop one request now: each open lane ends with Done "cancelled" (what streamed is
        kept) and its connection closes at the next chunk. Unknown ids are ignored."""
        with self._lock:
            job = self._jobs.get(request_id)
        if job is not None:
            self._stop(job)

    def cancel_all(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            self._stop(job)

    @property
    def active(self) -> int:
        """Requests still streaming."""
        with self._lock:
            return len(self._jobs)

    # -- internals ------------------------------------------------------------------------------

    def _submit(self, request, model: RemoteModel, lanes: list[SamplingParams]) -> int:
        rid = next(self._ids)
        try:
            if not lanes:
                raise RemoteError("a comparison needs at least one lane", kind="bad_request")
            if request.continue_reply:
                raise RemoteError("a server cannot carry on a reply (OpenAI's API has no way to ask): "
                                  "regenerate it, or continue it with a local model", kind="unsupported")
            if request.is_branch and not request.prompt_ids:
                raise RemoteError("a branch on a server needs the prompt's token ids as the server reported them: "
                                  "run the lane again, then branch", kind="unsupported")
            if request.mode not in ("chat", "completion"):
                raise RemoteError(f"unknown mode {request.mode!r}: use chat or completion", kind="bad_request")
            if not 0 <= int(request.inspect) <= MAX_INSPECT:
                raise RemoteError(f"inspect must be between 0 and {MAX_INSPECT}, got {request.inspect}",
                                  kind="bad_request")
            lanes = [p.validate().resolved() for p in lanes]  # Done.params records the seed sent
        except Exception as e:  # noqa: BLE001 — bad settings are an Error event, as on the worker
            self._emit(Error(rid, one_line(e), kind=getattr(e, "kind", "bad_request")))
            return rid
        job = _Job(rid, lanes, seeded=model.caps is None or model.caps.seed)
        with self._lock:
            self._jobs[rid] = job
        self._emit(Prompted(rid, 0, context_length(model)))
        if len(lanes) > 1 and model.url in self.one_at_a_time:
            job.serial, job.running = True, 1
            threading.Thread(target=self._run_serial, args=(job, list(range(len(lanes))), request, model),
                             name=f"llamadesk-remote{rid}", daemon=True).start()
            return rid
        job.running = len(lanes)
        for i in range(len(lanes)):
            threading.Thread(target=self._run_lane, args=(job, i, request, model),
                             name=f"llamadesk-remote{rid}.{i}", daemon=True).start()
        return rid

    def _run_serial(self, job: _Job, lanes: list[int], request, model: RemoteModel) -> None:
        for i in lanes:
            if job.cancel.is_set() or job.failed:
                break
            job.lanes[i].t0 = time.perf_counter()
            with job.lock:
                job.running += 1
            self._run_lane(job, i, request, model)
        with job.lock:
            job.running -= 1
        self._forget(job)

    def _cut_off(self, job: _Job, i: int, model: RemoteModel) -> bool:
        """Lane i's stream ended without a finish reason while other lanes of its request
        streamed: the server runs one request at a time. Remember that; the lane runs again
        once the others are done (True). llama-cpp-python's server cuts a reply only after
        sending it a chunk, so a cut lane has usually streamed: run again alone, its lanes'
        seeds make it stream the same tokens first, which are checked, not shown twice."""
        if len(job.lanes) < 2 or job.serial:
            return False
        self.one_at_a_time.add(model.url)
        with job.lock:
            if job.failed or job.cancel.is_set():
                return False
            job.again.append(i)
            return True

    def _emit(self, event) -> None:
        try:
            self._on_event(event)
        except Exception:  # a listener's bug must not kill the lane's thread
            log.exception("remote event listener failed on %s", type(event).__name__)

    def _run_lane(self, job: _Job, i: int, request, model: RemoteModel) -> None:
        lane = job.lanes[i]
        caps = model.caps
        top = int(request.inspect) if caps is None or caps.top_logprobs else 0
        kw = (dict(messages=request.messages, tools=list(request.tools), parallel_tool_calls=request.parallel_tool_calls)
              if request.mode == "chat" else dict(prompt=request.prompt))
        meta: dict = {}
        with job.lock:  # run again after a cut: what it streamed then must come first again
            shown, lane.tokens, lane.text, lane.logprobs = list(lane.text), [], [], []
        try:
            if request.is_branch:
                # A branch of a reply this server gave: its prompt ids and the kept tokens, then the
                # forced token (none for a ban: the lane's logit bias keeps the old one out).
                events = model.branch(lane.params, list(request.prompt_ids) + list(request.reply_prefix),
                                      list(request.forced), stop_ids=list(request.stop_ids), lane=i, logprobs=True,
                                      top_logprobs=top, cancel=job.cancel, meta=meta)
            else:
                events = model.stream(lane.params, lane=i, logprobs=True, top_logprobs=top, cancel=job.cancel,
                                      meta=meta, **kw)
            for ev in events:
                with job.lock:
                    if lane.closed or job.failed:
                        continue  # cancelled: the stream closes at this chunk
                    if isinstance(ev, Token):
                        lane.first = lane.first or time.perf_counter()
                        lane.tokens.append(ev.token_id)
                        lane.text.append(ev.text)
                        lane.logprobs.append(ev.logprob)
                        if ev.index < len(shown):
                            if ev.text != shown[ev.index]:
                                raise _differs(lane.text, shown)
                            continue  # streamed before the cut: already shown
                        ev = Reply(job.rid, _chosen_top(ev) if top else ev)
                    else:
                        lane.closed = True
                        if job.serial or (job.again and i in job.again):
                            ev.stats.decode = SERIAL  # said in the lane's stats
                        if caps is not None and not caps.seed:
                            # The server was sent no seed: record none rather than one it never saw.
                            ev.params = replace(ev.params, seed=None)
                        # What a branch of this reply sends back: the prompt before the reply (a
                        # branch's server prompt also holds the kept tokens, which its run starts with).
                        if request.is_branch:
                            ev.prompt_ids = list(request.prompt_ids)
                        elif meta.get("prompt_token_ids"):
                            ev.prompt_ids = [int(t) for t in meta["prompt_token_ids"]]
                        ev = Reply(job.rid, ev)
                    self._emit(ev)
        except RemoteError as e:
            if getattr(e, "unfinished", False) and self._cut_off(job, i, model):
                pass  # runs again below, once the other lanes are done
            elif getattr(e, "unfinished", False) and model.url in self.one_at_a_time:
                self._fail(job, f"lane {i + 1}: {e}: {ONE_AT_A_TIME}; its lanes run one after another from now on", "cut")
            else:
                self._fail(job, str(e), e.kind)
        except Exception as e:  # noqa: BLE001 — a thread must never die silently
            self._fail(job, f"the server's reply could not be read: {type(e).__name__}: {one_line(e)}", "http")
        finally:
            self._lane_ended(job, i, request, model)

    def _lane_ended(self, job: _Job, i: int, request, model: RemoteModel) -> None:
        with job.lock:
            lane = job.lanes[i]
            if not lane.closed and not job.failed and (job.serial or i not in job.again):  # ended without a Done
                job.failed = True
                self._emit(Error(job.rid, f"the connection to {model.shown} ended mid-reply", kind="cut"))
            job.running -= 1
            again = [] if job.serial or job.running else list(job.again)
        if again:  # this was the last lane streaming: the cut-off ones now run, one by one
            job.serial, job.running = True, 1
            self._run_serial(job, again, request, model)
        self._forget(job)

    def _fail(self, job: _Job, message: str, kind: str) -> None:
        with job.lock:
            if job.failed or all(ln.closed for ln in job.lanes):
                return  # a cancel already ended it
            job.failed = True
            job.cancel.set()  # the other lanes stop too
            self._emit(Error(job.rid, message, kind=kind))

    def _stop(self, job: _Job) -> None:
        job.cancel.set()
        with job.lock:
            if job.failed:
                return
            now = time.perf_counter()
            for i, ln in enumerate(job.lanes):
                if ln.closed:
                    continue
                ln.closed = True
                first = ln.first or now
                stats = Stats(generated_tokens=len(ln.tokens), ttft_s=first - ln.t0, prefill_s=first - ln.t0,
                              decode_s=now - first)
                ids = ln.tokens if all(t >= 0 for t in ln.tokens) else []
                lps = ln.logprobs if all(lp is not None for lp in ln.logprobs) else []
                params = ln.params if job.seeded else replace(ln.params, seed=None)
                self._emit(Reply(job.rid, Done(i, "cancelled", ids, "".join(ln.text), lps, params, stats)))
        self._forget(job)

    def _forget(self, job: _Job) -> None:
        if not job.open:
            with self._lock:
                self._jobs.pop(job.rid, None)
