"""Documents (issue 26): indexing throughput, retrieval latency and quality, memory.

1. Indexing throughput through the real collection job (:func:`index_collection`: walk,
   hash, extract, chunk, FTS5 insert, one transaction per file): MB/s and files/s over a
   folder of real text (this Python's standard library sources and the repository's
   Markdown), and MB/s and pages/s over PDFs written here with fpdf2.
2. Retrieval latency p50/p99 of BM25 (FTS5 ``bm25()``) at 10k and 100k passages (synthetic
   passages drawn from the real corpus' word frequencies), against rank-bm25 (BM25Okapi,
   the usual Python peer) over the same passages, same queries.
3. Retrieval quality: recall@5 on known-item questions built from the passages themselves
   (a question is 6 words picked in order from a 12-word window of one passage; the answer
   is that passage), for BM25, dense (WordLlama l2_supercat, the embedding model whose
   weights ship in its wheel), hybrid (RRF of the two) and rank-bm25.
4. Memory: peak RSS above the baseline while indexing a big folder (goal < 300 MB above it
   for 1 GB).

    python bench/bench_documents.py [--quick] [--big-mb 1024] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.documents.chunk import approx_tokens, chunk_document  # noqa: E402
from core.documents.collect import index_collection  # noqa: E402
from core.documents.embedders import wordllama_embedder  # noqa: E402
from core.documents.extract import Document, Section  # noqa: E402
from core.documents.index import DocumentIndex  # noqa: E402
from core.documents.retrieve import Retriever  # noqa: E402

_WORDS = re.compile(r"[A-Za-z]{3,}")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _say(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


# --------------------------------------------------------------------------- corpora

def text_corpus(dst: Path, mb: float) -> int:
    """Copy real text files (stdlib .py, repo .md) into ``dst`` up to ``mb``; bytes copied."""
    import sysconfig
    srcs = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")) + sorted(ROOT.rglob("docs/*.md"))
    total, limit = 0, int(mb * 1e6)
    for i, src in enumerate(srcs):
        if total >= limit or "site-packages" in src.parts or "test" in src.parts:
            continue
        try:
            data = src.read_bytes()
        except OSError:
            continue
        sub = dst / f"d{i % 50:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{i}_{src.name}").write_bytes(data)
        total += len(data)
    return total


def pdf_corpus(dst: Path, files: int, pages: int, words: list[str]) -> int:
    from fpdf import FPDF
    rng = random.Random(3)
    dst.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        pdf = FPDF()
        pdf.set_font("helvetica", size=10)
        for _ in range(pages):
            pdf.add_page()
            pdf.multi_cell(0, 5, "\n\n".join(" ".join(rng.choices(words, k=60)) + "." for _ in range(6)))
        pdf.output(str(dst / f"doc{i}.pdf"))
    return files * pages


def vocabulary(ix: DocumentIndex) -> tuple[list[str], np.ndarray]:
    """The corpus' words and their frequencies (for synthetic passages that look like it)."""
    counts: dict[str, int] = {}
    for (text,) in ix.q("SELECT text FROM doc_chunks"):
        for w in _WORDS.findall(text):
            w = w.lower()
            counts[w] = counts.get(w, 0) + 1
    words = sorted(counts, key=counts.get, reverse=True)
    p = np.array([counts[w] for w in words], dtype=np.float64)
    return words, p / p.sum()


def synthetic_index(path: Path, n: int, words: list[str], p: np.ndarray, seed: int = 0) -> DocumentIndex:
    """An index of ``n`` passages of ~120 words each, drawn from the corpus' frequencies."""
    ix = DocumentIndex(path)
    rng = np.random.default_rng(seed)
    per_doc = 100
    for d in range(0, n, per_doc):
        idx = rng.choice(len(words), size=(per_doc, 120), p=p)
        text = "\n\n".join(" ".join(words[j] for j in row) for row in idx)
        doc = Document(f"/synthetic/doc{d}.txt", "text", [Section(text)], size=len(text), sha256=f"syn{seed}-{d}")
        chunks = chunk_document(doc, approx_tokens, max_tokens=160)
        with ix.tx() as c:
            ix.insert_blob(c, doc, chunks, 160, True)
    return ix


# --------------------------------------------------------------------------- measurements

def index_throughput(folder: Path, store: Path) -> dict:
    ix = DocumentIndex(store)
    t = time.perf_counter()
    p = index_collection(ix, folder)
    dt = time.perf_counter() - t
    chunks = ix.collection(folder).chunks
    ix.close()
    return {"files": p.files_read, "mb": p.bytes_read / 1e6, "seconds": dt, "mb_s": p.bytes_read / 1e6 / dt,
            "files_s": p.files_read / dt, "passages": chunks, "skipped": len(p.skipped)}


def questions(ix: DocumentIndex, n: int, seed: int = 1) -> list[tuple[str, int]]:
    """(question, the passage it was built from) for ``n`` random passages."""
    rng = random.Random(seed)
    rows = ix.q("SELECT id, text FROM doc_chunks")
    out = []
    for cid, text in rng.sample(rows, len(rows)):
        ws = _WORDS.findall(text)
        if len(ws) < 12:
            continue
        at = rng.randrange(len(ws) - 11)
        pick = sorted(rng.sample(range(12), 6))
        out.append((" ".join(ws[at + i] for i in pick), cid))
        if len(out) == n:
            break
    return out


def peer(ix: DocumentIndex):
    """rank-bm25 over the same passages (same word splitting as FTS5's unicode61, roughly)."""
    from rank_bm25 import BM25Okapi
    rows = ix.q("SELECT id, heading, text FROM doc_chunks ORDER BY id")
    ids = [r[0] for r in rows]
    t = time.perf_counter()
    bm = BM25Okapi([re.findall(r"\w+", (r[1] + " " + r[2]).lower()) for r in rows])
    build = time.perf_counter() - t

    def search(q: str, k: int) -> list[int]:
        s = bm.get_scores(re.findall(r"\w+", q.lower()))
        top = np.argpartition(-s, min(k, len(s) - 1))[:k]
        return [ids[i] for i in top[np.argsort(-s[top])]]
    return search, build


def latency(ix: DocumentIndex, qs: list[tuple[str, int]], peer_search, peer_queries: int) -> dict:
    """Top-5 latency and recall@5 of the questions: BM25 as searched (the rarest words'
    candidates scored in full, core/documents/bm25.py), FTS5 scoring every matching row
    (before that pruning), and the peer."""
    scope = [r[0] for r in ix.q("SELECT id FROM doc_blobs")]
    out: dict = {"queries": len(qs)}
    for key, prune in (("", True), ("full_", False)):
        times, found = [], 0
        for q, cid in qs:
            t = time.perf_counter()
            hits = ix.bm25(q, scope, 5, prune=prune)
            times.append(time.perf_counter() - t)
            found += cid in [c for c, _ in hits]
        out.update({f"{key}p50_ms": _pct(times, .5) * 1e3, f"{key}p99_ms": _pct(times, .99) * 1e3,
                    f"{key}recall": found / len(qs)})
    theirs = []
    for q, _ in qs[:peer_queries]:
        t = time.perf_counter()
        peer_search(q, 5)
        theirs.append(time.perf_counter() - t)
    return {**out, "peer_p50_ms": _pct(theirs, .5) * 1e3, "peer_p99_ms": _pct(theirs, .99) * 1e3,
            "peer_queries": len(theirs)}


def recall(ix: DocumentIndex, qs: list[tuple[str, int]], peer_search, embedder) -> dict:
    scope = [r[0] for r in ix.q("SELECT id FROM doc_blobs")]
    out = {}
    t = time.perf_counter()
    embedded = Retriever(ix, embedder).embed_missing(scope) if embedder else 0
    embed_s = time.perf_counter() - t
    for mode in ("bm25", "dense", "hybrid"):
        if mode != "bm25" and embedder is None:
            continue
        r = Retriever(ix, embedder)
        out[mode] = sum(cid in [h.chunk_id for h in r.ranked(q, scope, 5, mode)] for q, cid in qs) / len(qs)
    out["rank_bm25"] = sum(cid in peer_search(q, 5) for q, cid in qs) / len(qs)
    out.update(questions=len(qs), passages=ix.q("SELECT count(*) FROM doc_chunks")[0][0],
               embedded=embedded, embed_s=embed_s, embedder=embedder.name if embedder else None)
    return out


def memory(folder: Path, store: Path) -> dict:
    """Peak RSS above the baseline of a fresh process (imports done) indexing ``folder``:
    measured in a child, so what this process freed earlier cannot hide the growth."""
    import subprocess
    out = subprocess.run([sys.executable, __file__, "--memory-of", str(folder), str(store)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _memory_child(folder: Path, store: Path) -> dict:
    DocumentIndex(store).close()  # the store made: its cost is not indexing's
    base = _rss()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.wait(0.02):
            peak[0] = max(peak[0], _rss())
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    r = index_throughput(folder, store)
    done.set()
    th.join()
    return {**r, "baseline_mb": base / 1e6, "peak_above_mb": (max(peak[0], _rss()) - base) / 1e6}


# --------------------------------------------------------------------------- the section

def run(quick: bool = False, threads: int | None = None, big_mb: float | None = None) -> dict:  # long: one report
    data: dict = {"load_average_start": os.getloadavg()}
    tmp = Path(tempfile.mkdtemp(prefix="bench-docs-"))
    try:
        text_mb = 1 if quick else 20
        _say("text corpus")
        text_corpus(tmp / "text", text_mb)
        data["text"] = index_throughput(tmp / "text", tmp / "text.sqlite3")
        ix = DocumentIndex(tmp / "text.sqlite3")
        words, p = vocabulary(ix)
        _say(f"text indexed: {data['text']}; PDFs")
        pdf_pages = pdf_corpus(tmp / "pdf", 4 if quick else 20, 5 if quick else 20, words[:3000])
        data["pdf"] = {**index_throughput(tmp / "pdf", tmp / "pdf.sqlite3"), "pages": pdf_pages}
        data["pdf"]["pages_s"] = pdf_pages / data["pdf"]["seconds"]
        _say(f"PDF indexed: {data['pdf']}; quality")
        ix.close()
        text_corpus(tmp / "qual", 0.3 if quick else 1)  # dense needs every passage embedded: a smaller set
        index_throughput(tmp / "qual", tmp / "qual.sqlite3")
        qx = DocumentIndex(tmp / "qual.sqlite3")
        search, build = peer(qx)
        data["quality"] = recall(qx, questions(qx, 50 if quick else 300), search, wordllama_embedder())
        data["quality"]["peer_build_s"] = build
        qx.close()
        _say(f"quality: {data['quality']}")
        data["latency"] = {}
        for n in ((2000,) if quick else (10_000, 100_000)):
            t = time.perf_counter()
            six = synthetic_index(tmp / f"syn{n}.sqlite3", n, words[:20000], p[:20000] / p[:20000].sum())
            build_s = time.perf_counter() - t
            s, pbuild = peer(six)
            lq = questions(six, 200)
            data["latency"][n] = {**latency(six, lq, s, 20 if n >= 100_000 else 50), "index_build_s": build_s,
                                  "peer_build_s": pbuild}
            six.close()
            _say(f"latency at {n}: {data['latency'][n]}")
        big = big_mb if big_mb is not None else (10 if quick else 1024)
        _big_folder(tmp / "big", big, words[:20000], p[:20000] / p[:20000].sum())
        _say(f"memory: indexing {big} MB")
        data["memory"] = memory(tmp / "big", tmp / "big.sqlite3")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    data["load_average_end"] = os.getloadavg()
    return {"title": "Documents (`bench/bench_documents.py`)", "markdown": markdown(data), "data": data}


def _big_folder(dst: Path, mb: float, words: list[str], p: np.ndarray) -> None:
    """Text files of ~4 MB each (synthetic prose) adding up to ``mb``."""
    rng = np.random.default_rng(7)
    dst.mkdir(parents=True)
    block = [" ".join(words[j] for j in rng.choice(len(words), size=150, p=p)) for _ in range(2000)]
    n, total = 0, 0
    while total < mb * 1e6:
        rng.shuffle(block)
        data = ("\n\n".join(block) + "\n").encode()
        (dst / f"part{n:04d}.txt").write_bytes(data)
        total += len(data)
        n += 1


def markdown(d: dict) -> str:
    t, pdf, q, m = d["text"], d["pdf"], d["quality"], d["memory"]
    la = lambda x: ", ".join(f"{v:.1f}" for v in x)  # noqa: E731
    lines = [
        f"Load average {la(d['load_average_start'])} at the start, {la(d['load_average_end'])} at the end "
        "(a shared 2-core machine: throughput figures are what indexing got beside other jobs).",
        "",
        "| indexing | files | MB | s | MB/s | files/s | pages/s | passages |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| text (stdlib .py + docs .md) | {t['files']} | {t['mb']:.1f} | {t['seconds']:.1f} | {t['mb_s']:.2f} "
        f"| {t['files_s']:.0f} | | {t['passages']} |",
        f"| PDF (fpdf2, text layer) | {pdf['files']} | {pdf['mb']:.1f} | {pdf['seconds']:.1f} | {pdf['mb_s']:.2f} "
        f"| {pdf['files_s']:.1f} | {pdf['pages_s']:.1f} | {pdf['passages']} |",
        "",
        "| passages | BM25 p50 / p99 ms (recall@5) | every row scored p50 / p99 ms (recall@5) "
        "| rank-bm25 p50 / p99 ms | FTS5 index build s | rank-bm25 build s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in d["latency"].items():
        lines.append(f"| {int(n):,} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} ({r['recall']:.3f}) "
                     f"| {r['full_p50_ms']:.1f} / {r['full_p99_ms']:.1f} ({r['full_recall']:.3f}; {r['queries']} q) "
                     f"| {r['peer_p50_ms']:.0f} / {r['peer_p99_ms']:.0f} ({r['peer_queries']} q) "
                     f"| {r['index_build_s']:.1f} | {r['peer_build_s']:.1f} |")
    lines += ["", f"Recall@5 over {q['questions']} known-item questions on {q['passages']:,} real passages: "
              + ", ".join(f"{k} **{q[k]:.2f}**" for k in ("bm25", "dense", "hybrid", "rank_bm25") if k in q)
              + f" (dense: {q['embedder']}, {q['embedded']} passages embedded in {q['embed_s']:.1f} s).",
              "", f"Memory: indexing {m['mb']:.0f} MB in {m['files']} files took peak RSS **{m['peak_above_mb']:.0f} MB** "
              f"above the {m['baseline_mb']:.0f} MB baseline ({m['mb_s']:.2f} MB/s)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--big-mb", type=float, default=None, help="size of the memory test's folder (default 1024)")
    ap.add_argument("--out", default=None, help="also write the data as JSON here")
    ap.add_argument("--memory-of", nargs=2, metavar=("FOLDER", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_of:
        print(json.dumps(_memory_child(Path(args.memory_of[0]), Path(args.memory_of[1]))))
        return 0
    section = run(args.quick, big_mb=args.big_mb)
    print(f"## {section['title']}\n\n{section['markdown']}")
    if args.out:
        Path(args.out).write_text(json.dumps(section["data"], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
