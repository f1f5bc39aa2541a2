"""The Starlette app: OpenAI's endpoints over one :class:`ServerState`, streaming as
server-sent events.

Handlers are plain functions over ``request.app.state.server`` (the state) so each reads
alone; :func:`build_app` only wires routes, the error handler and the lifespan (which
starts and stops the scheduler thread).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import math
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace
from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core.engine.events import Done, Token
from core.errors import ConstraintError, ResourceError, SettingsError
from core.model.kernels import ops as kernel_ops
from core.prompt.prompting import strips_reply_space
from core.serving.protocol import (MAX_FORCED, MAX_STOP_IDS, APIError, chat_logprobs, check_context,
                                   completion_logprobs, constraint_from_request, messages_from_request, parse_body,
                                   requested_max_tokens, sampling_from_request, stream_options, token_ids)
from core.serving import responses_api
from core.serving.extensions import Extras, read_extensions, render_messages, with_min_tokens
from core.serving.group import MAX_PROMPTS, JobGroup, enqueue, parts_of
from core.serving.guard import Guard, HTTPOptions, answered_hosts
from core.serving.metrics import CONTENT_TYPE
from core.serving.responses import Reply
from core.serving.scheduler import Job
from core.serving.sse import EventStream, frame
from core.serving.tools_api import message_chars, tool_message, tools_from_request
from core.tools.spec import ToolError
from core.serving.state import ServerState


def build_app(state: ServerState, *, on_startup: Callable[[], None] | None = None,
              options: HTTPOptions = HTTPOptions(), bound: str = "127.0.0.1") -> Starlette:
    """The Starlette app serving ``state``; ``on_startup`` is called once it listens.
    ``options``: the HTTP layer's guards (:mod:`core.serving.guard`); ``bound``: the address
    it listens on (a keyless server answers that Host name too)."""
    routes = []
    for base in ("/v1", ""):  # llama.cpp's server answers without /v1 too, and clients written for it call so
        routes += [Route(base + "/models", models), Route(base + "/models/{name:path}", model),
                   Route(base + "/completions", completions, methods=["POST"]),
                   Route(base + "/chat/completions", chat_completions, methods=["POST"]),
                   Route(base + "/responses", responses, methods=["POST"]),
                   Route(base + "/health", health)]
    routes.append(Route("/metrics", metrics))
    hosts = None if state.api_key else answered_hosts(bound, options.allowed_hosts)
    middleware = [Middleware(Guard, hosts=hosts, max_body=options.max_body, read_timeout=options.read_timeout)]
    if options.cors_origins:  # outermost: a refusal from the guard still carries the headers the page needs
        middleware.insert(0, Middleware(CORSMiddleware, allow_origins=list(options.cors_origins),
                                        allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"],
                                        max_age=600))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: not_found})
    app.state.server = state
    app.state.on_startup = on_startup
    return app


@asynccontextmanager
async def lifespan(app: Starlette):
    state: ServerState = app.state.server
    if state.engine.device.type == "cpu":
        # The compiled kernels (built once per machine, seconds of compiling after an update)
        # are loaded before the server says it listens, not on its first request's decode step.
        await asyncio.get_running_loop().run_in_executor(None, kernel_ops.kernels)
    state.scheduler.start()
    if app.state.on_startup is not None:
        app.state.on_startup()
    try:
        yield
    finally:
        await asyncio.get_running_loop().run_in_executor(None, state.close)


def error(e: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    if e.status == 503:  # a full queue drains in about a second; clients' retries should wait that long
        headers = {"Retry-After": "1"}
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


SHUTTING_DOWN = "the server is shutting down: retry on another server or once it is back"


async def health(request: Request):
    """200 while the server takes requests, 503 once it is shutting down (as vLLM's /health;
    no key: load balancers and supervisors ask)."""
    if request.app.state.server.draining:
        return error(APIError(503, SHUTTING_DOWN, code="shutting_down", type="server_error"))
    return JSONResponse({"status": "ok"})


async def metrics(request: Request):
    """Prometheus' text format (:mod:`core.serving.metrics`); no key, as vLLM's /metrics."""
    state: ServerState = request.app.state.server
    text = state.metrics.render(waiting=state.scheduler.waiting, running=state.scheduler.active_lanes)
    return Response(text, media_type=CONTENT_TYPE)


def check_key(request: Request) -> None:
    """APIError 401 unless the request carries the server's API key (when it has one)."""
    key = request.app.state.server.api_key
    if key is None:
        return
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if not hmac.compare_digest(given.encode(), key.encode()):
        raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")


async def not_found(request: Request, exc: HTTPException):
    status = exc.status_code
    msg = f"no such endpoint: {request.method} {request.url.path}" if status in (404, 405) else str(exc.detail)
    response = error(APIError(status, msg, code="not_found" if status == 404 else None))
    response.headers.update(exc.headers or {})  # a 405 says which methods the path takes (Allow)
    return response


async def models(request: Request):
    try:
        check_key(request)
    except APIError as e:
        return error(e)
    state: ServerState = request.app.state.server
    return JSONResponse({"object": "list", "data": [state.model_card(name) for name in state.model_names]})


async def model(request: Request):
    state: ServerState = request.app.state.server
    try:
        check_key(request)
        if request.path_params["name"] not in state.model_names and not state.any_model:
            raise APIError(404, f"the model '{request.path_params['name']}' does not exist here",
                           param="model", code="model_not_found")
    except APIError as e:
        return error(e)
    name = request.path_params["name"]
    return JSONResponse(state.model_card(name if name in state.model_names else None))


async def completions(request: Request):
    return await generate(request, chat=False)


async def chat_completions(request: Request):
    return await generate(request, chat=True)


async def responses(request: Request):
    """OpenAI's Responses API, answered by the chat path (:mod:`core.serving.responses_api`)."""
    return await generate(request, chat=True, api="responses")


# -- requests as scheduler jobs -----------------------------------------------------------


def completion_job(state: ServerState, body: dict, ex: Extras = Extras()) -> tuple[Job, int | None]:
    """(the job a /v1/completions body asks for, how many logprob alternatives to report)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    vocab, context = state.engine.model.args.vocab_size, state.engine.max_context
    if isinstance(prompt, str):
        check_bytes(state, len(prompt.encode("utf-8", "surrogatepass")), "the prompt")
        ids = state.tokenizer.encode(prompt, bos=True)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise APIError(400, "prompt must be a string, a list of token ids, or a list of either", param="prompt")
    ids = ids + token_ids(body, "reply_prefix", vocab, most=context)
    lp = completion_logprobs(body)
    forced = token_ids(body, "forced_tokens", vocab, most=MAX_FORCED)
    stops = token_ids(body, "stop_token_ids", vocab, most=MAX_STOP_IDS)
    check_context(len(ids) + len(forced), requested_max_tokens(body), context, what="the prompt")
    # OpenAI's default is 16 tokens; llama.cpp's n_predict -1 runs to the end of the context
    default = context - len(ids) - len(forced) if ex.unbounded or body.get("n_predict") == -1 else 16
    lanes = sampling_from_request(body, default_max_tokens=default, vocab=vocab, lookup=state.lookup,
                                  draft=state.draft, max_n=state.scheduler.max_batch)
    check_some_token_left(state, lanes)
    # A completion stops only on the model's own stop tokens (and stop_token_ids: a chat
    # reply continued as a completion ends at its turn's end): no chat turn to end.
    own = frozenset() if ex.ignore_eos else frozenset(state.loaded.stop_ids)
    return Job(ids, with_min_tokens(ex, body, lanes), False, lp or 0, own | frozenset(stops), tuple(forced),
               ex.min_tokens), lp


def chat_job(state: ServerState, body: dict, ex: Extras = Extras()) -> tuple[Job, int | None]:
    """(the job a /v1/chat/completions body asks for, how many logprob alternatives to report)."""
    msgs = messages_from_request(body, tool_message)
    check_bytes(state, sum(message_chars(m) for m in msgs), "the messages")
    asked = tools_from_request(body)
    try:
        calling = state.loaded.chat_format.tool_calling(asked.tools, asked.parallel) if asked.tools else None
    except SettingsError as e:  # this model's chat format has no tool calling
        raise APIError(400, f"tools: {e}", param="tools") from None
    try:
        ids = render_messages(state.loaded.chat_format, msgs, ex, asked.tools)
    except SettingsError as e:
        raise APIError(400, str(e), param="messages") from None
    vocab, context = state.engine.model.args.vocab_size, state.engine.max_context
    # A branch of a reply (extensions, as the app's own requests): the reply's tokens
    # before the branch point end the prompt, the chosen alternative is forced.
    prefix = token_ids(body, "reply_prefix", vocab, most=context)
    forced = token_ids(body, "forced_tokens", vocab, most=MAX_FORCED)
    ids = ids + prefix
    top = chat_logprobs(body)
    check_context(len(ids) + len(forced), requested_max_tokens(body), context, what="the messages")
    lanes = sampling_from_request(body, default_max_tokens=context - len(ids), vocab=vocab,
                                  lookup=state.lookup, draft=state.draft, max_n=state.scheduler.max_batch)
    lanes = [replace(q, tool_choice=asked.choice, tool_constraint=asked.constrained) for q in lanes]
    check_some_token_left(state, lanes)
    # the reply's leading space is dropped at its start only, not after a kept prefix
    strip = (strips_reply_space(state.tokenizer, state.loaded.chat_format) and not prefix
             and not ex.continue_final and ex.generation_prompt)
    # The end of a chat turn stops this request only: a completion batched beside it
    # must run on past the same token.
    own = frozenset() if ex.ignore_eos else (frozenset(state.loaded.stop_ids)
                                             | frozenset(state.loaded.chat_format.stop_ids()))
    stops = own | frozenset(token_ids(body, "stop_token_ids", vocab, most=MAX_STOP_IDS))
    return Job(ids, with_min_tokens(ex, body, lanes), strip, top or 0, stops, tuple(forced), ex.min_tokens,
               tools=calling), top


def check_some_token_left(state: ServerState, lanes) -> None:
    """APIError 400 when logit_bias bans every token the model may sample: no reply could
    have a first token."""
    limit = state.engine.sample_limit or state.engine.model.args.vocab_size
    banned = {t for t, b in lanes[0].logit_bias.items() if b == -math.inf and t < limit}
    if len(banned) >= limit:
        raise APIError(400, f"logit_bias bans all {limit} tokens: leave at least one to sample", param="logit_bias")


def is_batch(prompt) -> bool:
    """Whether a completion's prompt is several prompts: a list of texts or of token lists."""
    return (isinstance(prompt, list) and len(prompt) > 1
            and (all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt)))


def batch_job(state: ServerState, body: dict, ex: Extras) -> tuple[JobGroup, int | None]:
    """A completion of several prompts: one job each, bounded before any is tokenized."""
    prompts = body["prompt"]
    most = min(MAX_PROMPTS, state.scheduler.max_queue)
    if len(prompts) > most:
        raise APIError(400, f"prompt takes at most {most} prompts in one request, got {len(prompts)}", param="prompt")
    jobs = [completion_job(state, {**body, "prompt": p}, ex) for p in prompts]
    return JobGroup([j for j, _ in jobs]), jobs[0][1]


def check_bytes(state: ServerState, size: int, what: str) -> None:
    """APIError 400 for a text too long to fit the context whatever it tokenizes to:
    refused by its length, before the tokenizer spends time and memory on it."""
    if size > state.max_prompt_bytes:
        context = state.engine.max_context
        raise APIError(400, f"this model's maximum context length is {context} tokens, but {what} "
                       f"{'are' if what.endswith('s') else 'is'} {size} bytes, more than {context} tokens "
                       f"can hold: shorten {what}", param="messages" if what == "the messages" else "prompt",
                       code="context_length_exceeded")


def check_job(state: ServerState, job: Job, body: dict, chat: bool) -> None:
    """What the engine refuses in ``job`` (a constraint that does not compile, a prompt
    or logit_bias_text it cannot take) answers as a 400 naming the field."""
    try:
        for part in parts_of(job):
            state.scheduler.check(part)
    except ToolError as e:  # a tool's schema cannot hold a call
        raise APIError(400, f"tools: {e}", param="tools") from None
    except ConstraintError as e:  # the schema/regex/grammar does not compile
        field = constraint_from_request(body)[1]
        raise APIError(400, f"{field}: {e}", param=field) from None
    except SettingsError as e:  # the prompt, or a logit_bias_text TEXT the tokenizer makes nothing of
        param = "logit_bias_text" if str(e).startswith("bad logit bias") else ("messages" if chat else "prompt")
        if "combine with tool calls" in str(e):
            param = "tool_choice"
        raise APIError(400, str(e), param=param) from None
    except ResourceError as e:  # its KV cache cannot fit: fewer new tokens (or a shorter prompt) might
        raise APIError(400, str(e), param="max_tokens") from None


def prepare(state: ServerState, raw: bytes, chat: bool, api: str = "") -> tuple[dict, Job, int | None, bool, bool]:
    """(body, job, logprob alternatives, stream, include_usage) for a request body, the
    job checked but not queued. Runs on the request threads (``state.prep``), never on the
    event loop: parsing, tokenizing and compiling a constraint take time that grows with
    the body."""
    body = parse_body(raw, state.model_names, any_model=state.any_model)
    if api == "responses":
        body = responses_api.chat_body(body)
    body, ex = read_extensions(body)
    try:
        if chat:
            job, top = chat_job(state, body, ex)
        elif is_batch(body.get("prompt")):
            job, top = batch_job(state, body, ex)
        else:
            job, top = completion_job(state, body, ex)
    except APIError as e:
        raise ex.named(e) from None
    stream, include_usage = stream_options(body)
    check_job(state, job, body, chat)
    return body, job, top, stream, include_usage


# -- generation ---------------------------------------------------------------------------


async def generate(request: Request, chat: bool, api: str = ""):
    state: ServerState = request.app.state.server
    loop = asyncio.get_running_loop()
    endpoint = api or ("chat" if chat else "completions")
    try:
        check_key(request)
        if state.draining:
            raise APIError(503, SHUTTING_DOWN, code="shutting_down", type="server_error")
        raw = await request.body()
        body, job, top, stream, include_usage = await loop.run_in_executor(state.prep, prepare, state, raw, chat, api)
        # queued here, on the loop: a request whose client left during prepare queues nothing
        job.loop, job.events = loop, asyncio.Queue()
        enqueue(state.scheduler, job)
    except APIError as e:
        state.metrics.request(endpoint, e.status)
        return error(e)
    state.metrics.request(endpoint, 200)
    reply = Reply(state, body, chat, job, top)
    if api == "responses":
        if stream:
            return EventStream(event_frames(responses_api.events(stream_batches(reply, True), body, state.model_id)))
        return await whole_reply(request, reply, lambda chat: responses_api.whole(chat, body, state.model_id))
    if stream:
        return EventStream(sse_frames(reply, include_usage))
    return await whole_reply(request, reply)


async def whole_reply(request: Request, reply: Reply, shape: Callable[[dict], dict] = lambda d: d):
    """The reply as one JSON response once every choice is done; a client that leaves
    first cancels the job."""
    job = reply.job
    tokens: list[list[Token]] = [[] for _ in job.lanes]

    async def until_disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel.set()

    watch = asyncio.ensure_future(until_disconnect())
    clock = reply.server.metrics.clock(len(job.lanes))
    try:
        while (item := await job.events.get()) is not None:
            if isinstance(item, Exception):
                return error(APIError(500, f"generation failed: {item}", type="server_error"))
            choice, ev = item
            if isinstance(ev, Token):
                clock.token(choice)
                tokens[choice].append(ev)
    finally:
        watch.cancel()
        job.cancel.set()
        reply.count_tokens()
    if any(d is None for d in job.done) or reply.cut_by_shutdown():
        return error(APIError(503, "the server stopped before the reply was done", code="shutting_down",
                              type="server_error"))
    if (failed := reply.failure()) is not None:
        return error(failed)
    return JSONResponse(shape(reply.whole(tokens)))


async def sse_frames(reply: Reply, include_usage: bool):
    """The reply's events framed (``data: ...`` and a blank line), one write per wake-up:
    the events of one decode step go out together."""
    async with aclosing(stream_batches(reply, include_usage)) as batches:  # closed with this one: its job cancelled
        async for batch in batches:
            yield "".join([frame(data) for data in batch]).encode()


async def event_frames(batches):
    """Named events ({"event", "data"} dicts: the Responses stream's) framed, a list in one write."""
    async with aclosing(batches):
        async for batch in batches:
            if batch:
                yield "".join([frame(e["data"], e["event"]) for e in batch]).encode()


async def stream_batches(reply: Reply, include_usage: bool):
    """The reply's events (JSON texts and [DONE]) in lists, one per wake-up of this
    coroutine: a chat's role chunks first, then one chunk per token with text (or logprobs /
    token ids asked for), each choice's last chunk, usage if asked, and [DONE]."""
    job = reply.job
    started = [False] * len(job.lanes)
    clock = reply.server.metrics.clock(len(job.lanes))
    out: list[str] = []

    def send(obj) -> None:
        out.append(obj if isinstance(obj, str) else json.dumps(obj))
    try:
        if reply.chat:
            for c in range(len(job.lanes)):
                started[c] = True
                send(reply.chunk(c, first=True))
            yield out
            out = []
        while (item := await job.events.get()) is not None:
            while True:  # this item and every one already queued behind it (one decode step's)
                if isinstance(item, Exception):
                    send(APIError(500, f"generation failed: {item}", type="server_error").body())
                    yield out
                    return
                choice, ev = item
                first, started[choice] = not started[choice], True  # completions: no role chunk came first
                if isinstance(ev, Token):
                    clock.token(choice)
                    out += reply.token_texts(choice, ev, first)
                elif isinstance(ev, Done):
                    if (failed := reply.failure(ev)) is not None:  # what streamed stays; the error ends it
                        send(failed.body())
                        yield out
                        return
                    if reply.cut_by_shutdown(ev):  # what streamed stays; the client is told why it ends here
                        item = None
                        break
                    for chunk in reply.done_chunks(choice, ev, first):
                        send(chunk)
                if job.events.empty() or (item := job.events.get_nowait()) is None:
                    break
            if item is None:
                break
            if out:
                yield out
                out = []
        if reply.cut_by_shutdown() or not all(d is not None for d in job.done):
            send(APIError(503, "the server stopped before the reply was done",
                          code="shutting_down", type="server_error").body())
        elif include_usage:
            send({**reply.head(), "object": reply.object + (".chunk" if reply.chat else ""),
                  "choices": [], "usage": reply.usage()})
        send("[DONE]")
        yield out
    finally:
        job.cancel.set()  # a client that left stops its lanes at the next decode step
        reply.count_tokens()
