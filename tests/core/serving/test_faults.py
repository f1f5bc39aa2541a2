"""Faults as a client (or a web page) would send them, against a real ``python -m core serve``
process: counts and sizes refused before any work, Host and Content-Type checks of a keyless
server, CORS only for the origin named, body caps and read timeouts. A normal request
running beside each reproducer must be unaffected."""
import concurrent.futures
import socket
import time

import httpx
import pytest

from tests.helpers import ServeProcess

pytestmark = pytest.mark.timeout(120)

ORIGIN = "http://localhost:3000"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def served(fixtures):
    with ServeProcess(fixtures / "stories260K.gguf",
                      extra=("--max-batch", "4", "--max-body", "65536", "--read-timeout", "1",
                             "--cors-origin", ORIGIN, "--allowed-hosts", "llamadesk.lan")) as s:
        yield s


def post(url, body, *, headers=JSON, timeout=30):
    return httpx.post(url, json=body, headers=headers, timeout=timeout)


def normal(url):
    """A greedy completion whose text is known (the fixture's; llama.cpp agrees)."""
    r = post(url + "/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ", there was a little girl"
    return r


REPRODUCERS = [
    ({"n": 10**12}, "n"), ({"n": 10**6}, "n"), ({"n": 5}, "n"), ({"best_of": 10**12}, "best_of"),
    ({"logprobs": 10**9}, "logprobs"), ({"max_tokens": 10**12}, "max_tokens"),
    ({"stop": ["a"] * 10**4}, "stop"), ({"stop": ["a" * 5000]}, "stop"),
    ({"logit_bias": {str(i % 512) + " " * (i // 512): 1 for i in range(2000)}}, "logit_bias"),
    ({"logit_bias_text": ["x=1"] * 10**4}, "logit_bias_text"),
    ({"stop_token_ids": [1] * 10**4}, "stop_token_ids"), ({"forced_tokens": [1] * 10**4}, "forced_tokens"),
]


def test_every_count_is_refused_before_work_while_a_normal_request_runs(served):
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        beside = pool.submit(lambda: [normal(served.url) for _ in range(3)])
        refused = list(pool.map(lambda case: post(served.url + "/completions",
                                                  {"prompt": "x", "max_tokens": 1, **case[0]}), REPRODUCERS))
        beside.result()
    assert time.monotonic() - t0 < 20  # n=10**12 used to never return; 10**6 blocked everyone 29 s
    for (case, param), r in zip(REPRODUCERS, refused):
        assert r.status_code == 400, (case.keys(), r.text[:200])
        assert r.json()["error"]["param"] == param, r.json()
    t1 = time.monotonic()
    assert httpx.get(served.url + "/models", timeout=5).status_code == 200
    assert time.monotonic() - t1 < 2


def test_a_prompt_too_long_by_its_bytes_is_refused_without_tokenizing(served):
    # stories260K: 2048 positions, no token over 7 bytes: 20000 bytes cannot fit.
    r = post(served.url + "/completions", {"prompt": "Once upon a time " * 1200, "max_tokens": 1})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "bytes" in err["message"] and err["param"] == "prompt"
    chat = post(served.url + "/chat/completions", {"messages": [{"role": "user", "content": "é" * 20000}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"


def test_a_foreign_host_is_refused_and_this_machines_names_answer(served):
    port = served.port
    r = httpx.get(served.url + "/models", headers={"Host": "attacker.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    r = httpx.post(served.url + "/completions", headers={"Host": f"attacker.example:{port}", **JSON},
                   json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST", f"llamadesk.lan:{port}"):
        assert httpx.get(served.url + "/models", headers={"Host": host}).status_code == 200, host


def test_a_cross_site_simple_post_is_415_and_runs_nothing(served):
    # What a page's fetch(url, {method: "POST", body}) sends: text/plain, no preflight.
    r = httpx.post(served.url + "/completions", content=b'{"prompt": "x", "max_tokens": 1}', headers={
        "Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example", "Sec-Fetch-Mode": "no-cors"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert "access-control-allow-origin" not in r.headers
    form = httpx.post(served.url + "/completions", data={"prompt": "x"})  # an HTML form
    assert form.status_code == 415
    ok = post(served.url + "/completions", {"prompt": "x", "max_tokens": 1},
              headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def preflight(url, origin):
    return httpx.options(url + "/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization"})


def test_cors_answers_the_named_origin_only(served):
    p = preflight(served.url, ORIGIN)
    assert p.status_code == 200 and p.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in p.headers["access-control-allow-methods"]
    assert "content-type" in p.headers["access-control-allow-headers"].lower()
    r = post(served.url + "/completions", {"prompt": "x", "max_tokens": 1}, headers={**JSON, "Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    evil = preflight(served.url, "http://evil.example")
    assert evil.status_code >= 400 and "access-control-allow-origin" not in evil.headers
    r = post(served.url + "/completions", {"prompt": "x", "max_tokens": 1},
             headers={**JSON, "Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_without_cors_origin_no_cors_headers_and_preflight_is_405(stories):
    p = preflight(stories.url, "http://localhost:3000")
    assert p.status_code == 405 and p.headers["allow"] == "POST"
    assert not [h for h in p.headers if h.startswith("access-control")]


def test_a_body_over_max_body_is_413_declared_or_streamed(served):
    big = {"prompt": "x" * 70000, "max_tokens": 1}
    r = post(served.url + "/completions", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the cap holds while reading
        for _ in range(9):
            yield b" " * 8192
    r = httpx.post(served.url + "/completions", content=chunks(), headers=JSON)
    assert r.status_code == 413
    normal(served.url)


def raw(port, data: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    s.sendall(data)
    return s


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(4096):
        out += chunk
    return out


def test_slow_headers_and_slow_bodies_get_408_and_are_closed(served):
    t0 = time.monotonic()
    heads = raw(served.port, b"GET /v1/models HTTP/1.1\r\nHost: 127")
    body = raw(served.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n{\"prompt\"")
    for s in (heads, body):
        got = read_all(s)  # the server closes it: recv returns b""
        assert got.startswith(b"HTTP/1.1 408") and b"request_timeout" in got
        s.close()
    assert time.monotonic() - t0 < 6  # --read-timeout 1


def test_slowloris_connections_are_all_closed_and_others_served(served):
    conns = [raw(served.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(64)]
    try:
        normal(served.url)  # served beside them
        t0 = time.monotonic()
        for s in conns:
            s.sendall(b"X-a: b\r\n")  # a header line now and then keeps no connection alive past the deadline
        closed = [read_all(s) for s in conns]
        assert all(c.startswith(b"HTTP/1.1 408") for c in closed)
        assert time.monotonic() - t0 < 6
    finally:
        for s in conns:
            s.close()
