"""Offline is known in seconds (one TCP connection with a deadline, the proxy honoured), and
huggingface_hub's retry warnings stay off the terminal."""
from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from huggingface_hub.utils import http_backoff

from core.errors import HubNetworkError
from core.library import reach
from core.library.hub import HubClient


@pytest.fixture(autouse=True)
def _fresh():
    reach.forget()
    yield
    reach.forget()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_an_unreachable_hub_is_said_within_three_seconds(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    client = HubClient(f"http://127.0.0.1:{closed_port()}")
    t = time.monotonic()
    with pytest.raises(HubNetworkError, match="cannot reach the Hub at 127.0.0.1: .*refused"):
        client.search("llama")  # huggingface_hub alone retries this five times over ~24 s
    with pytest.raises(HubNetworkError, match="cannot reach the Hub"):
        client.repo_files("me/tiny")
    assert time.monotonic() - t < 3


def test_a_name_lookup_that_hangs_ends_at_the_deadline(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(reach, "_connect", lambda host, port, timeout: release.wait(10))
    t = time.monotonic()
    with pytest.raises(HubNetworkError, match="cannot reach the Hub at hub.example: no answer within 0.2 s"):
        reach.check_reachable("https://hub.example", timeout=0.2)
    assert time.monotonic() - t < 1
    release.set()


def test_a_success_is_remembered_for_a_while(monkeypatch):
    calls = []
    monkeypatch.setattr(reach, "_connect", lambda host, port, timeout: calls.append((host, port)))
    reach.check_reachable("https://hub.example")
    reach.check_reachable("https://hub.example/api")
    assert calls == [("hub.example", 443)]


def test_the_proxy_is_what_is_probed(monkeypatch):
    monkeypatch.setenv("https_proxy", "http://proxy.lan:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert reach.target("https://huggingface.co")[:2] == ("proxy.lan", 3128)
    monkeypatch.setenv("no_proxy", "huggingface.co")
    assert reach.target("https://huggingface.co")[:2] == ("huggingface.co", 443)


def test_retry_warnings_stay_off_the_terminal(monkeypatch):
    """What reaches huggingface_hub's own logger is what its handler prints on stderr."""
    monkeypatch.delenv("HF_HUB_VERBOSITY", raising=False)
    reach.quiet_retry_logs()  # what importing core.library.hub did
    printed = []
    handler = logging.Handler()
    handler.emit = lambda record: printed.append(record.getMessage())
    logging.getLogger("huggingface_hub").addHandler(handler)
    try:
        with pytest.raises(Exception):
            http_backoff("GET", f"http://127.0.0.1:{closed_port()}/api/models", max_retries=2,
                         base_wait_time=0.01, max_wait_time=0.01)
    finally:
        logging.getLogger("huggingface_hub").removeHandler(handler)
    assert not [m for m in printed if "Retrying" in m or "thrown while requesting" in m], printed
