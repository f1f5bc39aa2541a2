"""The async bridge under a real qasync loop (offscreen), and gui.app.run's teardown.

Scenarios are coroutines driven from the test with ``loop.run_until_complete``; inside
them only asyncio waits are used (no nested Qt event loops).
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from core.engine.events import Done, Prefilled, Stats, Token
from core.engine.settings import SamplingParams
from core.worker.protocol import CompareRequest, Error, GenerateRequest, Prompted
from core.worker.worker import Worker
from core.engine.events import Reply
from gui.bridge import Bridge, BridgeError, Chunk
from tests.gui.ui_helpers import loop  # noqa: F401  (the shared qasync loop fixture)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def qloop(loop):
    """The shared qasync loop (tests/gui/ui_helpers.py) under this file's name."""
    return loop


class Signals:
    def __init__(self, bridge: Bridge):
        self.progress, self.loaded, self.unloaded, self.errors, self.busy = [], [], [], [], []
        bridge.loadProgress.connect(lambda f, s: self.progress.append((f, s)))
        bridge.modelLoaded.connect(self.loaded.append)
        bridge.modelUnloaded.connect(lambda: self.unloaded.append(True))
        bridge.errorOccurred.connect(self.errors.append)
        bridge.busyChanged.connect(self.busy.append)


@pytest.fixture
def make_bridge(qloop):
    made = []

    def make(**kw):
        kw.setdefault("torch_threads", 1)
        b = Bridge(**kw)
        made.append(b)
        return b, Signals(b)
    yield make
    for b in made:
        b.close()
        assert not b.worker.alive
        b.deleteLater()


@pytest.fixture
def gguf(fixtures):
    return fixtures / "stories260K.gguf"


def run(loop, coro, timeout: float = 30):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


def completion(max_new=30, seed=7, temperature=0.8) -> GenerateRequest:
    return GenerateRequest(mode="completion", prompt="Once upon a time",
                           params=SamplingParams(temperature=temperature, max_new_tokens=max_new, seed=seed))


async def collect(stream, on_chunk=None) -> list:
    out = []
    async for ev in stream:
        out.append(ev)
        if on_chunk is not None and isinstance(ev, Chunk):
            await on_chunk(ev, out)
    return out


def check_stream(evs: list) -> Done:
    """Prompted, Prefilled, Chunk…, Done; chunk texts add up to the reply."""
    assert [type(e) for e in evs[:2]] == [Prompted, Prefilled] and isinstance(evs[-1], Done)
    chunks = evs[2:-1]
    assert all(isinstance(c, Chunk) for c in chunks)
    done = evs[-1]
    assert "".join(c.text for c in chunks) == done.text
    toks = [t for c in chunks for t in c.tokens]
    assert [t.token_id for t in toks] == done.tokens
    assert all(c.text == "".join(t.text for t in c.tokens) for c in chunks)
    return done


# --------------------------------------------------------------------------- real worker

def test_load_then_generate_streams_chunks(make_bridge, qloop, gguf):
    bridge, sig = make_bridge()

    async def scenario():
        info = await bridge.load(gguf)
        assert bridge.busy is False
        evs = await collect(bridge.generate(completion()))
        return info, evs
    info, evs = run(qloop, scenario())
    done = check_stream(evs)
    assert done.stop_reason in ("length", "eos") and done.params.seed == 7
    assert info["name"] == "stories260K" and bridge.model_info == info
    assert sig.loaded == [info]
    assert sig.progress and sig.progress[-1][0] == 1.0
    assert sig.busy == [True, False, True, False] and not bridge.busy
    assert sig.errors == []

    # The same seed through the worker directly gives the same text.
    direct = []
    ev = threading.Event()
    w = Worker(lambda e: (direct.append(e), isinstance(e, Reply) and isinstance(e.event, Done) and ev.set()),
               torch_threads=1)
    w.start()
    w.load(gguf)
    w.generate(completion())
    assert ev.wait(20)
    w.shutdown()
    assert direct[-1].event.text == done.text


def test_compare_streams_lanes(make_bridge, qloop, gguf):
    bridge, _ = make_bridge()
    lanes = [SamplingParams(temperature=0, max_new_tokens=6), SamplingParams(temperature=1, seed=2, max_new_tokens=9)]

    async def scenario():
        await bridge.load(gguf)
        return await collect(bridge.compare(CompareRequest(mode="completion", prompt="Once", lanes=lanes)))
    evs = run(qloop, scenario())
    dones = {e.lane: e for e in evs if isinstance(e, Done)}
    assert set(dones) == {0, 1} and isinstance(evs[-1], Done)
    for lane, d in dones.items():
        assert "".join(c.text for c in evs if isinstance(c, Chunk) and c.lane == lane) == d.text


def test_errors_without_model_and_bad_path(make_bridge, qloop, gguf, tmp_path):
    bridge, sig = make_bridge()

    async def scenario():
        evs = await collect(bridge.generate(completion()))
        assert len(evs) == 1 and isinstance(evs[0], Error) and "no model" in evs[0].message
        with pytest.raises(BridgeError, match="no such file") as err:
            await bridge.load(tmp_path / "missing.gguf")
        assert not err.value.cancelled
        broken = tmp_path / "broken.gguf"
        broken.write_bytes(Path(gguf).read_bytes()[:4000])
        with pytest.raises(BridgeError):
            await bridge.load(broken)
        return await bridge.load(gguf)
    info = run(qloop, scenario())
    assert info["name"] == "stories260K"
    # Load errors are signalled too; the stream's error went to its iterator only.
    assert len(sig.errors) == 2 and "no such file" in sig.errors[0]
    assert bridge.worker.alive and not bridge.busy


def test_cancel_inside_the_stream_then_next_request_works(make_bridge, qloop, gguf):
    bridge, _ = make_bridge()

    async def scenario():
        await bridge.load(gguf)
        stream = bridge.generate(completion(max_new=100000))

        async def cancel_at_first(chunk, out):
            if sum(isinstance(e, Chunk) for e in out) == 1:
                stream.cancel()
        first = await collect(stream, cancel_at_first)
        stream.cancel()  # a late Stop of a finished stream must not reach the next request
        second = await collect(bridge.generate(completion(max_new=5)))
        return first, second
    first, second = run(qloop, scenario())
    assert check_stream(first).stop_reason == "cancelled"
    assert check_stream(second).stop_reason in ("length", "eos")


def test_a_chat_reply_and_a_comparison_on_one_bridge_stop_alone(make_bridge, qloop, gguf):
    """Stop on one stream ends that request only, whether it runs or waits in the queue."""
    bridge, _ = make_bridge()
    lanes = [SamplingParams(temperature=0, max_new_tokens=40), SamplingParams(temperature=1, seed=3, max_new_tokens=40)]

    chunks = []  # the second chat reply's

    def comparison():
        return bridge.compare(CompareRequest(mode="completion", prompt="Once upon a time", lanes=lanes))

    async def scenario():
        await bridge.load(gguf)
        # 1. Stop the chat reply while it streams; the comparison queued behind it runs on.
        chat, comp = bridge.generate(completion(max_new=100000)), comparison()

        async def stop_chat(chunk, out):
            chat.cancel()
        chat_evs, comp_evs = await asyncio.gather(collect(chat, stop_chat), collect(comp))
        # 2. Stop the comparison while the chat reply before it still streams. The reply has
        # no length limit, so it surely runs when the stop lands (a 40-token reply could end
        # inside its first chunk on a fast model), streams on, and is stopped at its next chunk.
        chat2, comp2 = bridge.generate(completion(max_new=100000, temperature=0)), comparison()

        async def stop_comp(chunk, out):
            chunks.append(chunk)
            (comp2 if len(chunks) == 1 else chat2).cancel()
        chat2_evs, comp2_evs = await asyncio.gather(collect(chat2, stop_comp), collect(comp2))
        return chat_evs, comp_evs, chat2_evs, comp2_evs
    chat_evs, comp_evs, chat2_evs, comp2_evs = run(qloop, scenario(), 60)
    assert check_stream(chat_evs).stop_reason == "cancelled"
    assert sorted((d.lane, d.stop_reason, len(d.tokens)) for d in comp_evs if isinstance(d, Done)) \
        == [(0, "length", 40), (1, "length", 40)]
    assert check_stream(chat2_evs).stop_reason == "cancelled" and len(chunks) >= 2  # it streamed on
    comp2_done = [d for d in comp2_evs if isinstance(d, Done)]
    assert [d.stop_reason for d in comp2_done] == ["cancelled", "cancelled"]
    assert all(d.tokens == [] for d in comp2_done)  # stopped while queued: it never ran


def test_load_while_streaming_cancels_the_stream(make_bridge, qloop, gguf):
    bridge, sig = make_bridge()
    tasks = []

    async def load_at_first(chunk, out):
        if not tasks:
            tasks.append(asyncio.ensure_future(bridge.load(gguf)))

    async def scenario():
        await bridge.load(gguf)
        evs = await collect(bridge.generate(completion(max_new=100000)), load_at_first)
        info = await tasks[0]
        after = await collect(bridge.generate(completion(max_new=4)))
        return evs, info, after
    evs, info, after = run(qloop, scenario())
    assert check_stream(evs).stop_reason == "cancelled"
    assert info["name"] == "stories260K" and len(sig.loaded) == 2 and sig.unloaded == [True]
    check_stream(after)


def test_cancelling_the_awaiting_task_cancels_the_load(make_bridge, qloop, gguf):
    bridge, sig = make_bridge()

    async def scenario():
        task = asyncio.ensure_future(bridge.load(gguf))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while bridge.busy:  # the worker answers the cancelled load; then it is idle
            await asyncio.sleep(0.01)
        return await bridge.load(gguf)
    assert run(qloop, scenario())["name"] == "stories260K"
    assert sig.errors == []  # a cancel is not an error to show


def test_shutdown_while_generating(make_bridge, qloop, gguf):
    bridge, _ = make_bridge()
    took = []

    async def shut(chunk, out):
        if not took:
            t0 = time.monotonic()
            await bridge.shutdown()
            took.append(time.monotonic() - t0)

    async def scenario():
        await bridge.load(gguf)
        evs = await collect(bridge.generate(completion(max_new=100000)), shut)
        more = await collect(bridge.generate(completion()))
        return evs, more
    evs, more = run(qloop, scenario())
    # Shutdown joined the worker (it gives up after its own timeout, leaving it alive):
    # the cancel reached the decode loop, however slow this machine is today.
    assert took and not bridge.worker.alive
    assert isinstance(evs[-1], Done) and evs[-1].stop_reason == "cancelled"
    assert isinstance(more[-1], Error) and "shut down" in more[-1].message


def test_shutdown_while_loading(make_bridge, qloop, gguf):
    bridge, _ = make_bridge()

    async def scenario():
        task = asyncio.ensure_future(bridge.load(gguf))
        await asyncio.sleep(0)
        t0 = time.monotonic()
        await bridge.shutdown()
        took = time.monotonic() - t0
        try:
            result = await task
        except BridgeError as e:
            result = e
        return took, result
    took, result = run(qloop, scenario())
    assert took < 3 and not bridge.worker.alive
    # Either the load was cancelled, or it had finished before the shutdown arrived.
    assert (isinstance(result, BridgeError) and result.cancelled) or result["name"] == "stories260K"
    assert not bridge.busy


# --------------------------------------------------------------------------- coalescing (fake worker)

class BurstWorker:
    """A worker stand-in that emits a whole reply at once, on the calling thread."""

    def __init__(self, on_event, lanes_tokens: int = 200):
        self.on_event = on_event
        self.n = lanes_tokens
        self.next = 1
        self.alive = False

    def start(self):
        self.alive = True

    def _rid(self):
        self.next += 1
        return self.next

    def generate(self, request):
        return self.compare(CompareRequest(lanes=[request.params]))

    def compare(self, request):
        rid, lanes = self._rid(), len(request.lanes)
        self.on_event(Prompted(rid, 0, 512))
        self.on_event(Reply(rid, Prefilled(3, 0, 0.0)))
        for i in range(self.n):
            for lane in range(lanes):
                self.on_event(Reply(rid, Token(lane, i, 5, "ab", "ab", -0.1)))
        for lane in range(lanes):
            self.on_event(Reply(rid, Done(lane, "length", [5] * self.n, "ab" * self.n, [-0.1] * self.n,
                                          request.lanes[lane], Stats())))
        return rid

    def cancel(self, request_id):
        pass

    def cancel_all(self):
        pass

    def stop(self):
        self.alive = False

    def join(self, timeout=None):
        return True

    def shutdown(self, timeout=5.0):
        self.stop()


def test_a_burst_of_tokens_becomes_one_chunk_per_lane(make_bridge, qloop):
    bridge, _ = make_bridge(worker_factory=BurstWorker)

    async def scenario():
        one = await collect(bridge.generate(completion()))
        three = await collect(bridge.compare(CompareRequest(lanes=[SamplingParams()] * 3)))
        return one, three
    one, three = run(qloop, scenario())
    assert [type(e) for e in one] == [Prompted, Prefilled, Chunk, Done]
    assert len(one[2].tokens) == 200 and one[2].text == "ab" * 200
    chunks = [e for e in three if isinstance(e, Chunk)]
    assert sorted(c.lane for c in chunks) == [0, 1, 2] and all(len(c.tokens) == 200 for c in chunks)
    # Every lane's chunk comes before any Done.
    assert max(three.index(c) for c in chunks) < min(three.index(d) for d in three if isinstance(d, Done))


# --------------------------------------------------------------------------- gui.app.run

APP_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QWidget
    from core.engine.sampling import SamplingParams
    from core.worker.protocol import GenerateRequest
    from gui import app
    from gui.bridge import Chunk, Done

    def factory(bridge, argv):
        w = QWidget()

        async def go():
            await bridge.load(argv[1])
            n = 0
            req = GenerateRequest(mode="completion", prompt="Once",
                                  params=SamplingParams(max_new_tokens=100000, seed=1))
            async for ev in bridge.generate(req):
                if isinstance(ev, Chunk):
                    n += 1
                    if n == 5:
                        w.close()  # the last window closes mid-generation
                if isinstance(ev, Done):
                    print("done", ev.stop_reason, flush=True)

        async def forever():
            await asyncio.sleep(3600)  # a task still pending at exit

        QTimer.singleShot(0, lambda: (asyncio.ensure_future(go()), asyncio.ensure_future(forever())))
        QTimer.singleShot(20000, w.close)  # safety net
        return w

    print("rc", app.run(factory, sys.argv), flush=True)
""")


def test_app_run_tears_down_cleanly_mid_generation(fixtures, tmp_path):
    script = tmp_path / "app_script.py"
    script.write_text(APP_SCRIPT)
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT),
           "PYTHONASYNCIODEBUG": "0"}
    p = subprocess.run([sys.executable, "-X", "dev", str(script), str(fixtures / "stories260K.gguf")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "done cancelled" in p.stdout and "rc 0" in p.stdout, out
    for bad in ("Task was destroyed", "QThread", "Traceback", "Event loop stopped", "never awaited"):
        assert bad not in out, out


def test_garbage_after_unload_is_collected_on_the_ui_thread(make_bridge, qloop, gguf, monkeypatch):
    """A collection on the worker thread would finalise unreachable Qt objects there."""
    import gui.bridge as bridge_mod

    threads: list[threading.Thread] = []

    class RecordingGC:
        @staticmethod
        def collect():
            threads.append(threading.current_thread())
            return 0
    monkeypatch.setattr(bridge_mod, "gc", RecordingGC)
    bridge, sig = make_bridge()

    async def scenario():
        await bridge.load(gguf)
        await bridge.unload()
        while not threads:
            await asyncio.sleep(0.01)
    run(qloop, scenario())
    assert sig.unloaded == [True]
    assert threads and all(t is threading.main_thread() for t in threads)
