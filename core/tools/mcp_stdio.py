"""A stdio transport for MCP servers with a bounded, linear-time reader.

The SDK's own ``stdio_client`` joins and splits its whole buffer for every chunk it reads,
so one 10 MB answer costs seconds of CPU (quadratic), and it has no size bound at all. This
reader scans each chunk once, refuses a message over :data:`MAX_MESSAGE_BYTES` (answering
the request it belonged to with a JSON-RPC error, so the caller hears it at once instead of
waiting out its timeout), and counts lines that are not JSON-RPC (servers that log to stdout)
instead of logging a traceback for each. Shutdown follows the MCP lifecycle: close stdin,
wait, then end the server's whole process group.

POSIX only: on Windows the SDK's transport (with its Job Objects) is used.
"""
from __future__ import annotations

import re
from contextlib import asynccontextmanager, suppress
from typing import TextIO

import anyio
from anyio.abc import Process
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError, jsonrpc_message_adapter

__all__ = ["bounded_stdio", "MAX_MESSAGE_BYTES", "StdioStats"]

MAX_MESSAGE_BYTES = 32 << 20  # a 10 MB text result travels twice (content and structured)
GRACE_SECONDS = 2.0  # for the server to exit on its own once stdin closes
KILL_SECONDS = 2.0  # after SIGTERM to the group, before SIGKILL
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')


class StdioStats:
    """What the reader saw that the session does not report (lines that were not JSON-RPC,
    messages over the size bound), and that bound (``max_message`` bytes)."""

    def __init__(self, max_message: int = MAX_MESSAGE_BYTES):
        self.max_message = max_message
        self.garbage_lines = 0
        self.oversized = 0
        self.last_garbage = ""


@asynccontextmanager
async def bounded_stdio(command: str, args: list[str], env: dict[str, str] | None, cwd: str | None,
                        errlog: TextIO, stats: StdioStats):
    """Start ``command`` and yield the (read, write) streams the SDK's ``Client`` takes."""
    process = await anyio.open_process([command, *args], env={**get_default_environment(), **(env or {})},
                                       stderr=errlog, cwd=cwd, start_new_session=True)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        try:
            async with read_send:
                await _read_lines(process, read_send, stats)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
            pass  # the session is gone or the server closed its stdout: the session sees the end

    async def writer() -> None:
        try:
            async with write_recv:
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_send.aclose()  # a request must not wait on a server that cannot hear it

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_recv, write_send
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, read_recv, write_send)
            tg.cancel_scope.cancel()


async def _read_lines(process: Process, out, stats: StdioStats) -> None:
    buf = bytearray()
    skipping = False  # inside a message over the bound: drop until its newline
    async for chunk in process.stdout:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if not skipping:
                buf += piece
                if len(buf) > stats.max_message:
                    await _refuse(bytes(buf[:400]), out, stats)
                    buf.clear()
                    skipping = True
            if nl < 0:
                break
            if skipping:
                skipping = False
            elif buf.strip():
                item = _parse(bytes(buf), stats)
                if item is not None:
                    await out.send(item)
            buf.clear()
            start = nl + 1


def _parse(line: bytes, stats: StdioStats) -> SessionMessage | None:
    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError:
        stats.garbage_lines += 1
        stats.last_garbage = line[:120].decode("utf-8", "replace").strip()
        return None


async def _refuse(head: bytes, out, stats: StdioStats) -> None:
    """Answer the request an oversized message belonged to with an error (when its id is
    near the start, as every SDK writes it), so the caller is not left waiting."""
    stats.oversized += 1
    found = _ID.search(head)
    if found is None:
        return
    raw = found.group(1)
    request_id = raw[1:-1].decode("utf-8", "replace") if raw.startswith(b'"') else int(raw)
    error = ErrorData(code=INTERNAL_ERROR, message=f"the server's answer is over {stats.max_message / (1 << 20):g} MB "
                                                   "and was not read")
    await out.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))


async def _stop(process: Process, *streams) -> None:
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, GRACE_SECONDS):
        await terminate_posix_process_tree(process, KILL_SECONDS)
        await _exited(process, KILL_SECONDS)
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    for s in streams:
        await s.aclose()


async def _exited(process: Process, timeout: float) -> bool:
    # polls returncode: process.wait() also waits for pipe EOF, which a grandchild can hold
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(0.01)
        return True
    return False
