"""Server-sent events written straight through ASGI's ``send``: the streaming response of
chat, completions and Responses streams.

A stream's frames come pre-framed (``data: ...`` and a blank line, :func:`frame`), all the
events of one decode step in one ``bytes``, and each becomes one ``send``: no per-event
objects, locks or cancel scopes (sse-starlette's response spent more of the event loop's
time on those than on the bytes). What that response gave and clients rely on is kept:
a ``: ping`` comment every ``ping`` seconds (proxies drop idle connections), the
headers that keep proxies from buffering or caching the stream, and a client that leaves
ends the stream at once (its generator is closed, which cancels its job).
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

PING_S = 15.0
HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store"),
           (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no")]


def frame(data: str, event: str | None = None) -> str:
    """One event as the wire carries it (``data`` holds no newline: JSON or [DONE])."""
    return f"event: {event}\ndata: {data}\n\n" if event else f"data: {data}\n\n"


class EventStream:
    """An ASGI response streaming ``frames`` (bytes, each written as it comes) as
    ``text/event-stream``, until they end or the client disconnects."""

    def __init__(self, frames: AsyncIterator[bytes], ping: float = PING_S):
        self.frames, self.ping = frames, ping
        self.ended = False

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        loop = asyncio.get_running_loop()
        pump = loop.create_task(self._pump(send))
        watch = loop.create_task(self._until_disconnect(receive))
        pinger = loop.create_task(self._ping(send))
        try:
            await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watch, pinger):
                task.cancel()
            # the generator's cleanup (cancelling the job) has run once the pump has ended
            await asyncio.gather(pump, watch, pinger, return_exceptions=True)
        if pump.done() and not pump.cancelled() and pump.exception() is not None:
            raise pump.exception()

    async def _pump(self, send) -> None:
        body = b""
        try:
            async for body in self.frames:
                await send({"type": "http.response.body", "body": body, "more_body": True})
        finally:
            await self.frames.aclose()  # a cancelled pump (the client left) runs the generator's cleanup now
        self.ended = True  # no ping after the end
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _until_disconnect(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def _ping(self, send) -> None:
        while True:
            await asyncio.sleep(self.ping)
            if self.ended:
                return
            await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
