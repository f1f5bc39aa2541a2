"""The scheduler thread: one thread owns the engine and runs continuous batching over it.

A request that arrives while others decode joins their batch at the next step
(:meth:`core.engine.engine.Engine.serve`); ``n > 1`` is one job whose lanes share a
prefill. Jobs that speculate (prompt lookup or a draft model) join the same batch: the
engine's one loop verifies their drafts in the forward that runs the other rows. A client
that goes away sets its job's cancel event, which the engine checks every decode step.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from core.engine.engine import Engine, Joining
from core.engine.events import Done, Prefilled
from core.engine.settings import SamplingParams
from core.prompt.tool_format import ToolCalling
from core.serving.protocol import APIError, QueueFull


@dataclass
class Job:
    """One HTTP request's generation: its lanes' events go to ``events`` on the loop."""
    prompt: list[int]
    lanes: list[SamplingParams]
    strip_leading_space: bool = False
    inspect: int = 0
    stop_ids: frozenset[int] = frozenset()  # this request's: a chat adds its format's end of turn
    forced: tuple[int, ...] = ()  # the reply's first tokens, given (a branch: forced_tokens)
    min_tokens: int = 0  # vLLM's min_tokens: no stop before this many tokens
    tools: ToolCalling | None = None  # the functions its replies may call (tools, tool_choice)
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    done: list[Done | None] = field(default_factory=list)
    # Set by the scheduler once the job runs: its events wait there and reach the loop
    # with every other job's of the same decode step, in one wake-up (Scheduler.flush).
    outbox: list | None = field(default=None, repr=False, compare=False)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    def prompt_of(self, choice: int) -> list[int]:
        """The prompt choice ``choice`` continues (a group of prompts has several)."""
        return self.prompt

    def emit(self, item) -> None:
        """Hand (choice, event), an exception, or None (finished) to the request's coroutine."""
        if self.outbox is not None:
            self.outbox.append((self.loop, self.events, item))
        elif self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)


def _deliver(items: list) -> None:
    """On the loop: one decode step's events, in order, to their requests' queues."""
    for queue, item in items:
        queue.put_nowait(item)


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
        self._outbox: list = []  # (loop, queue, item) of running jobs, sent once per step
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="llamadesk-serve", daemon=True)

    @property
    def active_lanes(self) -> int:
        """Lanes decoding now."""
        return len(self._lanes)

    @property
    def waiting(self) -> int:
        """Jobs waiting for rows."""
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits."""
        return not self._lanes and not self._waiting

    def start(self) -> None:
        self._thread.start()

    def abort(self) -> None:
        """Refuse new jobs and end every running and waiting one, without waiting for the
        thread (the event loop calls this when a drain runs out of time)."""
        with self._cond:
            self._stopping = True
            for job in list(self._waiting):
                job.emit(None)
            self._waiting.clear()
            for job, _ in list(self._lanes.values()):
                job.cancel.set()
            self._cond.notify_all()

    def stop(self) -> None:
        """Cancel everything, end the thread."""
        self.abort()
        if self._thread.is_alive():
            self._thread.join()

    def submit(self, job: Job) -> None:
        self.check(job)
        self.enqueue(job)

    def check(self, job: Job) -> None:
        """What the engine refuses in ``job`` (SettingsError, ConstraintError), its lanes
        validated with concrete seeds. Any thread: the request threads run it."""
        if len(job.lanes) > self.max_batch:
            raise APIError(400, f"n must be at most {self.max_batch} (the server's --max-batch)", param="n")
        job.lanes = self.engine.check_request(job.prompt, job.lanes, job.tools)
        job.done = [None] * len(job.lanes)

    def enqueue(self, job: Job) -> None:
        """Queue a checked job (:meth:`check`); APIError 503 when the queue is full or the
        server is stopping."""
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
            try:
                for ev in self.engine.serve(self._admit, max_rows=self.max_batch, on_step=self.flush):
                    self._dispatch(ev)
                self.flush()
            except Exception as e:  # a bug or out of memory: fail the requests, keep serving
                self.engine.cache.reset()  # it may hold a half-written step: never reuse it
                with self._cond:
                    jobs = {id(j): j for j, _ in self._lanes.values()}.values()
                    self._lanes.clear()
                for job in jobs:
                    job.emit(e)
                self.flush()

    def flush(self) -> None:
        """Send the events the running jobs emitted since the last flush: one
        ``call_soon_threadsafe`` per event loop for the whole decode step, not one per
        token (at 16 streams that wake-up and its self-pipe write were most of the
        scheduler thread's cost outside the model and the sampler)."""
        if not self._outbox:
            return
        by_loop: dict = {}
        for loop, queue, item in self._outbox:
            by_loop.setdefault(loop, []).append((queue, item))
        self._outbox.clear()
        for loop, items in by_loop.items():
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(_deliver, items)

    def _admit(self, free: int, next_lane: int) -> list[Joining]:
        """Start the jobs at the head of the queue that fit in ``free`` lanes, in order."""
        out = []
        with self._cond:
            while self._waiting and not self._stopping:
                job = self._waiting[0]
                if job.cancel.is_set():  # its client left while it waited
                    self._waiting.popleft()
                    job.emit(None)
                    continue
                if len(job.lanes) > free:
                    break
                self._waiting.popleft()
                job.outbox = self._outbox
                for c in range(len(job.lanes)):
                    self._lanes[next_lane + c] = (job, c)
                next_lane += len(job.lanes)
                free -= len(job.lanes)
                out.append(Joining(job.prompt, job.lanes, job.cancel, job.strip_leading_space, job.inspect,
                                   job.stop_ids, job.forced, min_tokens=job.min_tokens, tools=job.tools))
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
