"""Ctrl+C on a real ``python -m core serve``: running requests go on for --shutdown-timeout,
new ones get 503 with Retry-After, and what still runs then is ended: a stream with an
error event and [DONE], a whole reply with a 503; then the process exits."""
import json
import signal
import threading
import time

import httpx
import pytest

from tests.helpers import ServeProcess

pytestmark = pytest.mark.timeout(120)
JSON = {"Content-Type": "application/json"}
DRAIN = 2.0


def test_ctrl_c_drains_then_ends_streams_with_an_error_and_done(fixtures):
    # bfloat16 keeps the model off the C forward (float32 only): there its 2000 tokens could
    # all stream within the drain, and the test needs requests still running at its end
    with ServeProcess(fixtures / "stories260K.gguf",
                      extra=("--shutdown-timeout", str(DRAIN), "--dtype", "bfloat16")) as s:
        events: list[tuple[float, str]] = []
        streaming = threading.Event()
        whole: dict = {}
        body = {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 1.0, "seed": 1}

        def stream():
            with httpx.stream("POST", s.url + "/completions", json={**body, "stream": True}, headers=JSON,
                              timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append((time.monotonic(), line[6:]))
                        if len(events) == 3:
                            streaming.set()

        def at_once():
            whole["r"] = httpx.post(s.url + "/completions", json=body, headers=JSON, timeout=60)

        threads = [threading.Thread(target=f) for f in (stream, at_once)]
        for t in threads:
            t.start()
        assert streaming.wait(30)
        told = time.monotonic()
        s.proc.send_signal(signal.SIGINT)
        late = httpx.post(s.url + "/completions", json={"prompt": "x", "max_tokens": 1}, headers=JSON, timeout=10)
        assert late.status_code == 503 and late.headers["retry-after"] == "1"
        assert late.json()["error"]["code"] == "shutting_down"
        for t in threads:
            t.join(60)
        assert s.proc.wait(30) is not None  # it exits on its own
    after = [e for when, e in events if when > told + 0.5]
    assert len(after) > 5  # drained: tokens kept coming after Ctrl+C
    assert events[-1][1] == "[DONE]" and events[-1][0] - told >= DRAIN - 0.5
    err = json.loads(events[-2][1])["error"]
    assert err["code"] == "shutting_down" and err["type"] == "server_error"
    text = "".join(json.loads(e)["choices"][0]["text"] for _, e in events[:-2])
    assert text  # what streamed before the end is the client's
    assert whole["r"].status_code == 503 and whole["r"].json()["error"]["code"] == "shutting_down"
