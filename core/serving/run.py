"""Running the server: bind a socket, serve until interrupted (the CLI's ``serve``), or
serve on a thread of this process (:class:`RunningServer`: tests, benchmarks, the app)."""
from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Callable

import uvicorn

from core.serving.app import build_app
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


class RunningServer:
    """A server on its own thread (tests, benchmarks, the app): ``url``, ``stop()``.

    ``wrap`` puts ASGI middleware around the app."""

    def __init__(self, state: ServerState, *, host: str = "127.0.0.1", port: int = 0,
                 wrap: Callable | None = None):
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
    sock = bind(host, port)
    h, p = sock.getsockname()[:2]
    shown = f"[{h}]" if ":" in h else h
    app = build_app(state, on_startup=lambda: announce(f"http://{shown}:{p}/v1"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
