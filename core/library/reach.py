"""Is the Hub reachable at all? A quick answer before a request that would retry for half a minute.

Offline, ``huggingface_hub`` retries each request five times with back-off (about 24 s) and
logs eleven lines to the terminal while doing so. :func:`check_reachable` opens one TCP
connection to the Hub (or to the proxy the environment names for it) with a deadline, so
"no network" is known in a few seconds; :func:`quiet_retry_logs` keeps the retry chatter out
of the terminal by its logger's level (``HF_HUB_VERBOSITY``, when set, still wins).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from core.errors import HubNetworkError, one_line

PROBE_TIMEOUT = 2.5  # seconds: the whole answer (name lookup and connect) within 3 s
REMEMBER_OK = 30.0   # seconds a successful probe is trusted, so browsing costs no extra round trips
RETRY_LOGGER = "huggingface_hub.utils._http"  # where "Retrying in 1s [Retry 1/5]." comes from

_ok_until: dict[tuple[str, int], float] = {}
_ok_lock = threading.Lock()


def quiet_retry_logs() -> None:
    """Keep huggingface_hub's per-retry warnings off the terminal (its errors still show);
    a user who set HF_HUB_VERBOSITY asked for its logs and keeps them."""
    if not os.environ.get("HF_HUB_VERBOSITY"):
        logging.getLogger(RETRY_LOGGER).setLevel(logging.ERROR)


def target(url: str) -> tuple[str, int, str]:
    """(host, port, what to call it) a connection to ``url`` really goes to: the proxy the
    environment names for its scheme, unless the host is excluded (NO_PROXY)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxy = getproxies().get(parts.scheme) or getproxies().get("all")
    if proxy and not proxy_bypass(host):
        p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if p.hostname:
            return p.hostname, p.port or 8080, f"the proxy {p.hostname}:{p.port or 8080}"
    return host, port, host


def _connect(host: str, port: int, timeout: float) -> None:
    with socket.create_connection((host, port), timeout=timeout):
        pass


def check_reachable(url: str, timeout: float | None = None) -> None:
    """Return when a TCP connection to ``url``'s host (or its proxy) opens within ``timeout``
    seconds; else raise :class:`HubNetworkError` saying why, by then. The name lookup has no
    timeout of its own, so the attempt runs on a daemon thread and is left behind if late."""
    timeout = PROBE_TIMEOUT if timeout is None else timeout
    host, port, name = target(url)
    key = (host, port)
    with _ok_lock:
        if _ok_until.get(key, 0.0) > time.monotonic():
            return
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def attempt() -> None:
        try:
            _connect(host, port, timeout)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 — handed to the caller's thread
            outcome.append(e)
        done.set()

    threading.Thread(target=attempt, name="hub-probe", daemon=True).start()
    if not done.wait(timeout):
        raise HubNetworkError(f"cannot reach the Hub at {name}: no answer within {timeout:g} s (no network, "
                              "or a firewall)")
    err = outcome[0]
    if err is None:
        with _ok_lock:
            _ok_until[key] = time.monotonic() + REMEMBER_OK
        return
    if isinstance(err, socket.gaierror):
        raise HubNetworkError(f"cannot reach the Hub at {name}: no network (the name {host} cannot be looked up)")
    raise HubNetworkError(f"cannot reach the Hub at {name}: {one_line(err, 80)}")


def forget() -> None:
    """Probe again next time (after the user changed the network, or in tests)."""
    with _ok_lock:
        _ok_until.clear()
