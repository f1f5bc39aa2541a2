"""The async bridge between the Qt UI thread and the model worker thread.

The UI awaits the worker instead of polling it::

    info = await bridge.load(path)                 # raises BridgeError on error or cancel
    async for ev in bridge.generate(request):      # Prompted, Prefilled, Chunk…, Done (or … Error)
        match ev: ...

A reply from a server (``python -m core serve``, vLLM, llama.cpp's server, Ollama) goes
through the same call, naming the server's model as its backend; it streams the same
events (no Prefilled; an Error's ``kind`` names a network failure) on a thread of its own
(core/remote.py), so it never waits for local torch work::

    remote = core.remote.client.RemoteModel(url, api_key=key, model=name)
    remote.connect(); remote.probe()               # blocking: run them off the UI thread
    stream = bridge.generate(request, backend=remote)   # or bridge.compare(request, backend=remote)
    stream.cancel()                                # closes that request's HTTP stream

Worker events arrive on the worker thread; they are queued under a lock and one queued
Qt signal wakes the UI thread, which drains the queue at most once a frame (~16 ms): this
is the app's only frame timer. The engine's Token events of a lane drained together
become ONE :class:`Chunk`, so the UI does at most one update per lane per frame however
fast tokens come. Everything else a stream yields is the worker's or engine's own event.

All methods are called on the UI thread, with a qasync event loop running for the async
ones (``gui/app.py`` builds it).
"""
from __future__ import annotations

import asyncio
import collections
import gc
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from core.engine.events import Done, Prefilled, Token
from core.remote.runner import RemoteRunner
from core.worker.protocol import (AttributeRequest, Attributed, CompareRequest, Counted, Error, GenerateRequest,
                                  Held, LoadProgress, Loaded, Prompted, Unloaded)
from core.worker.worker import Worker
from core.engine.events import Reply

FRAME_S = 1 / 60

__all__ = ["Bridge", "BridgeError", "Chunk", "Prompted", "Prefilled", "Done", "Error", "GenerateRequest",
           "CompareRequest", "FRAME_S"]


class BridgeError(Exception):
    """A load or unload that failed or was cancelled; ``str(err)`` is a user-readable line."""

    def __init__(self, message: str, *, cancelled: bool = False):
        super().__init__(message)
        self.cancelled = cancelled


@dataclass
class Chunk:
    """The engine's Token events of one lane that arrived within a frame, delivered together.

    ``text`` is what to append to the lane's visible reply; ``tokens`` are the events
    themselves (for token counts, logprobs and the token inspector).
    """
    lane: int
    text: str
    tokens: list[Token] = field(default_factory=list)


class _Stream:
    """Async iterator over one generate/compare request.

    Yields ``Prompted``, ``Prefilled``, ``Chunk``… and ``Done`` (one per lane) and ends after
    the last lane's Done. A failure is yielded as an ``Error`` event, which is always the last
    item: errors are data in the stream, never raised, so partial output stays usable.
    Breaking out of ``async for`` does not stop generation: call :meth:`cancel`.
    """

    def __init__(self, bridge: "Bridge", request_id: int, lanes: int):
        self.request_id = request_id
        self._bridge = bridge
        self._lanes_left = lanes
        self._items: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self.finished = False  # the terminal event has arrived (it may not be consumed yet)

    def __aiter__(self) -> "_Stream":
        return self

    async def __anext__(self):
        while not self._items:
            if self.finished:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    @property
    def pending(self) -> int:
        """Events delivered but not consumed yet (a frame's events arrive together)."""
        return len(self._items)

    def cancel(self) -> None:
        """Cancel this request (running or queued); other requests go on."""
        if not self.finished:
            self._bridge._cancel(self.request_id)

    # -- called by the bridge on the UI thread -----------------------------------------

    def _push(self, item) -> bool:
        """Queue an item; True when the stream has now ended."""
        if self.finished:
            return True
        self._items.append(item)
        if isinstance(item, Error):
            self.finished = True
        elif isinstance(item, Done):
            self._lanes_left -= 1
            self.finished = self._lanes_left <= 0
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        return self.finished


class Bridge(QObject):
    """Owns the worker and turns its events into awaitables, async iterators and signals.

    Signals:
        loadProgress(float, str): fraction 0..1 and stage of the running load.
        modelLoaded(dict): a model is ready (its info, incl. "name" and "context_length").
        modelUnloaded(): no model any more (unload, or the old one dropped by a new load).
        errorOccurred(str): a load/unload failure, or an error of a generation nobody is
            iterating any more; errors of a live ``generate``/``compare`` iterator are
            yielded to it instead (not signalled twice).
        busyChanged(bool): whether any load/unload/generation is queued or running.

    Args:
        worker_factory: ``factory(on_event) -> Worker`` (tests pass fakes); default builds
            :class:`core.worker.worker.Worker`.
        torch_threads: torch intra-op threads for the default worker (None: env
            LLAMADESK_THREADS, else the measured default).
    """

    loadProgress = Signal(float, str)
    modelLoaded = Signal(dict)
    modelUnloaded = Signal()
    errorOccurred = Signal(str)
    busyChanged = Signal(bool)
    _wake = Signal()
    _collect = Signal()

    def __init__(self, *, worker_factory: Callable[[Callable[[object], None]], Worker] | None = None,
                 torch_threads: int | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self._lock = threading.Lock()
        self._pending: list = []
        self._wake_pending = False
        self._last_flush = 0.0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.timeout.connect(self._flush)
        # Queued even when emitted on this thread: a flush never runs inside a caller.
        self._wake.connect(self._on_wake, Qt.ConnectionType.QueuedConnection)
        # The worker's garbage collections run here: one on the worker thread would
        # finalise unreachable Qt objects there (a crash seen in the GUI tests under load).
        self._collect.connect(self._on_collect, Qt.ConnectionType.QueuedConnection)
        self._streams: dict[int, _Stream] = {}
        self._futures: dict[int, asyncio.Future] = {}
        self._open: set[int] = set()  # requests not finished yet (for busy)
        self._unloads: set[int] = set()
        self._info: dict | None = None
        #: counts text in the loaded model's tokens, from any thread (None: no model loaded)
        self.token_counter: Callable[[str], int] | None = None
        self._closed = False
        me = weakref.ref(self)

        def collect() -> None:
            bridge = me()
            if bridge is not None:
                bridge._collect.emit()

        factory = worker_factory or (lambda on_event: Worker(on_event, torch_threads=torch_threads,
                                                             collect_garbage=collect))
        # The worker thread must not own the bridge: if its reference were the last one,
        # this QObject would be destroyed on the worker thread (Qt warns, timers leak).
        ref = weakref.WeakMethod(self._on_worker_event)

        def forward(event) -> None:
            method = ref()
            if method is not None:
                method(event)

        self._worker = factory(forward)
        self._worker.start()
        self._remote = RemoteRunner(forward)  # remote requests (negative ids) share the event path

    # -- properties --------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self._open)

    @property
    def model_info(self) -> dict | None:
        """The loaded model's info, or None."""
        return dict(self._info) if self._info is not None else None

    @property
    def worker(self) -> Worker:
        return self._worker

    # -- commands ----------------------------------------------------------------------

    async def load(self, path, *, device: str = "auto", dtype: str = "auto",
                   max_seq_len: int | None = None, compile: bool = False) -> dict:
        """Load a model (cancelling any generation first); returns its info.

        Progress comes through ``loadProgress``. Raises BridgeError (``cancelled`` set
        when cancelled); cancelling the awaiting task cancels the load too.
        """
        fut = asyncio.get_running_loop().create_future()
        rid = self._worker.load(path, device=device, dtype=dtype, max_seq_len=max_seq_len, compile=compile)
        return await self._await(rid, fut)

    async def unload(self) -> None:
        """Drop the model (cancelling any generation first) and free its memory."""
        fut = asyncio.get_running_loop().create_future()
        rid = self._worker.unload()
        self._unloads.add(rid)
        await self._await(rid, fut)

    async def hold(self, path, *, device: str = "auto", dtype: str = "auto") -> dict:
        """Load another checkpoint beside the model (comparison lanes across models);
        returns its info, whose "key" a CompareRequest's ``model`` names. Raises
        BridgeError when it does not fit beside the loaded model or is not a model."""
        fut = asyncio.get_running_loop().create_future()
        return await self._await(self._worker.hold(path, device=device, dtype=dtype), fut)

    async def count(self, request: GenerateRequest) -> int:
        """Tokens the prompt of ``request`` takes with the loaded model (its tokenizer and
        chat format, oldest turns left out as a reply would); nothing is generated.
        Raises BridgeError (no model; cancelled by a load)."""
        fut = asyncio.get_running_loop().create_future()
        return await self._await(self._worker.count(request), fut)

    async def attribute(self, request: AttributeRequest) -> Attributed:
        """Where a span of a local reply came from (:mod:`core.worker.attribute`): the
        Attributed event. Raises BridgeError (no model, a span it cannot place, cancelled)."""
        fut = asyncio.get_running_loop().create_future()
        return await self._await(self._worker.attribute(request), fut)

    def release(self, key: str) -> None:
        """Drop a checkpoint held with :meth:`hold`."""
        self._worker.release(key)

    def generate(self, request: GenerateRequest, *, backend=None) -> _Stream:
        """Queue one reply; returns an async iterator of Prompted, Prefilled, Chunk…, Done (or Error).

        ``backend``: None for the local model, or a connected :class:`core.remote.client.RemoteModel`
        (the reply then streams from that server, beside any local work)."""
        if backend is not None:
            return self._stream(self._remote.generate(request, backend), 1)
        return self._stream(self._worker.generate(request), 1)

    def compare(self, request: CompareRequest, *, backend=None) -> _Stream:
        """Queue a comparison; like :meth:`generate` with one Done per lane (Chunk.lane tells them
        apart). On a ``backend`` server each lane is its own parallel request."""
        if backend is not None:
            return self._stream(self._remote.compare(request, backend), max(1, len(request.lanes)))
        return self._stream(self._worker.compare(request), max(1, len(request.lanes)))

    def cancel_all(self) -> None:
        """Cancel every load and generation, running or queued (closing a window, quitting).
        A single reply or comparison is stopped through its own stream's ``cancel()``."""
        self._worker.cancel_all()
        self._remote.cancel_all()

    def _cancel(self, rid: int) -> None:
        (self._remote if rid < 0 else self._worker).cancel(rid)

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel everything and stop the worker without blocking the event loop.

        Open iterators end (Done "cancelled" or an Error), pending loads raise.
        """
        if self._closed:
            return
        self._closed = True
        self._remote.cancel_all()
        self._worker.stop()
        deadline = time.monotonic() + timeout
        while self._worker.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._finish_shutdown()

    def close(self, timeout: float = 5.0) -> None:
        """Blocking :meth:`shutdown`, for when no event loop runs."""
        if self._closed:
            return
        self._closed = True
        self._remote.cancel_all()
        self._worker.shutdown(timeout)
        self._finish_shutdown()

    # -- internals (UI thread unless noted) ----------------------------------------------

    def _await(self, rid: int, fut: asyncio.Future):
        self._futures[rid] = fut
        self._opened(rid)

        async def wait():
            try:
                return await fut
            except asyncio.CancelledError:
                if rid in self._futures:  # the caller gave up: stop the work too
                    self._worker.cancel(rid)
                raise
        return wait()

    def _stream(self, rid: int, lanes: int) -> _Stream:
        stream = _Stream(self, rid, lanes)
        self._streams[rid] = stream
        self._opened(rid)
        return stream

    def _opened(self, rid: int) -> None:
        was = self.busy
        self._open.add(rid)
        if not was:
            self.busyChanged.emit(True)

    def _closed_request(self, rid: int) -> None:
        if rid in self._open:
            self._open.discard(rid)
            if not self._open:
                self.busyChanged.emit(False)

    def _on_worker_event(self, event) -> None:
        """Worker thread: queue the event and wake the UI thread once per drain."""
        with self._lock:
            self._pending.append(event)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._wake.emit()

    @Slot()
    def _on_collect(self) -> None:
        gc.collect()

    def _on_wake(self) -> None:
        # Pace drains to one a frame: the first event after a quiet spell goes at once
        # (lowest latency), a steady stream is batched per frame.
        delay = self._last_flush + FRAME_S - time.perf_counter()
        if delay <= 0:
            self._flush()
        elif not self._timer.isActive():
            self._timer.start(max(1, round(delay * 1000)))

    @Slot()
    def _flush(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
            self._wake_pending = False
        if not events:
            return
        self._last_flush = time.perf_counter()
        chunks: dict[tuple[int, int], list[Token]] = {}
        for ev in events:
            if isinstance(ev, Reply) and isinstance(ev.event, Token):
                chunks.setdefault((ev.request_id, ev.event.lane), []).append(ev.event)
                continue
            if chunks:  # everything before a lifecycle event goes out before it
                self._deliver(chunks)
                chunks = {}
            self._dispatch(ev)
        if chunks:
            self._deliver(chunks)

    def _deliver(self, chunks: dict[tuple[int, int], list[Token]]) -> None:
        for (rid, lane), tokens in chunks.items():
            stream = self._streams.get(rid)
            if stream is not None:
                stream._push(Chunk(lane, "".join(t.text for t in tokens), tokens))

    def _dispatch(self, ev) -> None:
        rid = ev.request_id
        if isinstance(ev, LoadProgress):
            self.loadProgress.emit(ev.fraction, ev.stage)
            return
        if isinstance(ev, Unloaded):
            self._info, self.token_counter = None, None
            self.modelUnloaded.emit()
            if rid in self._unloads:
                self._resolve(rid, None)
            return
        if isinstance(ev, Held):
            self._resolve(rid, dict(ev.info))
            return
        if isinstance(ev, (Counted, Attributed)):
            self._resolve(rid, ev.tokens if isinstance(ev, Counted) else ev)
            return
        if isinstance(ev, Loaded):
            self._info, self.token_counter = dict(ev.info), ev.counter
            self.modelLoaded.emit(dict(ev.info))
            self._resolve(rid, dict(ev.info))
            return
        stream = self._streams.get(rid)
        if stream is not None:
            if stream._push(ev.event if isinstance(ev, Reply) else ev):
                del self._streams[rid]
                self._closed_request(rid)
            return
        if isinstance(ev, Error):
            if rid in self._futures:
                self._fail(rid, ev.message, ev.cancelled)
            if not ev.cancelled:  # the user asked for a cancel: not an error to show
                self.errorOccurred.emit(ev.message)

    def _resolve(self, rid: int, value: Any) -> None:
        self._unloads.discard(rid)
        fut = self._futures.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(value)
        self._closed_request(rid)

    def _fail(self, rid: int, message: str, cancelled: bool = False) -> None:
        self._unloads.discard(rid)
        fut = self._futures.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(BridgeError(message, cancelled=cancelled))
        self._closed_request(rid)

    def _finish_shutdown(self) -> None:
        self._timer.stop()
        self._flush()  # what the worker said before it stopped
        for rid, stream in list(self._streams.items()):
            stream._push(Error(rid, "the model worker has shut down"))
        self._streams.clear()
        for rid in list(self._futures):
            self._fail(rid, "the model worker has shut down", cancelled=True)
        for rid in list(self._open):
            self._closed_request(rid)
