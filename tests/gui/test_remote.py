"""Remote backends in the app, end to end against a real ``python -m core serve`` process
serving the stories260K fixture on loopback: the bridge, the reply controller, the main
window's chat, the Connect to Server dialog, and the failures a user meets."""
from __future__ import annotations

import math
import socket
import threading

import pytest
import torch
from starlette.responses import JSONResponse

from core.checkpoints import load as load_model
from core.engine.engine import Engine
from core.remote.client import RemoteModel
from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.serving.run import RunningServer
from core.serving.state import ServerState
from core.worker.protocol import GenerateRequest, Prompted
from core.worker.worker import Worker
from gui.bridge import Bridge, Chunk
from gui.widgets.token_inspector import _visible
from tests.gui.ui_helpers import (_KEEP, bridge, close, data_dir, load, loop, make_window, run,  # noqa: F401
                                  send, settings, snapshot, until, window)
from tests.helpers import ServeProcess, free_port, lacking

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


# --------------------------------------------------------------------------- the window

def dialogs(w, name="errorDialog"):
    return [d for d in w.dialogs if d.objectName() == name]


def greedy(w, max_tokens=20):
    w.panel.temperatureSpin.setValue(0)
    w.panel.maxTokensSpin.setValue(max_tokens)


async def connect_with_dialog(w, url, key):
    """Model → Connect to Server…, as a user fills it in."""
    dlg = w.open_server_dialog()
    dlg.url.setCurrentText(url)
    dlg.key.setText(key)
    dlg.list_button.click()
    await until(lambda: dlg.models.count() > 0 or dlg.status.property("error"), 60, "the model list")
    # The error is said inside the request; its buttons come back when it has ended, and a
    # click before then is a click on a disabled button.
    await until(lambda: not dlg.busy, 10, "the request to end")
    return dlg


def test_connect_dialog_lists_models_connects_and_keeps_the_key_out_of_chats(qtbot, window, loop, server, data_dir,
                                                                              settings, tmp_path):
    async def scenario():
        # A wrong key: the dialog says so in place and stays usable.
        dlg = await connect_with_dialog(window, server.url, "wrong-key")
        assert dlg.models.count() == 0 and "401" in dlg.status.text() and "API key" in dlg.status.text()
        dlg.key.setText(KEY)
        dlg.list_button.click()
        await until(lambda: dlg.models.count() == 1, 60, "the model list")
        assert dlg.models.item(0).text() == "stories260K" and dlg.ok.isEnabled()
        snapshot(dlg, "remote_connect_dialog")
        dlg.ok.click()
        await until(lambda: window.backend is not None, 120, "connect and probe")
        assert not dlg.isVisible() and window.backend.model == "stories260K"
        status = window.status.model_status.text()
        assert "stories260K" in status and f"127.0.0.1:{server.port}" in status
        assert window.action("use_local").isEnabled() and window.prompt.send_button.isEnabled() is False
        greedy(window)
        view = await send(qtbot, window, "Tell me a story.")
        assert view["text"] and view["stop_reason"] in ("eos", "length")
        s = view["stats"]
        assert s["generated_tokens"] > 0 and s["ttft_s"] > 0 and "TTFT" in window.status.stats_label.text()
        m = window.conversation.message(view["id"])
        assert m.model_id == "stories260K" and m.meta["server"] == server.url
        return view
    run(loop, scenario(), 200)
    # The server and its key are remembered in the settings, the key apart from the list ...
    saved = window.servers.servers()
    assert saved[0]["url"] == server.url and saved[0]["model"] == "stories260K" and "key" not in saved[0]
    assert window.servers.key(server.url) == KEY
    # ... and never in the history database or an export.
    window.ask_save_path = lambda title, name, filt: str(tmp_path / ("chat.json" if "JSON" in title else "chat.md"))
    outs = [window.export_conversation("json"), window.export_conversation("md")]
    for f in [*outs, *data_dir.glob("history.sqlite3*")]:
        assert KEY.encode() not in open(f, "rb").read(), f
    assert server.url.encode() in open(outs[0], "rb").read()  # where the reply came from is kept

    # Forget the server: gone from the settings, and replies come from the local side again.
    dlg = window.open_server_dialog()
    assert dlg.url.currentText() == server.url and dlg.key.text() == KEY and dlg.forget_button.isEnabled()
    dlg.forget_button.click()
    assert window.servers.servers() == [] and window.servers.key(server.url) == ""
    assert window.backend is None and window.info is None and not window.action("use_local").isEnabled()
    dlg.close()


def test_a_remote_chat_equals_the_local_model_and_its_tokens_can_be_inspected(qtbot, window, loop, remote, fixtures):
    """The same model served and loaded here: greedy replies agree token for token, and the
    inspector shows the server's top_logprobs equal to the local engine's probabilities."""
    async def scenario():
        await load(window, str(fixtures / "stories260K.gguf"))
        window.action("record_probs").setChecked(True)
        greedy(window)
        local = await send(qtbot, window, "Tell me a story about a dog.")
        window.use_remote(remote)
        assert window.info["server"] and window.reply.backend is remote
        window.chats.regenerate()  # the same question, now to the server
        await until(lambda: not window.busy and window.chat.widgets[-1].message.get("version") == (2, 2), 60,
                    "the remote reply")
        remote_view = window.chat.widgets[-1].message
        return local, remote_view
    local, rv = run(loop, scenario(), 150)
    # Same tokens and the same text: the server strips a reply's leading space by the
    # app's own rule (kept in the raw format this model chats in).
    assert rv["text"] == local["text"] and rv["text"]
    loc = window.conversation.message(local["id"]).meta["tokens"]
    rem = window.conversation.message(rv["id"]).meta["tokens"]
    assert rem["tokens"] == loc["tokens"]
    assert rem["logprobs"] == pytest.approx(loc["logprobs"], abs=1e-4)
    # The inspector on the remote reply: the chosen token bold at the model's probability,
    # its alternatives by name, nothing made up for "after filters".
    assert window.chat.show_tokens(rv["id"]) and window.chat.inspect_token(rv["id"], 2)
    insp = window.inspector
    rec = window.chat.widget_for(rv["id"]).token(2)
    rows = insp.rows
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["raw"] == pytest.approx(math.exp(loc["logprobs"][2]), abs=1e-4)
    # The server's top alternatives are the local engine's most likely tokens, same numbers.
    local_top = sorted((p for _, p in loc["top"][2]["raw"]), reverse=True)
    assert [r["raw"] for r in rows] == pytest.approx(local_top[:len(rows)], abs=1e-4) and len(rows) == 5
    shown = insp.shown_values()
    assert all(v[2] == "–" for v in shown) and "not reported" in insp.note.text()
    assert shown[rows.index(chosen[0])][0] == _visible(rec.piece)


def disconnected_copy(remote, url=None, key=None):
    """The same model reached at another URL or with another key (no new probe)."""
    r = RemoteModel(url or remote.url, api_key=key, model=remote.model)
    r.card, r.caps = remote.card, remote.caps
    return r


async def fail_inline(qtbot, w, text, what):
    w.prompt.set_text(text)
    w.prompt.submit()
    await until(lambda: w.reply_notice.isVisible() and not w.busy, 60, what)
    return w.reply_notice.text()


def test_a_wrong_key_is_an_inline_401_with_retry_and_nothing_is_lost(qtbot, window, loop, remote):
    async def scenario():
        window.use_remote(disconnected_copy(remote, key="not-the-key"))
        greedy(window)
        shown = await fail_inline(qtbot, window, "Hello there", "the 401 notice")
        assert "refused the API key (401)" in shown and "Check the API key" in shown
        assert dialogs(window) == [] and window.reply_notice.button.isVisible()
        path = window.conversation.path()
        assert [m.role for m in path] == ["user"] and path[0].text == "Hello there"  # no empty reply stored
        # Said once: the notice with Retry, not an empty reply bubble saying it too (issue 22 item 3).
        assert [w.message["role"] for w in window.chat.widgets] == ["user"] and "401" not in window.chat.toPlainText()
        # With the right key, Retry answers the same message.
        window.use_remote(remote)
        done = []
        window.replyFinished.connect(done.append)
        window.reply_notice.button.click()
        await until(lambda: done, 60, "the retried reply")
        assert not window.reply_notice.isVisible()
        assert [m.role for m in window.conversation.path()] == ["user", "assistant"]
        assert done[0]["text"] and not done[0].get("error")
    run(loop, scenario(), 120)


def test_refused_unresolvable_silent_and_429_servers_are_inline_notices(qtbot, window, loop, remote, fixtures):

    def limited(app):
        async def wrapped(scope, receive, send):
            if scope["type"] == "http" and scope["method"] == "POST":
                err = {"error": {"message": "Rate limit reached: 3 requests per minute", "type": "rate_limit"}}
                return await JSONResponse(err, status_code=429)(scope, receive, send)
            return await app(scope, receive, send)
        return wrapped

    async def scenario():
        window.use_remote(disconnected_copy(remote, url=f"http://127.0.0.1:{free_port()}"))
        shown = await fail_inline(qtbot, window, "Hello", "the refused notice")
        assert shown.startswith("⚠ Could not reach the server") and "Connection refused" in shown
        assert dialogs(window) == [] and window.prompt.editor.isEnabled()
        # A name that does not resolve (.invalid never does, RFC 2606).
        window.use_remote(disconnected_copy(remote, url="http://llamadesk-test.invalid:8000"))
        shown = await fail_inline(qtbot, window, "Hello", "the DNS notice")
        assert shown.startswith("⚠ Could not find the server") and "llamadesk-test.invalid" in shown
        # A server that accepts the connection and never answers: the client's timeout.
        with socket.socket() as mute:
            mute.bind(("127.0.0.1", 0))
            mute.listen(4)
            slow = disconnected_copy(remote, url=f"http://127.0.0.1:{mute.getsockname()[1]}")
            slow.timeout = 0.5
            window.use_remote(slow)
            shown = await fail_inline(qtbot, window, "Hello", "the timeout notice")
        assert "stopped answering for 0.5 s" in shown and "retry" in shown
        with RunningServer(ServerState(load_model(fixtures / "stories260K.gguf", device="cpu", dtype="float32")),
                           wrap=limited) as srv:
            window.use_remote(disconnected_copy(remote, url=srv.url))
            shown = await fail_inline(qtbot, window, "Hello again", "the 429 notice")
        assert "rate-limiting requests (429)" in shown and "Rate limit reached" in shown and "wait" in shown
        assert dialogs(window) == []
    run(loop, scenario(), 120)


def test_a_server_killed_mid_stream_keeps_the_partial_reply_marked_and_retry_works(qtbot, window, loop, remote,
                                                                                     fixtures):
    """SIGKILL the server when the third token has arrived: the notice says the connection was
    cut, the partial reply is in the store marked as cut, and once a server runs at that
    address again Retry gives a full reply beside it."""
    victim = ServeProcess(fixtures / "stories260K.gguf")
    runner = window.bridge._remote
    forward, seen = runner._on_event, []

    def kill_at_third_token(ev):
        forward(ev)
        if getattr(getattr(ev, "event", None), "token_id", None) is not None:
            seen.append(ev)
            if len(seen) == 3:
                victim.kill()  # on the streaming thread: nothing more is read before it dies
    runner._on_event = kill_at_third_token
    try:
        async def scenario():
            r = disconnected_copy(remote, url=victim.url)
            window.use_remote(r)
            window.panel.temperatureSpin.setValue(1.0)
            window.panel.maxTokensSpin.setValue(400)
            shown = await fail_inline(qtbot, window, "Tell me a long story.", "the cut notice")
            assert shown.startswith(f"⚠ The connection to {victim.url} was cut mid-reply") and "incomplete" in shown
            assert dialogs(window) == []
            cut = window.conversation.path()[-1]
            assert cut.role == "assistant" and cut.stop_reason == "error" and cut.meta["cut"] is True
            assert cut.text and cut.text == "".join(e.event.text for e in seen)[:len(cut.text)]
            assert len(seen) >= 3 and cut.meta["server"] == victim.url
            w = window.chat.widgets[-1]
            assert w.message["text"] == cut.text and "cut mid-reply" in w.footer.text()
            snapshot(window, "remote_cut_reply_retry")
            # The server comes back at the same address: Retry works, the cut reply stays a version.
            again = ServeProcess(fixtures / "stories260K.gguf", port=victim.port)
            try:
                window.panel.maxTokensSpin.setValue(12)
                done = []
                window.replyFinished.connect(done.append)
                window.reply_notice.button.click()
                await until(lambda: done, 60, "the retried reply")
            finally:
                again.stop()
            assert done[0]["version"] == (2, 2) and done[0]["text"] and not done[0].get("error")
            versions = window.history.siblings(done[0]["id"])
            assert [m.id for m in versions] == [cut.id, done[0]["id"]] and versions[0].text == cut.text
        run(loop, scenario(), 150)
    finally:
        runner._on_event = forward
        victim.stop()


def test_controls_the_server_lacks_are_disabled_saying_why_and_never_sent(qtbot, window, loop, fixtures):
    """A server that refuses seed and ignores top_k / repetition_penalty: those controls are
    off with the probe's reason, the reply records their off values (what the server did),
    and Use Local Model gives every control back."""

    panel = window.panel
    panel.topKSpin.setValue(40)
    panel.repetitionPenaltySpin.setValue(1.3)
    panel.minPSpin.setValue(0.05)
    panel.speculativeCombo.setCurrentIndex(panel.speculativeCombo.findData("lookup"))
    with RunningServer(ServerState(load_model(fixtures / "stories260K.gguf", device="cpu", dtype="float32")),
                       wrap=lacking) as srv:
        r = RemoteModel(srv.url)
        r.connect()
        r.probe()
        window.use_remote(r)
        for w, why in ((panel.seedSpin, "refused seed"), (panel.randomSeedCheck, "refused seed"),
                       (panel.topKSpin, "ignores top_k"), (panel.repetitionPenaltySpin, "ignores repetition_penalty")):
            assert not w.isEnabled() and why in w.toolTip() and "Not available with" in w.toolTip(), w.objectName()
        assert panel.minPSpin.isEnabled() and not panel.chatFormatCombo.isEnabled()
        assert not panel.speculativeCombo.isEnabled() and not panel.lookupSpin.isEnabled()
        assert "speculative decoding runs in this app" in panel.speculativeCombo.toolTip()
        assert not panel.logitBiasEdit.isEnabled() and "tokenizer" in panel.logitBiasEdit.toolTip()
        assert "own chat template" in panel.chatFormatCombo.toolTip()
        assert window.action("record_probs").isEnabled()  # this server does return top_logprobs
        assert "seed" in window.status.model_status.toolTip() and "top_k" in window.status.model_status.toolTip()

        async def scenario():
            return await send(qtbot, window, "Hello", max_tokens=6)
        view = run(loop, scenario(), 90)
    st = view["settings"]
    assert view["seed"] is None and st["seed"] is None  # no seed was sent, none is claimed
    assert st["top_k"] == 0 and st["repetition_penalty"] == 1.0 and st["min_p"] == pytest.approx(0.05)
    assert st.get("lookup", 0) == 0  # nothing local-only is recorded as if it had been used
    assert panel.topKSpin.value() == 40  # the user's choice is kept for the local model
    # A server without top_logprobs: no token records can be asked for.
    r.caps.top_logprobs = False
    r.caps.why["top_logprobs"] = "the server returns no top_logprobs alternatives"
    window.use_remote(r)
    assert not window.action("record_probs").isEnabled() and "no top_logprobs" in window.action("record_probs").toolTip()
    window.use_local()
    assert all(w.isEnabled() for w in (panel.randomSeedCheck, panel.topKSpin, panel.repetitionPenaltySpin,
                                       panel.chatFormatCombo, panel.speculativeCombo, panel.lookupSpin))
    # the seed box follows "Random seed for each reply", as it does without a server
    assert panel.seedSpin.isEnabled() == (not panel.randomSeedCheck.isChecked())
    panel.randomSeedCheck.setChecked(not panel.randomSeedCheck.isChecked())
    assert panel.seedSpin.isEnabled() == (not panel.randomSeedCheck.isChecked())
    assert panel.params().lookup > 0
    assert panel.params().top_k == 40 and window.action("record_probs").isEnabled() and window.backend is None


def test_stop_and_edit_resend_on_a_server(qtbot, window, loop, remote):
    async def scenario():
        window.use_remote(remote)
        window.panel.temperatureSpin.setValue(1.0)
        window.panel.maxTokensSpin.setValue(400)
        done = []
        window.replyFinished.connect(done.append)
        for attempt in range(3):  # the story may end (eos) before the stop lands on a busy machine
            done.clear()
            window.new_chat()
            window.prompt.set_text("Tell me a long story.")
            window.prompt.submit()
            await until(lambda: (window.reply.state is not None and window.reply.state.text) or done, 60,
                        "first streamed text")
            window.stop()
            await until(lambda: done, 30, "the stopped reply")
            if done[0]["stop_reason"] == "cancelled":
                break
        assert done[0]["stop_reason"] == "cancelled" and not window.busy
        stored = window.conversation.message(done[0]["id"])
        assert stored.text == done[0]["text"] and stored.text and stored.meta["server"] == remote.url
        # Edit the question and resend: a new branch answered by the server, the old one kept.
        user_id = window.chat.widgets[0].msg_id
        window.chat.widgets[0].buttons["edit"].click()
        window.prompt.set_text("Tell me about a cat.")
        window.panel.maxTokensSpin.setValue(8)
        done.clear()
        window.prompt.submit()
        await until(lambda: done, 60, "the reply to the edit")
        assert window.chat.widgets[0].message["version"] == (2, 2) and done[0]["text"]
        assert len(window.history.siblings(user_id)) == 2
        assert window.status.model_status.text().startswith(f"stories260K on {remote.url}")
        snapshot(window, "remote_chat")
        return True
    assert run(loop, scenario(), 120)


def test_the_dialog_says_what_is_wrong_with_an_address_in_place(qtbot, window, loop):
    async def scenario():
        dlg = window.open_server_dialog()
        for url, said in (("127.0.0.1:8000", "starts with http://"), ("http://[::1", "not a valid server URL"),
                          (f"http://127.0.0.1:{free_port()}", "Could not reach the server")):
            dlg.url.setCurrentText(url)
            dlg.list_button.click()
            await until(lambda: dlg.status.property("error") and not dlg.busy, 30, "the error")
            assert said in dlg.status.text() and dlg.models.count() == 0 and dlg.list_button.isEnabled()
            assert dialogs(window) == [] and not dlg.ok.isEnabled()
            dlg.status.setProperty("error", False)
        assert window.servers.servers() == []  # nothing is saved until a model is used
        dlg.close()
        return True
    assert run(loop, scenario(), 60)


def test_a_reply_from_a_llamadesk_server_branches_and_bans_there(qtbot, window, loop, remote, fixtures):
    """Continue with X and Ban on a reply that came from LlamaDesk's serve: the new versions
    run on the server (its own prompt ids and the kept tokens as a token-id prompt, X forced;
    or X banned), keep the tokens before X and continue as the local engine's branch does;
    the server's KV cache holds the prefix."""
    lm = load_model(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    i = 3

    async def scenario():
        await load(window, str(fixtures / "stories260K.gguf"))
        window.action("record_probs").setChecked(True)
        greedy(window)
        window.use_remote(remote)
        first = await send(qtbot, window, "Tell me a story about a cat.")
        rec = window.conversation.message(first["id"]).meta["tokens"]
        ids = rec["tokens"]
        alt = next(k for k, _ in rec["top"][i]["raw"] if k != ids[i])
        done = []
        window.replyFinished.connect(done.append)
        assert window.reply.branch(first["id"], i, alt)
        await until(lambda: done and not window.busy, 60, "the branch on the server")
        branched = done.pop()
        assert window.reply.branch(branched["id"], i, alt, ban=True)
        await until(lambda: done and not window.busy, 60, "the ban on the server")
        return first, rec, alt, branched, done.pop()

    first, rec, alt, branched, banned = run(loop, scenario(), 150)
    ids, prompt_ids = rec["tokens"], rec["prompt_ids"]
    assert prompt_ids[0] == lm.tokenizer.bos_id and len(prompt_ids) > 5  # the server's own tokens
    eng = Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=24)  # send() sets 24
    ref = [e for e in eng.generate(prompt_ids + ids[:i], params, forced=[alt]) if isinstance(e, Done)][0]
    new = window.conversation.message(branched["id"])
    toks = new.meta["tokens"]["tokens"]
    assert branched["version"] == (2, 2) and not branched.get("error")
    assert toks[:i] == ids[:i] and toks[i] == alt and toks[i:] == ref.tokens
    assert new.meta.get("server") and new.stats["cached_tokens"] > 0
    assert new.meta["tokens"]["prompt_ids"] == prompt_ids  # a branch of the branch sends the same
    third = window.conversation.message(banned["id"])
    t3 = third.meta["tokens"]["tokens"]
    assert banned["version"] == (3, 3) and t3[:i] == ids[:i] and alt not in t3[i:]
    biased = lm.model(torch.tensor([prompt_ids + ids[:i]]))[0, -1].detach().clone()
    biased[alt] = float("-inf")
    assert t3[i] == int(biased.argmax())
