"""One /v1/completions request with a list of prompts (LangChain's ``.batch()``, vLLM and
llama.cpp take it): one scheduler job per prompt, answered as one reply.

The jobs queue together and join the running batch as rows free up, each prompt's ``n``
choices sharing its prefill. Choices are numbered as OpenAI numbers them: prompt i,
choice j is index ``i * n + j``; usage sums the prompts.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from core.serving.protocol import APIError
from core.serving.scheduler import Job, Scheduler

MAX_PROMPTS = 64  # prompts one request may give (each is a queued job)


@dataclass
class Part(Job):
    """One prompt's job in a group: its events go to the group's queue, numbered past the
    prompts before it; the group ends once every part has."""
    group: "JobGroup | None" = None
    offset: int = 0

    def emit(self, item) -> None:
        if isinstance(item, tuple):
            item = (item[0] + self.offset, item[1])
        elif item is None and not self.group.finished_part():
            return
        super().emit(item)


class JobGroup:
    """The parts of one request, seen by the reply as one job (lanes, done, cancel, events)."""

    def __init__(self, parts: list[Job]):
        self.cancel = threading.Event()  # one client: leaving cancels every prompt
        self.parts: list[Part] = []
        offset = 0
        for job in parts:
            self.parts.append(Part(job.prompt, job.lanes, job.strip_leading_space, job.inspect, job.stop_ids,
                                   job.forced, job.min_tokens, cancel=self.cancel, group=self, offset=offset))
            offset += len(job.lanes)
        self.strip_leading_space = False
        self._left, self._lock = len(self.parts), threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue | None = None

    def finished_part(self) -> bool:
        """One part is done; True when it was the last (the group's end may be said)."""
        with self._lock:
            self._left -= 1
            return self._left == 0

    @property
    def lanes(self) -> list:
        return [q for p in self.parts for q in p.lanes]

    @property
    def done(self) -> list:
        return [d for p in self.parts for d in p.done]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.prompt) for p in self.parts)

    def prompt_of(self, choice: int) -> list[int]:
        return next(p.prompt for p in reversed(self.parts) if p.offset <= choice)

    @property
    def loop(self):
        return self._loop

    @loop.setter
    def loop(self, loop) -> None:
        self._loop = loop
        for p in self.parts:
            p.loop = loop

    @property
    def events(self):
        return self._events

    @events.setter
    def events(self, queue) -> None:
        self._events = queue
        for p in self.parts:
            p.events = queue


def parts_of(job) -> list[Job]:
    return job.parts if isinstance(job, JobGroup) else [job]


def enqueue(scheduler: Scheduler, job) -> None:
    """Queue a job or every part of a group; a group the queue cannot take whole is
    cancelled (its queued parts are dropped unrun) and answered 503."""
    try:
        for part in parts_of(job):
            scheduler.enqueue(part)
    except APIError:
        job.cancel.set()
        raise
