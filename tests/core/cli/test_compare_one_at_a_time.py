"""compare's lanes on a server that runs one request at a time and cuts the running reply
when the next arrives (llama-cpp-python's default): a cut lane runs again only after every
lane's first request has ended, so a first request that reaches the server late cannot cut
the rerun off too (seen under load against the real server)."""
import threading
import time
from types import SimpleNamespace

from core.cli import compare
from core.engine.events import Done, Stats
from core.engine.settings import SamplingParams
from core.remote.client import RemoteError
from core.remote.runner import SERIAL


class OneAtATimeServer:
    """Streams a reply in a few steps; a request that arrives cuts the one running."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = None
        self.calls = {0: 0, 1: 0, 2: 0}
        self.first_started = threading.Event()
        self.rerun_started = threading.Event()

    def stream(self, remote, args, params, lane, meta):
        self.calls[lane] += 1
        if self.calls[lane] == 1 and lane == 2:
            self.first_started.wait(2)  # lane 2 reaches the server after lane 0: it cuts lane 0
        if self.calls[lane] == 1 and lane == 1:
            self.rerun_started.wait(0.3)  # lane 1's first request arrives late
        me = SimpleNamespace(cut=False)
        with self.lock:
            if self.running is not None:
                self.running.cut = True
            self.running = me
        if self.calls[lane] == 1 and lane == 0:
            self.first_started.set()
        if self.calls[lane] == 2:
            self.rerun_started.set()
        for _ in range(5):
            time.sleep(0.02)
            if me.cut:
                err = RemoteError("the connection to http://fake/v1 ended mid-reply", kind="cut")
                err.unfinished = True
                raise err
        with self.lock:
            if self.running is me:
                self.running = None
        yield Done(lane=lane, stop_reason="length", tokens=[lane], text=f"lane {lane}", logprobs=[0.0],
                   params=params, stats=Stats())


def test_a_cut_lane_runs_again_after_every_first_request_has_ended(monkeypatch, capsys):
    server = OneAtATimeServer()
    monkeypatch.setattr(compare, "remote_stream", server.stream)
    w = ("http://fake/v1", "m")
    out = compare.run_lanes(SimpleNamespace(), [SamplingParams() for _ in range(3)], [w, w, w],
                            {w: SimpleNamespace(shown="http://fake/v1", tokenizer_fingerprint=None, model="m")})
    assert [out.done[i].text for i in range(3)] == ["lane 0", "lane 1", "lane 2"]
    assert out.done[0].stats.decode == SERIAL  # lane 0 was cut, and ran again alone
    assert "one request at a time" in capsys.readouterr().err
