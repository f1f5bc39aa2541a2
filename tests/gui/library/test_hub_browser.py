"""The Hub tab against a local Hub (tests/hubserver.py) through the real huggingface_hub client:
search with filters, a repository's files grouped by quantization with the memory each needs,
what fits marked and one recommended, a 401 explained and then passed with a token."""
from __future__ import annotations

import socket
import time
import types

import gguf
import pytest
from PySide6.QtCore import Qt

import core.library.hub
from core.library.library import human_size
from gui.library.hub_models import UNNAMED
from gui.library.service import LibraryService
from gui.library.window import LibraryWindow
from tests.gui.ui_helpers import loop, run, settings, snapshot, until  # noqa: F401
from tests.hubserver import GATED_REPO, GGUF_REPO, HF_REPO


@pytest.fixture
def lw(qtbot, loop, settings, tmp_path, hub_server, monkeypatch):
    """A library window on its own service, pointed at the local Hub."""
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "data"))
    service = LibraryService(settings=settings, data_dir=tmp_path / "data")
    service.set_endpoint(hub_server.url)
    w = LibraryWindow(service)
    qtbot.addWidget(w)
    w.show()
    w.show_tab("hub")
    yield w
    service.shutdown()


def result_rows(hub) -> list[dict]:
    m = hub.results_model
    return [{m.headerData(c, Qt.Horizontal): m.index(r, c).data() for c in range(m.columnCount())}
            for r in range(m.rowCount())]


def file_rows(hub) -> dict[str, dict]:
    """{file path: {group, size, memory, fits}} as the repository page shows them."""
    m = hub.files_model
    out = {}
    for i, f in m.file_rows():
        group = i.parent().data()
        cells = [i.siblingAtColumn(c).data() for c in range(4)]
        out[f.path] = {"group": group, "size": cells[1], "memory": cells[2], "fits": cells[3], "file": f}
    return out


def choose(box, text):
    box.setCurrentIndex(box.findText(text))


def test_search_with_filters_shows_license_and_access(lw, hub_server, qtbot, loop):
    hub = lw.hub

    async def scenario():
        qtbot.keyClicks(hub.query, "llamadesk-test")
        choose(hub.format_box, "GGUF")
        choose(hub.sort_box, "Most downloaded")
        await hub.search()
        rows = result_rows(hub)
        # GGUF repositories only, most downloaded first (the server's numbers)
        assert [r["Repository"] for r in rows] == [GGUF_REPO, GATED_REPO]
        assert rows[0]["Downloads"] == "1,500" and rows[0]["License"] == "mit" and rows[0]["Access"] == "Public"
        assert rows[1]["Access"].startswith("Gated") and rows[1]["License"] == "llama3.2"
        choose(hub.sort_box, "Most liked")
        await hub.search()
        assert [r["Repository"] for r in result_rows(hub)] == [GATED_REPO, GGUF_REPO]  # 99 likes vs 12
        choose(hub.sort_box, "Recently updated")
        await hub.search()
        assert [r["Repository"] for r in result_rows(hub)] == [GATED_REPO, GGUF_REPO]  # 2025-03 vs 2024-06
        choose(hub.format_box, "safetensors")
        await hub.search()
        assert [r["Repository"] for r in result_rows(hub)] == [HF_REPO]
        assert result_rows(hub)[0]["Formats"] == "safetensors"
        hub.query.setText("no-such-model")
        await hub.search()
        assert result_rows(hub) == [] and hub.notice.isVisible() and "no-such-model" in hub.notice.text()
        hub.query.setText("llamadesk")
        choose(hub.format_box, "GGUF or safetensors")
        await hub.search()
        assert not hub.notice.isVisible() and len(result_rows(hub)) == 3

    run(loop, scenario())
    snapshot(lw, "hub_search")


def test_no_network_is_said_in_words(lw, hub_server, loop, monkeypatch):
    waits = []
    # huggingface_hub retries a dropped connection 5 times over ~23 s: the same tries, without the waits
    monkeypatch.setattr("huggingface_hub.utils._http.time", types.SimpleNamespace(sleep=waits.append))
    hub = lw.hub

    async def scenario():
        hub.query.setText("llamadesk")
        await hub.search()  # rows from an earlier search: a failed one must not leave them shown
        assert hub.results_model.rowCount() == 2
        hub_server.offline = True
        task = hub.search()
        assert hub.search_button.text() == "Searching…" and not hub.search_button.isEnabled()
        await task
        assert waits, "the client did not retry"
        assert hub.notice.isVisible() and "Cannot reach the Hugging Face Hub" in hub.notice.text()
        assert hub.results_model.rowCount() == 0 and hub.search_button.text() == "Search"
        hub_server.offline = False
        await hub.search()
        assert not hub.notice.isVisible() and hub.results_model.rowCount() == 2

    run(loop, scenario())


def test_offline_is_said_in_seconds_with_retry(lw, hub_server, qtbot, loop):
    """No network (here: nothing listens at the Hub's address) is said within 3 s, not after
    huggingface_hub's ~24 s of retries, with a Retry button that runs the search again."""
    hub = lw.hub
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    lw.service.set_endpoint(dead)

    async def scenario():
        hub.query.setText("llamadesk")
        t = time.monotonic()
        await hub.search()
        assert time.monotonic() - t < 3
        assert hub.notice.isVisible() and "Cannot reach the Hub" in hub.notice.text()
        assert "refused" in hub.notice.text() and "Retry" in hub.notice.text()
        assert hub.retry_button.isVisible() and hub.results_model.rowCount() == 0
        snapshot(lw, "hub_offline")
        lw.service.set_endpoint(hub_server.url)  # the network is back
        qtbot.mouseClick(hub.retry_button, Qt.LeftButton)
        await until(lambda: not hub.busy and hub.results_model.rowCount() == 2, 10, "the search run again")
        assert not hub.notice.isVisible() and not hub.retry_button.isVisible()

    run(loop, scenario())


def test_repository_page_groups_files_and_marks_what_fits(lw, hub_server, hub_tree, qtbot, loop, monkeypatch):
    hub = lw.hub
    repo = next(r for r in hub_tree if r.repo_id == GGUF_REPO)

    async def scenario():
        hub.query.setText("stories")
        await hub.search()
        hub.results.selectRow(0)
        await hub.open_repo(hub.results_model.repos[0])
        await until(lambda: not hub.busy, 30, "the estimates")
        rows = file_rows(hub)
        assert set(rows) == {"stories260K.gguf", "tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf"}  # README.md is not loadable
        # grouped by the quantization each file's name states (stories260K.gguf names none)
        assert {p: r["group"] for p, r in rows.items()} == {"stories260K.gguf": UNNAMED, "tiny-Q8_0.gguf": "Q8_0",
                                                            "tiny-Q4_K_M.gguf": "Q4_K_M"}
        for p, r in rows.items():
            assert r["size"] == human_size(repo.files[p].size)
        # The KV cache part of the estimate, from the file's own header (read here with gguf):
        # 2 (K and V) x layers x context x KV heads x head size x bytes per value.
        est = hub.files_model.fits["stories260K.gguf"]
        rd = gguf.GGUFReader(str(repo.files["stories260K.gguf"].source))
        field = lambda k: int(rd.fields[k].parts[-1][0])  # noqa: E731
        ctx = min(hub.context_spin.value(), field("llama.context_length"))
        head = field("llama.embedding_length") // field("llama.attention.head_count")
        itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[est.dtype]
        assert est.kv_bytes == 2 * field("llama.block_count") * ctx * field("llama.attention.head_count_kv") * head * itemsize
        assert rows["stories260K.gguf"]["memory"] == human_size(est.weights_bytes + est.kv_bytes)
        assert all(r["fits"].endswith("fits") for r in rows.values())  # tiny models, any machine
        totals = {p: hub.files_model.fits[p].total_bytes for p in rows}
        monkeypatch.setattr(core.library.hub, "free_memory", lambda: (1, None))
        await hub.refit()
        assert hub.files_model.recommended is None and "none fits" in hub.files_status.text()
        assert all("too large" in r["fits"] for r in file_rows(hub).values())
        # A machine with only enough free memory for the smallest estimate: the others are
        # marked too large and the pick is the one that fits.
        small = min(totals, key=totals.get)
        ram = totals[small] + 1
        assert sorted(totals.values())[1] > ram
        monkeypatch.setattr(core.library.hub, "free_memory", lambda: (ram, None))
        await hub.refit()
        rows = file_rows(hub)
        for p, r in rows.items():
            assert ("✓ fits" in r["fits"]) == (p == small), (p, r["fits"])
        assert hub.files_model.recommended == small and rows[small]["fits"].startswith("★ Recommended")
        assert [f.path for f in hub.selected_files()] == [small]
        assert human_size(ram) in hub.machine_label.text()

    run(loop, scenario())
    snapshot(lw, "hub_repository")


def test_gated_repository_asks_for_a_token_then_works(lw, hub_server, qtbot, loop):
    hub = lw.hub

    async def scenario():
        await hub.open_repo(GATED_REPO)
        await until(lambda: not hub.busy, 30, "the first try")
        assert hub.auth.isVisible() and "token" in hub.auth_label.text() and "license" in hub.auth_label.text()
        assert not hub.files_model.fits
        # A token the Hub refuses: said so, in other words (the token panel stays).
        qtbot.keyClicks(hub.token_edit, "hf_wrong")
        hub.use_token()
        await until(lambda: not hub.busy and hub.auth.isVisible(), 30, "the refusal")
        assert "refused this token" in hub.auth_label.text()
        qtbot.keyClicks(hub.token_edit, hub_server.token)
        qtbot.mouseClick(hub.token_button, Qt.LeftButton)
        await until(lambda: not hub.busy and hub.files_model.fits, 30, "the estimates with the token")
        assert not hub.auth.isVisible()
        assert hub.files_model.recommended == "stories260K-gated.gguf"
        assert lw.service.token == hub_server.token
        # downloads use it too: the gated file comes down and is verified
        finished = []
        lw.downloads.finished.connect(finished.append)
        qtbot.mouseClick(hub.download_button, Qt.LeftButton)
        assert lw.tabs.currentWidget() is lw.downloads
        await until(lambda: finished or lw.downloads.notice.isVisible(), 30, "the gated download")
        assert finished and finished[0].endswith("stories260K-gated.gguf"), lw.downloads.notice.text()
        lw.show_tab("hub")

    run(loop, scenario())
    snapshot(lw, "hub_gated_with_token")


def test_missing_repository_is_said_in_words(lw, hub_server, loop):
    hub = lw.hub

    async def scenario():
        await hub.open_repo("llamadesk-test/no-such-repo")
        assert hub.notice.isVisible() and "Not on the Hub" in hub.notice.text()
        assert not hub.auth.isVisible() and hub.files_model.file_rows() == []

    run(loop, scenario())


def test_hub_address_is_a_setting(lw, hub_server, settings, loop, tmp_path):
    hub = lw.hub

    async def scenario():
        hub.settings_menu.aboutToShow.emit()  # what opening the menu does
        assert any(hub_server.url in a.text() for a in hub.settings_menu.actions())
        hub.ask_text = lambda *a: "huggingface dot co"
        hub.change_endpoint()
        assert hub.notice.isVisible() and "not a web address" in hub.notice.text()
        assert lw.service.endpoint() == hub_server.url  # unchanged
        hub.ask_text = lambda *a: hub_server.url + "/"
        hub.change_endpoint()
        await until(lambda: not hub.busy and hub.results_model.rowCount(), 20, "a search on the new address")
        assert not hub.notice.isVisible()
        # kept in the settings: the next start uses it
        again = LibraryService(settings=settings, data_dir=tmp_path / "data")
        assert again.endpoint() == hub_server.url and again.hub().endpoint == hub_server.url
        again.shutdown()

    run(loop, scenario())
