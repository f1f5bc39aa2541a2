"""The server's counters for ``GET /metrics``, in Prometheus' text format (version 0.0.4):
requests by endpoint and status, prompt and generated tokens, the queue and the batch as
they are now, and histograms of time to first token and of the time between tokens.

Written out by hand: a handful of series needs no client library."""
from __future__ import annotations

import bisect
import threading
import time
from collections import Counter

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        i = bisect.bisect_left(self.buckets, v)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for le, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{le:g}"}} {running}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


class Metrics:
    """What the handlers count (any thread: one lock)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (endpoint, status) -> count
        self.prompt_tokens = self.generated_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.per_token = Histogram(TOKEN_BUCKETS)

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def tokens(self, prompt: int, generated: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.generated_tokens += generated

    def token_time(self, seconds: float, *, first: bool) -> None:
        with self._lock:
            (self.ttft if first else self.per_token).observe(seconds)

    def clock(self, lanes: int) -> "Clock":
        return Clock(self, lanes)

    def render(self, *, waiting: int, running: int) -> str:
        with self._lock:
            lines = ["# HELP llamadesk_requests_total Requests answered, by endpoint and HTTP status.",
                     "# TYPE llamadesk_requests_total counter"]
            lines += [f'llamadesk_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]
            for name, help_, kind, value in (
                    ("prompt_tokens_total", "Prompt tokens of the requests run.", "counter", self.prompt_tokens),
                    ("generation_tokens_total", "Tokens generated.", "counter", self.generated_tokens),
                    ("queue_depth", "Requests waiting for rows.", "gauge", waiting),
                    ("batch_size", "Lanes decoding together now.", "gauge", running)):
                lines += [f"# HELP llamadesk_{name} {help_}", f"# TYPE llamadesk_{name} {kind}", f"llamadesk_{name} {value}"]
            for name, help_, h in (("time_to_first_token_seconds", "From the request to its first token.", self.ttft),
                                   ("time_per_output_token_seconds", "Between one lane's tokens.", self.per_token)):
                lines += [f"# HELP llamadesk_{name} {help_}", f"# TYPE llamadesk_{name} histogram",
                          *h.lines(f"llamadesk_{name}")]
        return "\n".join(lines) + "\n"


class Clock:
    """One request's token times: its first token (per choice) against when it arrived,
    every later one against the choice's previous token."""

    def __init__(self, metrics: Metrics, lanes: int):
        self.metrics, self.start = metrics, time.monotonic()
        self.last: list[float | None] = [None] * lanes

    def token(self, choice: int) -> None:
        now = time.monotonic()
        prev = self.last[choice]
        self.metrics.token_time(now - (self.start if prev is None else prev), first=prev is None)
        self.last[choice] = now
