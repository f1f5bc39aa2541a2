"""Remote backends in the app, end to end against a real ``python -m core serve`` process
serving the stories260K fixture on loopback: the bridge, the reply controller, the main
window's chat, the Connect to Server dialog, and the failures a user meets."""
from __future__ import annotations

import asyncio
import threading

import pytest

from core.client import RemoteModel
from core.engine import Done
from core.sampling import SamplingParams
from core.worker import GenerateRequest, Prompted
from core.worker import Worker
from gui.bridge import Bridge, Chunk
from tests.gui.ui_helpers import _KEEP, bridge, data_dir, loop, run, settings, until  # noqa: F401  (shared fixtures)
from tests.helpers import ServeProcess

pytestmark = pytest.mark.timeout(240)
KEY = "gui-test-key"
KNOWN = ", there was a little girl named Lily. She loved to play"  # the fixture's greedy text


@pytest.fixture(scope="module")
def server(fixtures):
    """One server for the module (its model loads once); tests that kill one start their own."""
    with ServeProcess(fixtures / "stories260K.gguf", key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def remote(server):
    """The server's model, connected and probed (as the Connect dialog leaves it)."""
    r = RemoteModel(server.url, api_key=KEY)
    r.connect()
    r.probe()
    return r


def completion(n=8, temperature=0.0, seed=3):
    return GenerateRequest(mode="completion", prompt="Once upon a time",
                           params=SamplingParams(temperature=temperature, max_new_tokens=n, seed=seed))


async def collect(stream) -> list:
    return [ev async for ev in stream]


class HeldWorker(Worker):
    """A worker whose local requests wait (in its thread) until released: torch work in progress."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.held, self.release = threading.Event(), threading.Event()

    def _do_generate(self, cmd):
        self.held.set()
        self.release.wait(60)
        return super()._do_generate(cmd)


def test_a_remote_reply_streams_through_the_bridge_while_the_worker_is_busy(loop, remote):
    """The torch worker is held inside a local request; the server's reply still streams,
    as Prompted, Chunk…, Done, the same events as a local reply."""
    bridge = Bridge(worker_factory=lambda on_event: HeldWorker(on_event, torch_threads=1))
    worker = bridge.worker

    async def scenario():
        local = bridge.generate(completion())  # no model loaded: it fails, once released
        await until(worker.held.is_set, what="the worker holding the local request")
        evs = await collect(bridge.generate(completion(), backend=remote))
        assert not local.finished  # the local request is still in the worker's hands
        worker.release.set()
        await collect(local)
        return evs
    try:
        evs = run(loop, scenario())
    finally:
        worker.release.set()
        loop.run_until_complete(bridge.shutdown())
        _KEEP.append(bridge)
    assert isinstance(evs[0], Prompted) and isinstance(evs[-1], Done)
    assert all(isinstance(e, Chunk) for e in evs[1:-1])
    done = evs[-1]
    assert done.text == KNOWN[:len(done.text)] and done.stop_reason == "length"
    assert "".join(c.text for c in evs[1:-1]) == done.text
    assert [t.token_id for c in evs[1:-1] for t in c.tokens] == done.tokens


def test_stopping_a_remote_reply_stops_only_it(loop, bridge, remote):
    async def scenario():
        a = bridge.generate(GenerateRequest(messages=[{"role": "user", "content": "Tell me a story."}],
                                            params=SamplingParams(temperature=1.0, max_new_tokens=400, seed=2)),
                            backend=remote)
        b = bridge.generate(completion(n=12), backend=remote)
        got = []
        async for ev in a:
            got.append(ev)
            if sum(isinstance(e, Chunk) for e in got) == 1:
                a.cancel()
        return got, await collect(b)
    got, other = run(loop, scenario())
    assert got[-1].stop_reason == "cancelled" and got[-1].text
    assert other[-1].stop_reason == "length" and other[-1].text == KNOWN[:len(other[-1].text)]
    assert not bridge.busy
