"""Collections: incremental re-indexing, faults skipped with reasons, pause and cancel."""
import os
import threading

import pytest

from core import limits
from core.documents.collect import IndexJob, index_collection, walk
from tests.core.documents.conftest import write_pdf


def _folder(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "a.md").write_text("# A\n\nApples are red.")
    (root / "sub" / "b.txt").write_text("Bananas are yellow.")
    (root / "c.bin").write_bytes(b"\x00\x01")  # not a document kind: ignored, not skipped
    (root / "bad.txt").write_bytes(b"\x00\x00binary\x00")
    return root


def _files(ix, coll):
    return {os.path.relpath(p, coll.root): r["status"] for p, r in ix.files(coll.id).items()}


def test_index_then_only_changes_are_read(ix, tmp_path):
    root = _folder(tmp_path)
    p = index_collection(ix, root)
    coll = ix.collection(root)
    assert p.state == "done" and p.files_total == 3 and p.files_read == 2
    assert _files(ix, coll) == {"a.md": "ok", os.path.join("sub", "b.txt"): "ok", "bad.txt": "skipped"}
    assert p.skipped == ((str(root / "bad.txt"), "it holds NUL bytes: a binary file, not text"),)
    assert (coll.files, coll.skipped, coll.chunks, coll.state) == (3, 1, 2, "done")
    again = index_collection(ix, root)
    assert again.files_read == 0 and again.files_done == 3
    (root / "a.md").write_text("# A\n\nApricots are orange.")
    os.remove(root / "sub" / "b.txt")
    (root / "d.txt").write_text("Dates are sweet.")
    p3 = index_collection(ix, root)
    assert (p3.files_read, p3.removed) == (2, 1)
    texts = {r[0] for r in ix.q("SELECT text FROM doc_chunks")}
    assert texts == {"# A\n\nApricots are orange.", "Dates are sweet."}  # old passages gone


def test_same_content_touched_is_not_read_again(ix, tmp_path):
    root = _folder(tmp_path)
    index_collection(ix, root)
    st = os.stat(root / "a.md")
    os.utime(root / "a.md", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    p = index_collection(ix, root)
    assert p.files_read == 0 and ix.q("SELECT count(*) FROM doc_blobs")[0][0] == 2


def test_disconnected_folder_keeps_the_index(ix, tmp_path):
    root = _folder(tmp_path)
    index_collection(ix, root)
    root.rename(tmp_path / "elsewhere")
    p = index_collection(ix, root)
    assert p.state == "unreachable" and "disconnected" in p.message
    assert ix.collection(root).chunks == 2 and ix.collection(root).state == "unreachable"


def test_symlink_loop_is_said_and_skipped(ix, tmp_path):
    root = _folder(tmp_path)
    os.symlink(root, root / "sub" / "loop")
    os.symlink(root / "nowhere", root / "broken.md")
    p = index_collection(ix, root)
    reasons = dict(p.skipped)
    assert "symlink loop" in reasons[str(root / "sub" / "loop")]
    assert reasons[str(root / "broken.md")] == "a broken link" and p.state == "done"


def test_many_files_are_bounded_by_the_limit(tmp_path, monkeypatch):
    root = tmp_path / "many"
    root.mkdir()
    for i in range(300):
        (root / f"f{i}.txt").touch()
    found = walk(str(root), max_files=100)
    assert len(found.files) == 100 and not found.complete and "more than 100 files" in found.skipped[-1][1]
    assert len(walk(str(root)).files) == 300


def test_a_file_deleted_mid_index_is_skipped(ix, tmp_path):
    root = _folder(tmp_path)
    seen = []

    def progress(p):
        if p.current.endswith("a.md") and not seen:
            seen.append(1)
            os.remove(root / "sub" / "b.txt")  # before the job reaches it
    p = index_collection(ix, root, progress=progress, every=0)
    assert p.state == "done" and dict(p.skipped)[str(root / "sub" / "b.txt")] == "deleted while indexing"
    assert str(root / "sub" / "b.txt") not in ix.files(ix.collection(root).id)


def test_cancel_keeps_what_was_indexed_and_resume_continues(ix, tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(6):
        (root / f"f{i}.txt").write_text(f"file number {i}")
    cancel = threading.Event()

    def progress(p):
        if p.files_done == 2:
            cancel.set()
    p = index_collection(ix, root, progress=progress, cancel=cancel, every=0)
    assert p.state == "cancelled" and p.files_done == 2
    assert len(ix.files(ix.collection(root).id)) == 2
    p2 = index_collection(ix, root)
    assert p2.files_read == 4 and len(ix.files(ix.collection(root).id)) == 6


def test_job_pauses_and_cancels_on_its_thread(ix, tmp_path):
    root = _folder(tmp_path)
    states, paused = [], threading.Event()
    job = IndexJob(ix, root, progress=lambda p: (states.append(p.state), p.state == "paused" and paused.set()))
    job.pause()
    job.start()
    assert paused.wait(5)
    assert job.running
    job.cancel()
    result = job.wait(5)
    assert result.state == "cancelled" and not job.running and "paused" in states


def test_pdf_in_a_collection_and_scanned_one_skipped(ix, tmp_path):
    root = tmp_path / "pdfs"
    root.mkdir()
    write_pdf(root / "text.pdf", ["Vicunas live in the Andes."])
    write_pdf(root / "scan.pdf", [""])
    p = index_collection(ix, root)
    assert "no text layer" in dict(p.skipped)[str(root / "scan.pdf")]
    hits = ix.hits([c for c, _ in ix.bm25("where do vicunas live", ix.scope_blobs(collections=[ix.collection(root).id]))])
    assert hits[0].page == 1 and hits[0].source == str(root / "text.pdf")


def test_too_big_file_skipped_by_size(ix, tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_TEXT_DOCUMENT_BYTES", 10)
    root = tmp_path / "d"
    root.mkdir()
    (root / "big.txt").write_text("x" * 100)
    p = index_collection(ix, root)
    assert "more than the 10 bytes" in dict(p.skipped)[str(root / "big.txt")]


@pytest.mark.skipif(os.name == "nt", reason="POSIX permissions")
def test_unreadable_subfolder_is_said(ix, tmp_path):
    root = _folder(tmp_path)
    locked = root / "locked"
    locked.mkdir()
    (locked / "x.txt").write_text("x")
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as root")
        p = index_collection(ix, root)
        assert "cannot list the folder" in dict(p.skipped)[str(locked)]
    finally:
        locked.chmod(0o755)


def test_a_file_changed_mid_read_keeps_its_old_passages_until_next_time(ix, tmp_path):
    root = _folder(tmp_path)
    index_collection(ix, root)
    a = root / "a.md"
    a.write_text("# A\n\nAvocados are green.")

    def progress(p):
        if p.current == str(a) and "Avocados" in a.read_text():
            a.write_text("# A\n\nAcai berries are purple, mostly.")  # while the job is on it
    p = index_collection(ix, root, progress=progress, every=0)
    assert dict(p.skipped)[str(a)] == "changed while being read: read again next time"
    texts = {r[0] for r in ix.q("SELECT text FROM doc_chunks")}
    assert "# A\n\nApples are red." in texts  # the last good read stays searchable
    index_collection(ix, root)
    texts = {r[0] for r in ix.q("SELECT text FROM doc_chunks")}
    assert "# A\n\nAcai berries are purple, mostly." in texts and "# A\n\nApples are red." not in texts
