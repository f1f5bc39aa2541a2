"""The comparison runner without a window: planning (one request per model, one per
branch), refusals (what a server cannot do, missing drafts), the retry of a request whose
draft models failed, and the lanes' results, on a scripted bridge and a plain asyncio loop."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from core.engine.events import Done, Prefilled, Stats, Token
from core.engine.lanes import MAX_LANES
from core.engine.settings import SamplingParams
from core.worker.protocol import CompareRequest, Error, Prompted
from gui.bridge import BridgeError, Chunk
from gui.widgets.token_run import LaneRun
from gui.compare.models import LaneModel, ModelShelf
from gui.compare.runner import seed_changes
from gui.compare.runner import (BIAS_ON_SERVER, DRAFT_HINT, RETRY_HINT, SPECULATIVE_ON_SERVER, ComparisonRunner,
                                LaneJob, base_request, branch_refusal, branch_spec, missing_drafts, plan, refusals,
                                retry_order, running_line)

LOADED = LaneModel("loaded", "story")


def server(llamadesk: bool, url: str = "http://127.0.0.1:8000/v1") -> LaneModel:
    remote = SimpleNamespace(url=url, model="m", is_llamadesk=llamadesk, tokenizer_fingerprint=None)
    return LaneModel("server", "m", remote=remote)


def job(number: int, model: LaneModel = LOADED, branch: dict | None = None, **settings) -> LaneJob:
    return LaneJob(number, model, SamplingParams(**settings), branch)


def finished_run(ids: list[int]) -> LaneRun:
    run = LaneRun()
    run.add([Token(0, i, t, f"w{t}", f"w{t}", -0.1, None) for i, t in enumerate(ids)])
    run.stop_reason = "length"
    return run


# --------------------------------------------------------------------------- planning

def test_lanes_on_one_model_run_as_one_request_and_a_branch_as_its_own():
    other = LaneModel("checkpoint", "twin", key="/m/twin.gguf")
    srv = server(True)
    source = finished_run([5, 6, 7])
    branch = branch_spec(None, 1, source, 2, 9, LOADED)
    jobs = [job(1), job(2, other), job(3), job(4, srv), job(5, branch=branch), job(6, srv)]
    groups = plan(jobs)
    assert [(g.model, g.lanes) for g in groups] == [(LOADED, [0, 2]), (other, [1]), (srv, [3, 5]), (LOADED, [4])]
    assert groups[0].extra == {} and groups[3].extra == {"reply_prefix": [5, 6], "forced": [9], "prompt_ids": [],
                                                         "stop_ids": []}
    assert jobs[4].run.ids == [5, 6] and not jobs[4].run.finished  # a branch goes on from its kept tokens
    assert running_line(jobs) == "Running 6 lanes on 4 models…" and running_line(jobs[:1]) == "Running 1 lanes…"
    base = base_request({"text": "Hi", "mode": "chat", "chat_format": "auto", "messages": [{"role": "user",
                                                                                           "content": "Hi"}]}, 5)
    assert (base.prompt, base.mode, base.inspect, base.lanes) == ("Hi", "chat", 5, [])


def test_a_branch_on_a_server_sends_the_servers_own_prompt_ids_back():
    source = finished_run([5, 6, 7])
    source.prompt_ids, source.stop_token = [1, 2, 3], 13
    spec = branch_spec("col", 2, source, 1, 8, server(True))
    assert (spec["src"], spec["from"], spec["at"], spec["token_id"]) == ("col", 2, 1, 8)
    assert spec["kept"].ids == [5] and spec["prompt_ids"] == [1, 2, 3] and spec["stop_ids"] == [13]
    assert "prompt_ids" not in branch_spec("col", 2, source, 1, 8, LOADED)


def test_what_another_server_cannot_run_is_refused_before_anything_runs():
    other, ours = server(False), server(True)
    jobs = [job(1, other, logit_bias_text=("girl=-inf",)), job(2, other, lookup=3), job(3, ours, lookup=3,
            logit_bias_text=("girl=-inf",)), job(4, LOADED, lookup=3), job(5, other)]
    notices, status = refusals(jobs)
    assert notices == {0: BIAS_ON_SERVER, 1: SPECULATIVE_ON_SERVER}
    assert status == "Settings: lane 1 sets a logit bias on a server · lane 2 drafts (speculative) on a server"
    assert refusals(jobs[2:]) == ({}, "")
    # a bias that is refused is said once, not as a draft too
    assert refusals([job(7, other, lookup=2, logit_bias_text=("a=1",))])[0] == {0: BIAS_ON_SERVER}


def test_a_branch_is_refused_with_the_reason():
    run = finished_run([5, 6, 7])
    assert branch_refusal(run, 1, 9, 2, LOADED) == ""
    assert "no finished token" in branch_refusal(None, 0, 9, 2, LOADED)
    assert "no finished token" in branch_refusal(run, 3, 9, 2, LOADED)
    assert "no finished token" in branch_refusal(run, 1, -1, 2, LOADED)  # a server's stand-in id
    assert "at most" in branch_refusal(run, 1, 9, MAX_LANES, LOADED)
    assert "cannot continue a reply" in branch_refusal(run, 1, 9, 2, server(False))
    assert "did not report this lane's prompt" in branch_refusal(run, 1, 9, 2, server(True))
    run.prompt_ids = [1, 2]
    assert branch_refusal(run, 1, 9, 2, server(True)) == ""


def test_missing_draft_models_and_the_retry_order(tmp_path):
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"")
    lanes = [SamplingParams(draft=str(draft)), SamplingParams(), SamplingParams(draft=str(tmp_path / "gone.gguf")),
             SamplingParams(draft=str(draft))]
    assert missing_drafts(LOADED, lanes) == [2]
    assert missing_drafts(server(True), lanes) == []  # a server's drafts are its business
    assert retry_order(lanes) == ["", str(draft), str(tmp_path / "gone.gguf")]  # lanes without one first


# --------------------------------------------------------------------------- running

class Stream:
    """A bridge stream playing a list of events (``pending`` 0: each is its own frame)."""

    pending = 0

    def __init__(self, events):
        self.events = list(events)
        self.cancelled = False

    def __aiter__(self):
        return self._play()

    async def _play(self):
        for ev in self.events:
            if self.cancelled:
                yield Error(1, "cancelled", cancelled=True)
                return
            yield ev
            await asyncio.sleep(0)

    def cancel(self):
        self.cancelled = True


class Bridge:
    """compare() answers each request by ``script(request)`` (a list of events); hold()
    answers from ``held`` (an exception to raise, or the info)."""

    def __init__(self, script, held=None):
        self.script = script
        self.held = held
        self.requests: list[CompareRequest] = []
        self.backends: list = []
        self.streams: list[Stream] = []

    def compare(self, request, backend=None):
        self.requests.append(request)
        self.backends.append(backend)
        self.streams.append(Stream(self.script(request)))
        return self.streams[-1]

    async def hold(self, path):
        if isinstance(self.held, Exception):
            raise self.held
        return self.held


def words(request, text=" a b"):
    """Every lane streams ``text`` word by word, then Done with the lane's settings."""
    out = [Prompted(1, 2, 256), Prefilled(4, 0, 0.0)]
    for lane, p in enumerate(request.lanes):
        toks = [Token(lane, i, 10 + i, f" {w}", f" {w}", -0.5, None) for i, w in enumerate(text.split())]
        out.append(Chunk(lane, text, toks))
        out.append(Done(lane, "length", [t.token_id for t in toks], text, [-0.5] * len(toks), p,
                        Stats(generated_tokens=len(toks))))
    return out


def play(runner: ComparisonRunner, jobs: list[LaneJob]) -> list[str]:
    base = CompareRequest(prompt="Once", mode="completion")
    return asyncio.run(runner.run(base, jobs))


def recorder(runner: ComparisonRunner) -> dict:
    seen = {"failed": [], "progress": [], "frames": 0}
    runner.laneFailed.connect(lambda j, notice: seen["failed"].append((j.number, notice)))
    runner.progress.connect(seen["progress"].append)

    def frame():
        seen["frames"] += 1
    runner.frame.connect(frame)
    return seen


def test_a_run_fills_each_lanes_results_one_request_per_model():
    twin = LaneModel("checkpoint", "twin", key="/m/twin.gguf")
    shelf = ModelShelf([LOADED, twin])
    bridge = Bridge(words)
    runner = ComparisonRunner(bridge, shelf)
    seen = recorder(runner)
    jobs = [job(1, temperature=0.0), job(2, twin, seed=3), job(3, seed=4)]
    assert play(runner, jobs) == []
    assert [len(r.lanes) for r in bridge.requests] == [2, 1] and bridge.requests[1].model == "/m/twin.gguf"
    assert [r.lanes[1].seed for r in bridge.requests[:1]] == [4]
    assert all(j.run.finished and j.run.text == " a b" and j.run.ids == [10, 11] for j in jobs)
    assert seen["failed"] == [] and seen["frames"] >= len(words(bridge.requests[0]))
    assert seen["progress"][0] == "Prompt: 4 tokens on story (2 oldest messages left out to fit) · generating…"
    assert shelf.names_for(LOADED) == {10: " a", 11: " b"}  # pieces learned for the inspector
    assert runner.streams == []


def test_a_request_whose_draft_model_fails_is_run_again_split_and_only_its_lanes_fail(tmp_path):
    good, bad = tmp_path / "good.gguf", tmp_path / "bad.gguf"
    good.write_bytes(b"")
    bad.write_bytes(b"")

    def script(request):  # a draft model that cannot load fails the whole request at once
        if any(p.draft == str(bad) for p in request.lanes):
            return [Error(1, "bad is not a model")]
        return words(request)

    bridge = Bridge(script)
    runner = ComparisonRunner(bridge, ModelShelf([LOADED]))
    seen = recorder(runner)
    jobs = [job(1, draft=str(bad)), job(2), job(3, draft=str(good)), job(4, draft=str(bad))]
    failed = play(runner, jobs)
    # together, then lanes without a draft model, then by draft model as the lanes name them
    assert [[p.draft for p in r.lanes] for r in bridge.requests] == [
        [str(bad), "", str(good), str(bad)], [""], [str(bad), str(bad)], [str(good)]]
    assert failed == ["lanes 1, 4 (story): bad is not a model"]
    assert seen["failed"] == [(1, "bad is not a model" + DRAFT_HINT), (4, "bad is not a model" + DRAFT_HINT)]
    assert [j.run.stop_reason for j in jobs] == ["error", "length", "length", "error"]


def test_a_request_that_fails_after_streaming_is_not_run_again():
    def script(request):
        return [*words(request)[:3], Error(1, "lost", kind="")]

    bridge = Bridge(script)
    runner = ComparisonRunner(bridge, ModelShelf([LOADED]))
    seen = recorder(runner)
    jobs = [job(1), job(2, draft="")]
    assert play(runner, jobs) == ["lanes 1, 2 (story): lost"]
    assert len(bridge.requests) == 1 and seen["failed"] == [(1, "lost" + RETRY_HINT), (2, "lost" + RETRY_HINT)]
    assert jobs[0].run.text == " a b" and jobs[0].run.error == "lost"  # what streamed stays


def test_a_missing_draft_fails_its_lane_and_the_others_run(tmp_path):
    bridge = Bridge(words)
    runner = ComparisonRunner(bridge, ModelShelf([LOADED]))
    seen = recorder(runner)
    gone = str(tmp_path / "gone.gguf")
    jobs = [job(1), job(2, draft=gone)]
    assert play(runner, jobs) == [f"lane 2 (story): draft model not found: {gone}"]
    assert [len(r.lanes) for r in bridge.requests] == [1]
    assert seen["failed"][0][0] == 2 and "turn speculative decoding off" in seen["failed"][0][1]
    assert jobs[0].run.finished and jobs[1].run.stop_reason == "error"
    # when every lane's draft is missing nothing is sent
    bridge.requests.clear()
    assert len(play(runner, [job(3, draft=gone)])) == 1 and bridge.requests == []


def test_a_server_not_connected_fails_its_lanes_and_a_saved_checkpoint_opens_again():
    saved_server = LaneModel("server", "m", path="http://127.0.0.1:9/v1")
    saved_ckpt = LaneModel("checkpoint", "twin", path="/m/twin.gguf")
    shelf = ModelShelf([LOADED, saved_ckpt])
    bridge = Bridge(words, held={"key": "/m/twin.gguf", "name": "twin", "tokenizer": "t1"})
    runner = ComparisonRunner(bridge, shelf)
    seen = recorder(runner)
    jobs = [job(1, saved_server), job(2, saved_ckpt)]
    failed = play(runner, jobs)
    assert failed == ["lane 1 (m): not connected to http://127.0.0.1:9/v1: choose the lane's model again"]
    assert seen["failed"][0][1].endswith(RETRY_HINT)
    assert saved_ckpt.key == "/m/twin.gguf" and saved_ckpt.tokenizer == "t1"
    assert bridge.requests[0].model == "/m/twin.gguf" and jobs[1].run.finished

    broken = LaneModel("checkpoint", "zero", path="/dev/zero")
    runner.bridge = Bridge(words, held=BridgeError("not a model"))
    assert play(runner, [job(3, broken)]) == ["lane 3 (zero): could not open /dev/zero: not a model"]


def test_a_server_lane_streams_from_its_server_and_stop_cancels_every_request():
    srv = server(True)

    def slow(request):
        return words(request, " a b c d e f g h")

    bridge = Bridge(slow)
    runner = ComparisonRunner(bridge, ModelShelf([LOADED, srv]))
    jobs = [job(1), job(2, srv)]

    async def go():
        task = asyncio.ensure_future(runner.run(CompareRequest(prompt="Once", mode="completion"), jobs))
        while len(runner.streams) < 2:
            await asyncio.sleep(0)
        runner.stop()
        return await task

    assert asyncio.run(go()) == []  # a cancelled request is not a failure
    assert bridge.backends == [None, srv.remote]
    assert runner.stop_asked and all(s.cancelled for s in bridge.streams)


def test_seed_changes_before_a_run(monkeypatch):
    """Re-run takes the shown results' exact settings (only when every lane has some); new
    seeds are one shared draw under the seed lock, one per lane without it."""
    draws = iter(range(100, 200))
    monkeypatch.setattr("gui.compare.runner.random.randrange", lambda n: next(draws))
    shown = [SimpleNamespace(params={"seed": 7, "temperature": 0.5}),
             SimpleNamespace(params={"seed": 9, "temperature": 1.0})]
    assert seed_changes(shown, again=True, new_seeds=False, locked=False) == [p.params for p in shown]
    assert seed_changes([shown[0], None], again=True, new_seeds=False, locked=False) == [{}, {}]
    assert seed_changes(shown, again=False, new_seeds=True, locked=True) == [{"seed": 100}, {"seed": 100}]
    assert seed_changes(shown, again=True, new_seeds=True, locked=False) == [
        {"seed": 102, "temperature": 0.5}, {"seed": 103, "temperature": 1.0}]
