"""What reaches the handlers: requests meant for this server, of a size and speed it can take.

A server without an API key answers whoever can reach it, and a web page the user visits
can reach loopback: through DNS rebinding (a name of the page's that resolves to
127.0.0.1, sent as the Host header) or with a cross-site "simple" POST (text/plain, no
preflight). So a keyless server answers only Host names that are this machine's, and every
POST must say ``Content-Type: application/json``, which a page can send cross-site only
after a CORS preflight this server does not answer (unless ``--cors-origin`` names the
page's origin). Bodies are capped (413) and must arrive within the read timeout (408).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

MiB = 1 << 20
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class HTTPOptions:
    """How the HTTP layer guards the app (``serve`` flags of the same names).

    ``allowed_hosts``: Host names answered besides loopback's and the bound address
    (a keyless server only); ``cors_origins``: origins a browser page may call from;
    ``max_body``: bytes a request body may have; ``read_timeout``: seconds a client has to
    send a request's headers, and again its body; ``shutdown_timeout``: seconds running
    requests may finish in once the server is told to stop."""
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_body: int = 8 * MiB
    read_timeout: float = 30.0
    shutdown_timeout: float = 10.0


def host_name(value: str) -> str:
    """A Host header's name without its port, lower-cased ("[::1]:8000" -> "[::1]")."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0].rstrip(".") if value.count(":") == 1 else value.rstrip(".")


def answered_hosts(bound: str, extra: tuple[str, ...]) -> frozenset[str]:
    """The Host names a keyless server bound to ``bound`` answers."""
    shown = f"[{bound.strip('[]')}]" if ":" in bound else bound
    return frozenset(host_name(h) for h in (*LOOPBACK_NAMES, shown, *extra))


def refusal(status: int, message: str, code: str, *, close: bool = False) -> tuple[bytes, list]:
    """(OpenAI's error object as a body, the response headers) for a refused request."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the rest of the request is not read: the connection cannot carry another
        headers.append((b"connection", b"close"))
    return body, headers


class Guard:
    """ASGI middleware: the Host check (``hosts`` None: any Host, as a server with a key
    takes), the JSON content type on POST (415), the body cap (413) and its read timeout
    (408). The body is read here in full and handed on as one message."""

    def __init__(self, app, *, hosts: frozenset[str] | None, max_body: int, read_timeout: float):
        self.app, self.hosts, self.max_body, self.read_timeout = app, hosts, max_body, read_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host")
        if self.hosts is not None and (host is None or host_name(host) not in self.hosts):
            shown = json.dumps(host)[:80] if host is not None else "none"
            return await respond(send, 403, f"Host {shown} is not this server's: a server without --api-key "
                                 "answers localhost, 127.0.0.1, [::1] and --allowed-hosts", "host_not_allowed")
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            return await respond(send, 415, f"send the body as Content-Type: application/json, not "
                                 f"{json.dumps(kind)[:80] if kind else 'none'}", "unsupported_media_type", close=True)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            return await self.too_large(send)
        try:
            raw = await asyncio.wait_for(read_all(receive, self.max_body), self.read_timeout)
        except asyncio.TimeoutError:
            return await respond(send, 408, f"the request body did not arrive within {self.read_timeout:g} s",
                                 "request_timeout", close=True)
        except OverflowError:
            return await self.too_large(send)
        except ConnectionError:  # the client left mid-body: no one to answer
            return None
        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def too_large(self, send):
        return await respond(send, 413, f"the request body is larger than this server takes ({self.max_body} bytes; "
                             "serve --max-body)", "request_too_large", close=True)


async def read_all(receive, limit: int) -> bytes:
    """The whole body; OverflowError past ``limit`` bytes, ConnectionError on a disconnect."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise OverflowError
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def respond(send, status: int, message: str, code: str, *, close: bool = False) -> None:
    body, headers = refusal(status, message, code, close=close)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
