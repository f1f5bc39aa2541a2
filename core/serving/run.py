"""Running the server: bind a socket, serve until interrupted (the CLI's ``serve``), or
serve on a thread of this process (:class:`RunningServer`: tests, benchmarks, the app)."""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from typing import Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from core.serving.app import build_app
from core.serving.guard import HTTPOptions, refusal
from core.serving.state import ServerState


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(256)
    sock.set_inheritable(True)
    return sock


class TimedH11(H11Protocol):
    """uvicorn's HTTP/1.1 connection with a deadline for each request's headers: a client
    that sends them slowly (or not at all: slowloris) gets 408 and the connection closes
    ``read_timeout`` seconds after it opened, or after its first byte of a later request."""

    read_timeout = 30.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = self.loop.call_later(self.read_timeout, self._headers_late)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not waiting and self._header_timer is not None:  # the headers are in
            self._header_timer.cancel()
            self._header_timer = None
        elif waiting and self._header_timer is None:  # a later request has begun
            self._header_timer = self.loop.call_later(self.read_timeout, self._headers_late)

    def connection_lost(self, exc) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        body, headers = refusal(408, f"the request's headers did not arrive within {self.read_timeout:g} s",
                                "request_timeout", close=True)
        head = b"".join(k + b": " + v + b"\r\n" for k, v in headers)
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\n" + head + b"\r\n" + body)
        self.transport.close()


def uvicorn_config(app, options: HTTPOptions) -> uvicorn.Config:
    """uvicorn's settings for ``app``: h11 with the header deadline, keep-alive connections
    closed after 5 idle seconds, uvloop's event loop where it is installed (asyncio's
    otherwise), no access log. Running requests were drained before uvicorn's own
    shutdown starts (:class:`DrainingServer`); it waits a few seconds more for the last bytes."""
    protocol = type("TimedH11", (TimedH11,), {"read_timeout": options.read_timeout})
    return uvicorn.Config(app, log_level="warning", lifespan="on", http=protocol, loop="auto", access_log=False,
                          timeout_keep_alive=5, timeout_graceful_shutdown=5)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before its shutdown: the first Ctrl+C (or SIGTERM)
    stops new requests (503 with Retry-After; /health says 503) and lets running ones
    finish for up to ``shutdown_timeout`` seconds; then what still runs is ended, each
    stream with an error event and [DONE], and the server exits. A second Ctrl+C exits now."""

    def __init__(self, config: uvicorn.Config, state: ServerState, shutdown_timeout: float):
        super().__init__(config)
        self.state, self.shutdown_timeout = state, shutdown_timeout
        self._drain_until: float | None = None
        self._aborted_at: float | None = None

    def handle_exit(self, sig, frame) -> None:
        if self._drain_until is not None:  # asked twice: stop draining
            return super().handle_exit(sig, frame)
        self._captured_signals.append(sig)  # uvicorn raises it again once it has stopped, as it does
        self.state.draining = True
        self._drain_until = time.monotonic() + self.shutdown_timeout

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and not self.should_exit:
            scheduler, now = self.state.scheduler, time.monotonic()
            if scheduler.idle:
                # the streams' last events are on their way; a tick later they have been sent
                self.should_exit = self._aborted_at is None or now - self._aborted_at > 0.2
            elif now >= self._drain_until and self._aborted_at is None:
                self._aborted_at = now
                scheduler.abort()
            elif self._aborted_at is not None and now - self._aborted_at > 5:  # a step that never returns
                self.should_exit = True
        return await super().on_tick(counter)


class RunningServer:
    """A server on its own thread (tests, benchmarks, the app): ``url``, ``stop()``.

    ``wrap`` puts ASGI middleware around the app."""

    def __init__(self, state: ServerState, *, host: str = "127.0.0.1", port: int = 0,
                 wrap: Callable | None = None, options: HTTPOptions = HTTPOptions()):
        self.state = state
        self._sock = bind(host, port)
        h, p = self._sock.getsockname()[:2]
        self.url = f"http://{h}:{p}/v1"
        started = threading.Event()
        app = build_app(state, on_startup=started.set, options=options, bound=host)
        if wrap is not None:  # ASGI middleware around the app (tests: a server that lacks features)
            app = wrap(app)
        self._server = DrainingServer(uvicorn_config(app, options), state, options.shutdown_timeout)
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


def serve_forever(state: ServerState, host: str, port: int, announce: Callable[[str], None],
                  options: HTTPOptions = HTTPOptions()) -> None:
    """Serve until interrupted (the CLI's ``serve``); ``announce`` gets the base URL once listening."""
    sock = bind(host, port)
    h, p = sock.getsockname()[:2]
    shown = f"[{h}]" if ":" in h else h
    app = build_app(state, on_startup=lambda: announce(f"http://{shown}:{p}/v1"), options=options, bound=host)
    server = DrainingServer(uvicorn_config(app, options), state, options.shutdown_timeout)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
