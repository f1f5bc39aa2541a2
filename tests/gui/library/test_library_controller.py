"""The Library tab's controller without a window: its table follows the service's scans, the
status line's words, Open (only a readable model, its use recorded), Delete's question and
outcome, the folder to show, and the folders it hands to the service."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.checkpoints import pack_cache
from core.library.library import LibraryEntry, LibraryState
from gui.library.library_controller import LibraryController
from gui.library.service import LibraryService
from tests.gui.ui_helpers import data_dir, loop, run, settings, until  # noqa: F401


def entry(path: Path, error: str | None = None) -> LibraryEntry:
    return LibraryEntry(path=path, name=path.stem, family="llama", params=None if error else 260_000,
                        format="gguf", quant="F32", context_length=None if error else 512, size_bytes=1_200,
                        last_used=None, error=error)


@pytest.fixture
def service(loop, settings, data_dir, tmp_path):
    """A service whose scan lists the .gguf files of its folders (good unless named 'broken')."""
    scans = []

    def scan(folders, cancel=None, state=None):
        scans.append(list(folders))
        return [entry(p, "not a GGUF file" if p.stem == "broken" else None)
                for f in folders for p in sorted(Path(f).glob("*.gguf"))]

    s = LibraryService(settings=settings, data_dir=data_dir, scan=scan)
    s.scans = scans
    assert s.models_folder().is_relative_to(tmp_path)
    s.models_folder().mkdir(parents=True)
    (s.models_folder() / "good.gguf").write_bytes(b"x" * 1_200)
    (s.models_folder() / "broken.gguf").write_bytes(b"x")
    yield s
    s.shutdown()


def test_table_and_status_follow_the_scan(service, loop):
    c = LibraryController(service)
    changes = []
    c.statusChanged.connect(lambda: changes.append(c.status_text()))
    assert c.is_empty() and "No models yet" in c.empty_text() and str(service.models_folder()) in c.empty_text()

    async def scenario():
        await service.rescan()
        assert sorted(e.name for e in c.model.entries) == ["broken", "good"]
        assert c.status_text() == f"2 models in {service.models_folder()}" and not c.is_empty()
        assert "Scanning 1 folder(s)…" in changes and changes[-1] == c.status_text()

    run(loop, scenario())


def test_open_only_a_readable_model_and_record_its_use(service, loop):
    c = LibraryController(service)
    opened = []
    c.openRequested.connect(opened.append)
    good = entry(service.models_folder() / "good.gguf")
    broken = entry(service.models_folder() / "broken.gguf", "not a GGUF file")
    assert not c.open(None) and not c.open(broken) and opened == []
    assert c.open(good) and opened == [str(good.path)]

    async def scenario():
        state = LibraryState(service.data_dir / "library.json")
        await until(lambda: state.last_used(), 10, "the use recorded")

    run(loop, scenario())
    assert c.folder_of(good) == service.models_folder()
    assert c.folder_of(entry(service.models_folder())) == service.models_folder()  # a model folder itself


def test_delete_asks_then_says_the_outcome(service, loop):
    c = LibraryController(service)
    good = entry(service.models_folder() / "good.gguf")
    title, text = c.delete_question(good)
    assert title == "Delete model" and "“good” (1.2 KB)" in text and "cannot be undone" in text

    async def scenario():
        await c.delete(good)
        assert not good.path.exists() and c.note == "Deleted good · "
        await until(lambda: not service.scanning and [e.name for e in c.model.entries] == ["broken"], 10, "the rescan")
        assert c.status_text() == f"Deleted good · 1 model in {service.models_folder()}"
        await c.delete(good)  # already gone: nothing to remove, said as done
        assert c.note == "Deleted good · "

    run(loop, scenario())


def test_folders_go_to_the_service(service, loop, tmp_path):
    c = LibraryController(service)
    other, new = tmp_path / "other", tmp_path / "new"
    other.mkdir()
    new.mkdir()
    (other / "more.gguf").write_bytes(b"x" * 10)

    async def scenario():
        c.add_folder(None)  # the user cancelled: nothing
        c.change_models_folder("")
        assert service.scans == [] and c.extra_folders() == []
        c.add_folder(str(other))
        await until(lambda: not service.scanning and len(c.model.entries) == 3, 10, "the extra folder")
        assert c.extra_folders() == [other] and c.status_text().endswith("and 1 more folder(s)")
        c.change_models_folder(str(new))
        await until(lambda: not service.scanning and len(c.model.entries) == 1, 10, "the new folder")
        assert c.models_folder() == new and [e.name for e in c.model.entries] == ["more"]
        c.remove_folder(other)
        await until(lambda: not service.scanning and not c.model.entries, 10, "the folder dropped")
        assert c.is_empty()

    run(loop, scenario())


def test_fast_open_caches_are_shown_and_cleared(service, loop):
    c = LibraryController(service)
    folder = service.data_dir / pack_cache.FOLDER
    folder.mkdir(parents=True)
    for name in ("a", "b"):
        (folder / f"{name}-0123{pack_cache.SUFFIX}").write_bytes(b"x" * 1_500)
        (folder / f"{name}-0123.packed.source").write_text(str(service.models_folder() / f"{name}.gguf"))
    assert [p.source.endswith(".gguf") for p in c.caches()] == [True, True]
    assert c.status_text().endswith(" · fast-open caches: 2, 3.0 KB")
    title, text = c.clear_caches_question()
    assert title == "Clear fast-open caches" and "Remove 2 fast-open cache(s) (3.0 KB)" in text

    async def scenario():
        await c.clear_caches()

    run(loop, scenario())
    assert c.caches() == [] and not list(folder.iterdir())
    assert c.note == "Cleared 2 fast-open cache(s), 3.0 KB · " and "fast-open caches:" not in c.status_text()
