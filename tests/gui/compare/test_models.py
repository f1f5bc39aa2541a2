"""Comparison lanes across models, end to end with the real bridge and worker: lanes on
the loaded model, on a second local checkpoint held beside it, on a tiny random checkpoint
with another vocabulary, and on a model served by a real ``python -m core serve`` on
loopback. Every lane's text is checked against its model's engine run directly."""
from __future__ import annotations

import json
import shutil
from contextlib import nullcontext

import pytest
from PySide6.QtCore import Qt, QUrl

from core import limits
from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.lanes import text_diff, token_diff
from core.engine.settings import SamplingParams
from core.history.store import History
from core.remote.client import RemoteModel
from core.tokenizer.fingerprint import tokenizer_fingerprint
from gui.chat.conversation import ConversationModel
from gui.compare.lane_column import CONNECT_SERVER
from gui.compare.view import CompareView
from gui.dialogs.server_dialog import ServerDialog
from tests.core.checkpoints.util import write_tiny_tokenizer
from tests.gui.ui_helpers import (bridge, close, data_dir, loop, make_window, run, settings,  # noqa: F401
                                  until)
from tests.helpers import ROOT, ServeProcess, free_port, tiny_hf

pytestmark = pytest.mark.timeout(240)
PROMPT = "Once upon a time"
GREEDY = {"temperature": 0.0, "max_new_tokens": 24}
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 5, "max_new_tokens": 24}
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture
def history(tmp_path):
    h = History(tmp_path / "history.sqlite3")
    yield h
    h.close()


@pytest.fixture(scope="module")
def tiny_other_vocab(tmp_path_factory):
    """A tiny random HF checkpoint whose tokenizer is 30 characters: another vocabulary."""
    folder = tmp_path_factory.mktemp("tiny_chars")
    tiny_hf(seed=3).save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def keyed_server(fixtures):
    """One ``serve`` of the fixture model behind a key for the module's lanes on a server
    (its start, a process importing torch, is most of such a test's time)."""
    with ServeProcess(fixtures / "stories260K.gguf", key="cmp-key") as server:
        yield server


def direct(path, settings: dict) -> Done:
    """The lane's reference: its model's engine run on the completion prompt, no worker."""
    lm = load(path, device="cpu", dtype="float32")
    eng = Engine(lm.model, lm.tokenizer, max_context=lm.args.max_seq_len, stop_ids=lm.stop_ids)
    p = SamplingParams(**{"top_p": 1.0, **settings})
    return [e for e in eng.generate(lm.tokenizer.encode(PROMPT, bos=True), p) if isinstance(e, Done)][0]


def view_for(bridge, history, lanes, **kw):
    v = CompareView(bridge=bridge, history=history, prompt=PROMPT, mode="completion",
                    lanes=[{"top_p": 1.0, **s} for s in lanes], **kw)
    v.resize(1400, 800)
    return v


def test_lanes_on_a_second_checkpoint_and_on_another_vocabulary(qtbot, loop, bridge, history, fixtures,
                                                                tiny_other_vocab, tmp_path, monkeypatch):
    story = fixtures / "stories260K.gguf"
    twin = tmp_path / "twin" / "stories-copy.gguf"  # a second checkpoint on the same tokenizer
    twin.parent.mkdir()
    shutil.copy(story, twin)
    v = view_for(bridge, history, [GREEDY, SAMPLED, GREEDY], conversation=ConversationModel(history=history))
    qtbot.addWidget(v)
    v.show()

    async def scenario():
        await bridge.load(str(story), device="cpu", dtype="float32")
        assert v.model_of(0).name == "stories260K" and v.model_of(0).tokenizer  # followed the load
        await v.open_checkpoint(1, str(twin))
        await v.open_checkpoint(2, str(tiny_other_vocab))
        assert not v.columns[1].notice.isVisibleTo(v), v.columns[1].notice.text()
        v.run()
        await until(lambda: not v.running, 90, "the comparison to finish")

    run(loop, scenario(), 150)
    ARTIFACTS.mkdir(exist_ok=True)
    v.grab().save(str(ARTIFACTS / "compare_other_vocab.png"))
    models = [v.model_of(i) for i in range(3)]
    assert [m.kind for m in models] == ["loaded", "checkpoint", "checkpoint"]
    assert models[1].name == "stories-copy" and models[2].name == tiny_other_vocab.name
    # The lane header names each lane's model.
    assert [v.columns[i].model_combo.currentText() for i in range(3)] == [m.name for m in models]
    runs = [c.run for c in v.columns]
    for r, path, s in zip(runs, (story, twin, tiny_other_vocab), (GREEDY, SAMPLED, GREEDY)):
        ref = direct(path, s)
        assert (r.text, r.ids) == (ref.text, ref.tokens) and r.finished
    assert runs[0].text.startswith(", there was a little girl")
    # Same tokenizer (fingerprints match): token ids are compared.
    assert models[0].tokenizer == models[1].tokenizer
    d = token_diff(runs[0].ids, runs[1].ids)
    assert d.divergence is not None and f"Diverges at token {d.divergence + 1}" in v.columns[1].divergence.text()
    assert "by text" not in v.columns[1].divergence.text()
    check_other_vocabulary(v, models, runs, tiny_other_vocab)

    check_export_and_adopt(v, history, models, tiny_other_vocab, twin, tmp_path)

    # Reopened, each lane is on its model again.
    conv_id = v.saved_id
    v.set_lane_model(1, v.models[0])
    v.open_comparison(conv_id)
    assert [v.model_of(i).name for i in range(3)] == [m.name for m in models]
    assert v.model_of(1) is models[1]
    # As in a new window: the checkpoint is not held any more; Re-run opens it again.
    bridge.release(models[1].key)
    models[1].key = ""

    async def again():
        v.run(again=True)
        await until(lambda: not v.running, 90, "the re-run to finish")

    run(loop, again(), 120)
    assert models[1].key and [c.run.text for c in v.columns] == [r.text for r in runs]

    check_a_checkpoint_that_does_not_fit(loop, v, models[0], monkeypatch)


def check_other_vocabulary(v, models, runs, tiny_other_vocab) -> None:
    """Lane 3 ran on another vocabulary: said plainly, the diff is by text, and the
    inspector names its alternatives in its own vocabulary (single characters)."""
    lm = load(tiny_other_vocab)
    assert models[2].tokenizer == tokenizer_fingerprint(lm.tokenizer, lm.args.vocab_size) != models[0].tokenizer
    label = v.columns[2].divergence.text()
    assert "different tokenizers: divergence and diff by text only" in label
    td = text_diff(runs[0].text, [t.text for t in runs[2].tokens])
    assert f"Diverges at token {td.divergence + 1}" in label
    shown = v.columns[2].browser.toPlainText().replace("\u2503", "")
    assert shown == runs[2].text  # the lane shows its own text, marker aside
    # The inspector names lane 3's alternatives in lane 3's vocabulary (single characters).
    v.columns[2].browser.anchorClicked.emit(QUrl("tok:2:1"))
    assert v.inspector.current == (2, 1)
    names = [row[0] for row in v.inspector.shown_values()]
    assert names and all(len(n.replace("\u2423", " ").replace("·", " ")) <= 5 for n in names), names
    chars = {lm.tokenizer.token_bytes(i).decode("utf-8", "replace") for i in range(lm.tokenizer.vocab_size)}
    rec = runs[2].tokens[1]
    assert {rec.top["pieces"][r["id"]] for r in v.inspector.rows} <= chars
    assert models[2].label() in v.inspector.summary.text()


def check_export_and_adopt(v, history, models, tiny_other_vocab, twin, tmp_path) -> None:
    """Export records every lane's model (name, kind, path, tokenizer) and Markdown names
    them; a lane adopted into the chat says which model wrote it."""
    out = v.export("json", str(tmp_path / "c.json"))
    lanes = json.loads((tmp_path / "c.json").read_text())["conversation"]["meta"]["comparison"]["lanes"]
    assert [l["model"]["kind"] for l in lanes] == ["loaded", "checkpoint", "checkpoint"]
    assert [l["model"]["name"] for l in lanes] == ["stories260K", "stories-copy", tiny_other_vocab.name]
    assert lanes[1]["model"]["path"] == str(twin.resolve()) and lanes[2]["model"]["tokenizer"] == models[2].tokenizer
    md = v.export("md", str(tmp_path / "c.md"))
    text = (tmp_path / "c.md").read_text()
    assert out and md and "## Lane 2 · stories-copy" in text and f"## Lane 3 · {tiny_other_vocab.name}" in text

    # A lane adopted into the chat says which model wrote it.
    msg = history.message(v.adopt(1)["message_id"])
    assert msg.model_id == "stories-copy" and msg.meta["model"]["path"] == str(twin.resolve())


def check_a_checkpoint_that_does_not_fit(loop, v, loaded, monkeypatch) -> None:
    """A checkpoint that does not fit beside the loaded model: said in the lane, nothing changes."""
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: 1000)
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    run(loop, v.open_checkpoint(0, str(demo)), 60)
    assert "llamadesk-demo beside the loaded model needs" in v.columns[0].notice.text()
    assert v.columns[0].notice.isVisibleTo(v) and v.model_of(0) is loaded


def test_a_local_lane_and_a_lane_on_a_server(qtbot, loop, bridge, history, fixtures, tmp_path, keyed_server):
    story = fixtures / "stories260K.gguf"
    with nullcontext(keyed_server) as server:  # the module's server outlives the test
        remote = RemoteModel(server.url, api_key="cmp-key")
        remote.connect()
        remote.probe()
        v = view_for(bridge, history, [SAMPLED, SAMPLED, GREEDY])
        qtbot.addWidget(v)
        v.show()
        lane_model = v.add_server(remote)
        v.set_lane_model(1, lane_model)
        v.set_lane_model(2, lane_model)

        async def scenario():
            await bridge.load(str(story), device="cpu", dtype="float32")
            v.run()
            await until(lambda: not v.running, 90, "the comparison to finish")

        run(loop, scenario(), 150)
        ARTIFACTS.mkdir(exist_ok=True)
        v.grab().save(str(ARTIFACTS / "compare_two_models.png"))

        # A server that does not say its tokenizer nor return token ids (as most do): by text.
        plain = RemoteModel(server.url, api_key="cmp-key")
        plain.connect()
        plain.card.pop("llamadesk")
        w = view_for(bridge, history, [GREEDY, GREEDY])
        qtbot.addWidget(w)
        w.set_lane_model(1, w.add_server(plain))

        async def by_text():
            w.run()
            await until(lambda: not w.running, 90, "the comparison to finish")

        run(loop, by_text(), 120)
        assert w.model_of(1).tokenizer is None and w.columns[1].run.text == w.columns[0].run.text
        assert all(t.token_id == -1 for t in w.columns[1].run.tokens)  # no ids to compare
        assert "Same text as the baseline" in w.columns[1].divergence.text()
        assert "tokenizer not known: divergence and diff by text only" in w.columns[1].divergence.text()
    runs = [c.run for c in v.columns]
    assert all(r.finished and not r.error for r in runs), [r.error for r in runs]
    assert v.columns[1].model_combo.currentText() == f"stories260K @ 127.0.0.1:{server.port}"
    # The same model and seed, locally and on the server: the same tokens.
    ref = direct(story, SAMPLED)
    assert (runs[0].text, runs[0].ids) == (runs[1].text, runs[1].ids) == (ref.text, ref.tokens)
    assert runs[2].text == direct(story, GREEDY).text
    assert lane_model.tokenizer == v.model_of(0).tokenizer  # the server says its tokenizer
    assert "Identical to the baseline" in v.columns[1].divergence.text()
    assert "Diverges at token" in v.columns[2].divergence.text() and "by text" not in v.columns[2].divergence.text()
    # Export records the server's address and never the key.
    v.export("json", str(tmp_path / "c.json"))
    raw = (tmp_path / "c.json").read_text()
    lanes = json.loads(raw)["conversation"]["meta"]["comparison"]["lanes"]
    assert lanes[1]["model"] == {"kind": "server", "name": "stories260K", "tokenizer": lane_model.tokenizer,
                                 "server": f"http://127.0.0.1:{server.port}/v1"}
    assert "cmp-key" not in raw


def test_a_lane_on_a_server_that_is_gone_says_so_and_the_others_finish(qtbot, loop, bridge, history, fixtures):
    story = fixtures / "stories260K.gguf"
    gone = RemoteModel(f"http://127.0.0.1:{free_port()}", model="stories260K", timeout=5)
    v = view_for(bridge, history, [GREEDY, GREEDY])
    qtbot.addWidget(v)
    v.set_lane_model(1, v.add_server(gone))
    assert v.model_of(1).tokenizer is None

    async def scenario():
        await bridge.load(str(story), device="cpu", dtype="float32")
        v.run()
        await until(lambda: not v.running, 60, "the comparison to finish")

    run(loop, scenario(), 90)
    assert v.columns[0].run.stop_reason == "length" and v.columns[0].run.text.startswith(", there was")
    notice = v.columns[1].notice.text()
    assert "Could not reach the server" in notice and "press Run to try again" in notice
    assert v.columns[1].run.stop_reason == "error" and "lane 2" in v.status.text()
    assert v.bar.run_button.isEnabled()  # usable: the lane can be pointed elsewhere and run again
    v.set_lane_model(1, v.models[0])
    assert not v.columns[1].notice.text()


def test_the_compare_window_of_an_app_on_a_server(qtbot, loop, bridge, settings, data_dir, fixtures):
    """Replies come from a server: the comparison's first lane runs there too, and "Model on
    a server…" opens the app's Connect to Server dialog, whose model becomes the lane's."""
    story = fixtures / "stories260K.gguf"
    with ServeProcess(story) as server:
        remote = RemoteModel(server.url)
        remote.connect()
        remote.probe()
        w = make_window(bridge=bridge, settings=settings, data_dir=data_dir)
        try:
            w.use_remote(remote)
            v = w.open_compare()
            assert v.model_of(0).kind == "server" and v.model_of(0).remote is remote
            assert v.columns[0].model_combo.currentText() == f"stories260K @ 127.0.0.1:{server.port}"
            v.add_lane()
            assert v.model_of(1) is v.model_of(0)  # a new lane copies the last one's model
            combo = v.columns[1].model_combo
            combo.activated.emit(combo.findData(CONNECT_SERVER))
            dlg = v.findChild(ServerDialog)
            assert dlg is not None and dlg.isVisible()
            other = RemoteModel(server.url)
            other.connect()
            dlg.connected.emit(other)
            assert v.model_of(1).remote is other and v.model_of(1).tokenizer == remote.tokenizer_fingerprint
            v.close()
        finally:
            close(loop, w)


def test_saved_lane_models_are_data_never_opened_or_connected_until_run(qtbot, loop, bridge, history, fixtures):
    """An imported comparison whose lanes name odd models: it opens, nothing is loaded or
    contacted until Run, and then each odd lane says what is wrong in place."""
    records = ["garbage", {"kind": "checkpoint", "name": "zero", "path": "/dev/zero", "tokenizer": ["x"]},
               {"kind": "server", "name": "m", "server": "http://127.0.0.1:9/v1", "tokenizer": 5},
               {"kind": 5, "name": ["x"]}]
    lanes = [{"settings": {**GREEDY, "top_p": 1.0}, "text": "", "tokens": [], "model": r} for r in records]
    conv = history.save_comparison("odd", {"text": PROMPT, "mode": "completion"}, lanes)
    v = view_for(bridge, history, [GREEDY])
    qtbot.addWidget(v)
    v.open_comparison(conv.id)
    kinds = [v.model_of(i).kind for i in range(4)]
    assert kinds == ["loaded", "checkpoint", "server", "loaded"]
    assert v.model_of(2).remote is None and v.model_of(1).tokenizer is None and v.model_of(2).tokenizer is None
    assert "(not open)" in v.columns[2].model_combo.currentText()

    async def scenario():
        await bridge.load(str(fixtures / "stories260K.gguf"), device="cpu", dtype="float32")
        v.run()
        await until(lambda: not v.running, 60, "the comparison to finish")

    run(loop, scenario(), 90)
    assert v.columns[0].run.text.startswith(", there was") and v.columns[3].run.text == v.columns[0].run.text
    assert "could not open /dev/zero" in v.columns[1].notice.text()
    assert "not connected to http://127.0.0.1:9/v1" in v.columns[2].notice.text()
    assert v.columns[1].run.stop_reason == v.columns[2].run.stop_reason == "error"


def test_lanes_on_a_llamadesk_server_take_prompt_lookup_and_a_bias_by_text(qtbot, loop, bridge, history, fixtures,
                                                                           keyed_server):
    """LlamaDesk's serve runs a lane's prompt lookup and its logit bias by text (extension
    fields): the lanes run there, not refused, and give what the same lanes give locally."""
    story = fixtures / "stories260K.gguf"
    banned = {**GREEDY, "logit_bias_text": ["girl=-inf"]}
    with nullcontext(keyed_server) as server:  # the module's server outlives the test
        remote = RemoteModel(server.url, api_key="cmp-key")
        remote.connect()
        remote.probe()
        v = view_for(bridge, history, [GREEDY, {**GREEDY, "lookup": 2}, banned, banned])
        qtbot.addWidget(v)
        lane_model = v.add_server(remote)
        v.set_lane_model(1, lane_model)
        v.set_lane_model(2, lane_model)

        async def scenario():
            await bridge.load(str(story), device="cpu", dtype="float32")
            assert v.run() is not None
            await until(lambda: not v.running, 90, "the comparison to finish")

        run(loop, scenario(), 150)
    runs = [c.run for c in v.columns]
    assert all(r.finished and not r.error for r in runs), [r.error for r in runs]
    assert all(c.notice.isHidden() for c in v.columns)
    assert runs[1].ids == runs[0].ids == direct(story, GREEDY).tokens  # lookup changes speed, never tokens
    assert (runs[1].engine_stats.get("speculative") or {}).get("lookup") == 2
    assert runs[2].ids == runs[3].ids != runs[0].ids  # the server split the bias as the app does
    girl = set(load(story, device="cpu", dtype="float32").tokenizer.encode("girl", bos=False))
    assert girl & set(runs[0].ids) and not girl & set(runs[2].ids)


# Long on purpose: one scenario whose steps share one serve process and its run (split up, each
# part would start the server and run the lane again), read top to bottom as a user would go.
def test_a_lane_on_a_llamadesk_server_branches_at_a_token(qtbot, loop, bridge, history, fixtures, tmp_path,
                                                          keyed_server):
    """'Continue with X' on a lane served by LlamaDesk's serve: the new lane runs on the same
    server (its prompt ids and the kept tokens, X forced), keeps the source's tokens before
    X, reuses the server's KV cache and continues as a local engine's branch does; it is
    saved with what Run sends again. On a server that is not LlamaDesk's, branching is
    refused with a reason."""
    story = fixtures / "stories260K.gguf"
    lm = load(story, device="cpu", dtype="float32")
    prompt_ids = lm.tokenizer.encode(PROMPT, bos=True)
    at = 5
    with nullcontext(keyed_server) as server:  # the module's server outlives the test
        remote = RemoteModel(server.url, api_key="cmp-key")
        remote.connect()
        remote.probe()
        v = view_for(bridge, history, [GREEDY])
        qtbot.addWidget(v)
        v.resize(1400, 800)
        v.show()
        v.set_lane_model(0, v.add_server(remote))

        async def first():
            assert v.run() is not None
            await until(lambda: not v.running, 90, "the lane to finish")

        run(loop, first(), 120)
        base = v.columns[0].run
        assert base.finished and base.error is None and base.prompt_ids == prompt_ids
        assert v.inspect_token(0, at)
        alt = next(r["id"] for r in v.inspector.rows if not r["chosen"] and r["id"] >= 0)
        assert v.inspector.select_row(alt) and v.inspector.branch_button.isEnabled()
        qtbot.mouseClick(v.inspector.branch_button, Qt.LeftButton)
        assert v.lane_count() == 2 and v.running

        async def branch():
            await until(lambda: not v.running, 90, "the branch to finish")

        run(loop, branch(), 120)
        col = v.columns[1]
        br = col.run
        assert br.finished and br.error is None, v.status.text()
        assert v.model_of(1) is v.model_of(0)  # on the same server
        ref = [e for e in Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids).generate(
            prompt_ids + base.ids[:at], SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=24), forced=[alt])
            if isinstance(e, Done)][0]
        assert br.ids[:at] == base.ids[:at] and br.ids[at] == alt and br.ids[at:] == ref.tokens
        assert br.engine_stats["cached_tokens"] > 0  # the server's cache held the prompt and kept tokens
        assert col.branch_label.text() == f"Branched from lane 1 at token {at + 1}"
        saved = json.loads(open(v.export("json", str(tmp_path / "c.json"))).read())
        rec = saved["conversation"]["meta"]["comparison"]["lanes"][1]["branch"]
        assert rec["prompt_ids"] == prompt_ids and rec["kept_tokens"] == base.ids[:at]

        # A server that is not LlamaDesk's serve has no way to take a forced token.
        plain = RemoteModel(server.url, api_key="cmp-key")
        plain.connect()
        plain.card.pop("llamadesk")
        w = view_for(bridge, history, [GREEDY])
        qtbot.addWidget(w)
        w.set_lane_model(0, w.add_server(plain))

        async def other():
            assert w.run() is not None
            await until(lambda: not w.running, 90, "the lane to finish")

        run(loop, other(), 120)
        assert w.columns[0].run.finished and w.columns[0].run.error is None
        assert w.branch_lane(0, 2, 7) is None and w.lane_count() == 1
        assert "Cannot branch" in w.status.text() and "LlamaDesk's serve can" in w.status.text()
