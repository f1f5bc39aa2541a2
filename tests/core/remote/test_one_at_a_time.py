"""Lanes on a server that runs one request at a time and cuts the running reply off when
the next arrives (llama-cpp-python's server, ``--interrupt_requests`` on by default): the
runner notices the reply that ended without a finish reason, runs that server's lanes one
after another from then on, and says so. A small in-test HTTP server behaves as it does, cut
by cut (test_llama_cpp_servers.py runs the same against the real one when it is installed)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from core.engine.events import Done, Token
from core.engine.settings import SamplingParams
from core.remote.client import RemoteModel
from core.remote.runner import ONE_AT_A_TIME, SERIAL, RemoteRunner
from core.worker.protocol import CompareRequest, Error
from tests.helpers import Collector

pytestmark = pytest.mark.timeout(60)
WORDS = [" once", " upon", " a", " time"]


class OneAtATime(ThreadingHTTPServer):
    """A newer request ends the running one's stream without a finish reason. ``together``:
    requests that arrive first wait (their "prefill") until that many have come, so a
    concurrent run is cut deterministically; ``tokens_first`` streams a token before;
    ``vary``: requests after the first ``together`` begin with another word (an unseeded lane)."""
    daemon_threads = True

    def __init__(self, together: int, tokens_first: bool = False, vary: bool = False):
        super().__init__(("127.0.0.1", 0), Handler)
        self.together, self.tokens_first, self.vary = together, tokens_first, vary
        self.cond = threading.Condition()
        self.arrived = self.active = self.most_active = 0

    def latest_is(self, me: int) -> bool:
        return self.arrived == me


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send(json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode())

    def chunk(self, text: str, finish: str | None = None) -> None:
        data = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def do_POST(self):
        srv: OneAtATime = self.server
        json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.cond:
            srv.arrived += 1
            me = srv.arrived
            srv.active += 1
            srv.most_active = max(srv.most_active, srv.active)
            srv.cond.notify_all()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        words = [" twice" if srv.vary and me > srv.together else WORDS[0], *WORDS[1:]]
        try:
            if srv.tokens_first:
                self.chunk(words[0])
            with srv.cond:
                srv.cond.wait_for(lambda: srv.arrived >= srv.together or not srv.latest_is(me), timeout=10)
                cut = not srv.latest_is(me)
            if not cut:
                for w in words[1 if srv.tokens_first else 0:]:
                    self.chunk(w)
                self.chunk("", "length")
            self.wfile.write(b"data: [DONE]\n\n")  # a cut reply ends with no finish reason
        finally:
            with srv.cond:
                srv.active -= 1
        self.close_connection = True


def serve(server: OneAtATime):
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote = RemoteModel(f"http://127.0.0.1:{server.server_address[1]}")
    remote.connect()
    return remote


def compare(runner, remote, col, lanes=3):
    req = CompareRequest(mode="completion", prompt="Hi",
                         lanes=[SamplingParams(temperature=0, max_new_tokens=4, seed=i) for i in range(lanes)])
    rid = runner.compare(req, remote)
    return col.finished(rid, lanes=lanes)


def test_lanes_cut_off_by_a_one_at_a_time_server_run_again_one_after_another():
    server = OneAtATime(together=3)
    remote = serve(server)
    col = Collector()
    runner = RemoteRunner(col)
    try:
        evs = compare(runner, remote, col)
        assert not [e for e in evs if isinstance(e, Error)]
        done = sorted((e for e in evs if isinstance(e, Done)),
                      key=lambda d: d.lane)
        assert [d.text for d in done] == ["".join(WORDS)] * 3
        assert sum(d.stats.decode == SERIAL for d in done) == 2  # the two cut off ran again, and say so
        assert remote.url in runner.one_at_a_time
        # Remembered for the session: the next comparison on it never runs two at once.
        server.most_active = 0
        evs = compare(runner, remote, col)
        done = [e for e in evs if isinstance(e, Done)]
        assert len(done) == 3 and all(d.stats.decode == SERIAL and d.text == "".join(WORDS) for d in done)
        assert server.most_active == 1
    finally:
        server.shutdown()
        server.server_close()


def test_a_lane_cut_off_after_it_streamed_runs_again_without_showing_its_tokens_twice():
    """llama-cpp-python's server cuts a reply only after sending it a chunk: the lane runs
    again alone, streams the same first token (its seed), and the consumer sees each once."""
    server = OneAtATime(together=2, tokens_first=True)
    remote = serve(server)
    col = Collector()
    runner = RemoteRunner(col)
    try:
        evs = compare(runner, remote, col, lanes=2)
        assert not [e for e in evs if isinstance(e, Error)]
        done = sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)
        assert [d.text for d in done] == ["".join(WORDS)] * 2 and sum(d.stats.decode == SERIAL for d in done) == 1
        for lane in (0, 1):  # each token shown once, in order
            assert "".join(e.text for e in evs if isinstance(e, Token) and e.lane == lane) == "".join(WORDS)
        assert remote.url in runner.one_at_a_time
    finally:
        server.shutdown()
        server.server_close()


def test_a_lane_that_runs_again_otherwise_than_it_streamed_fails_naming_the_server_setting():
    server = OneAtATime(together=2, tokens_first=True, vary=True)
    remote = serve(server)
    col = Collector()
    runner = RemoteRunner(col)
    try:
        evs = compare(runner, remote, col, lanes=2)
        err = [e for e in evs if isinstance(e, Error)]
        assert len(err) == 1 and err[0].kind == "cut"
        assert ONE_AT_A_TIME in err[0].message and "--interrupt_requests False" in err[0].message
        assert "' twice'" in err[0].message and "' once'" in err[0].message  # what it streamed, then and now
        assert "one after another" in err[0].message and remote.url in runner.one_at_a_time
    finally:
        server.shutdown()
        server.server_close()


def test_cli_compare_on_such_a_server_runs_its_lanes_one_after_another(capsys):
    from core.cli.main import main  # the CLI, as `python -m core compare --server` runs it
    server = OneAtATime(together=3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        rc = main(["compare", "--server", url, "--prompt", "Hi", "--max-new-tokens", "4", "--json",
                   "--lane", "temperature=0", "--lane", "temperature=1,seed=1", "--lane", "temperature=1,seed=2"])
        out, err = capsys.readouterr()
        assert rc == 0, err
        lanes = json.loads(out)["lanes"]
        assert [lane["text"] for lane in lanes] == ["".join(WORDS)] * 3
        assert sum(lane["stats"].get("decode") == SERIAL for lane in lanes) == 2
        assert ONE_AT_A_TIME in err and "--interrupt_requests False" in err
    finally:
        server.shutdown()
        server.server_close()
