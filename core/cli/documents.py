"""``python -m core documents index|search|list|remove`` and ``generate --attach/--collection``.

The index lives in the history store (``--store``, default the app's ``history.sqlite3``),
so what the CLI indexes the app finds, and the other way round. Progress and skipped files
go to stderr; stdout carries the result (text, or one JSON object with --json).
"""
from __future__ import annotations

import json
import os
import sys

from core.documents.chunk import DEFAULT_CHUNK_TOKENS, approx_tokens
from core.documents.collect import index_collection
from core.documents.extract import DocumentError
from core.documents.ground import Grounding, default_budget, ground
from core.documents.index import DocumentIndex
from core.documents.embedders import DEFAULT_EMBEDDER, EMBEDDERS, load_embedder
from core.documents.retrieve import MODES, Retriever
from core.errors import SettingsError

#: the budget for documents when the model's context is unknown (a server's model)
REMOTE_CONTEXT = 4096


def add_store_opt(p) -> None:
    p.add_argument("--store", default=None, metavar="FILE",
                   help="the history store holding the index (default: the app's history.sqlite3)")


def add_document_opts(p) -> None:
    """generate's flags: documents to ground the prompt in."""
    p.add_argument("--attach", nargs="+", action="extend", default=[], metavar="FILE",
                   help="ground the prompt in these files (text, Markdown, code, PDF, .docx, HTML): whole when they "
                        "fit the budget, else the best passages")
    p.add_argument("--collection", action="append", default=[], metavar="DIR",
                   help="ground the prompt in an indexed folder (see 'documents index'); repeatable")
    p.add_argument("--doc-budget", type=int, default=None, metavar="TOKENS",
                   help="tokens the documents may take (default: half the model's context)")
    p.add_argument("--passages", type=int, default=None, metavar="K", help="retrieve at most K passages")
    p.add_argument("--retrieval", default="bm25", choices=MODES,
                   help="how passages are found: BM25 (words), dense (an embedding model) or both fused")
    add_embedder_opt(p)
    add_store_opt(p)


def add_embedder_opt(p) -> None:
    p.add_argument("--embedder", default=DEFAULT_EMBEDDER, choices=list(EMBEDDERS),
                   help="the embedding model of dense and hybrid retrieval: "
                        + "; ".join(f"{k}: {v}" for k, v in EMBEDDERS.items()) + f" (default {DEFAULT_EMBEDDER})")


def documents_parser(sub) -> None:
    d = sub.add_parser("documents", help="index folders of documents and search them")
    verbs = d.add_subparsers(dest="verb", required=True, parser_class=type(d))
    i = verbs.add_parser("index", help="index a folder (again: only what changed is read)")
    i.add_argument("folder")
    i.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS, metavar="N",
                   help=f"most tokens per passage (default {DEFAULT_CHUNK_TOKENS})")
    s = verbs.add_parser("search", help="the passages that best match a query")
    s.add_argument("query")
    s.add_argument("--collection", action="append", default=[], metavar="DIR",
                   help="search this indexed folder (repeatable; default: every collection)")
    s.add_argument("-k", type=int, default=5, help="passages to show (default 5)")
    s.add_argument("--mode", default="bm25", choices=MODES)
    add_embedder_opt(s)
    verbs.add_parser("list", help="the indexed folders")
    r = verbs.add_parser("remove", help="forget an indexed folder (its files are not touched)")
    r.add_argument("folder")
    for p in (i, s, verbs.choices["list"], r):
        add_store_opt(p)
        p.add_argument("--json", action="store_true", help="print one JSON object")


def _open(args) -> DocumentIndex:
    return DocumentIndex(args.store)


def _embedder(mode: str, name: str = DEFAULT_EMBEDDER):
    if mode == "bm25":
        return None
    try:
        return load_embedder(name)
    except DocumentError as e:
        raise SettingsError(str(e)) from None


def cmd_documents(args) -> int:
    with _open(args) as ix:
        return {"index": _index, "search": _search, "list": _list, "remove": _remove}[args.verb](ix, args)


def _index(ix: DocumentIndex, args) -> int:
    if args.chunk_tokens < 8:
        raise SettingsError(f"--chunk-tokens must be at least 8, got {args.chunk_tokens}")
    if not os.path.isdir(args.folder) and ix.collection(args.folder) is None:
        raise DocumentError(f"{args.folder} is not a folder")
    tty = sys.stderr.isatty()

    def progress(p):
        if tty and p.state == "indexing":
            print(f"\r{p.files_done}/{p.files_total} files", end="", file=sys.stderr, flush=True)
    p = index_collection(ix, args.folder, max_tokens=args.chunk_tokens, progress=progress, every=0.2)
    if tty:
        print(file=sys.stderr)
    c = ix.collection(args.folder)
    if args.json:
        print(json.dumps({"folder": c.root, "state": p.state, "message": p.message, "files": c.files,
                          "read": p.files_read, "bytes_read": p.bytes_read, "removed": p.removed,
                          "passages": c.chunks, "skipped": [{"path": a, "reason": b} for a, b in p.skipped]},
                         ensure_ascii=False))
    else:
        for path, why in p.skipped:
            print(f"skipped {path}: {why}", file=sys.stderr)
        print(f"{c.root}: {p.state}{' (' + p.message + ')' if p.message else ''}; {c.files} files "
              f"({p.files_read} read, {len(p.skipped)} skipped, {p.removed} removed), {c.chunks} passages")
    if p.state == "unreachable":
        print(f"error: {p.message}", file=sys.stderr)
        return 2
    return 0


def _collection_ids(ix: DocumentIndex, folders) -> list[int]:
    if not folders:
        return [c.id for c in ix.collections()]
    ids = []
    for f in folders:
        c = ix.collection(f)
        if c is None:
            raise DocumentError(f"{f} is not an indexed collection (run 'documents index {f}' first)")
        ids.append(c.id)
    return ids


def _search(ix: DocumentIndex, args) -> int:
    if args.k < 1:
        raise SettingsError(f"-k must be at least 1, got {args.k}")
    if not args.query.strip():
        raise SettingsError("QUERY is empty: give the words to search for")
    ids = _collection_ids(ix, args.collection)
    hits = Retriever(ix, _embedder(args.mode, args.embedder)).search(args.query, collections=ids, k=args.k, mode=args.mode)
    if args.json:
        print(json.dumps({"query": args.query, "mode": args.mode,
                          **({"embedder": args.embedder} if args.mode != "bm25" else {}), "hits": [
            {"chunk_id": h.chunk_id, "score": h.score, "source": h.source, "page": h.page,
             "line_start": h.line_start, "line_end": h.line_end, "heading": h.heading, "where": h.where(),
             "text": h.text} for h in hits]}, ensure_ascii=False))
    else:
        if not hits:  # said, so an empty answer is not mistaken for a broken index
            print(f"no passage matches {args.query!r}", file=sys.stderr)
        for n, h in enumerate(hits, 1):
            print(f"[{n}] {h.where()}  ({h.score:.3f})  {h.source}")
            print("    " + " ".join(h.text.split())[:300])
    return 0


def _list(ix: DocumentIndex, args) -> int:
    cs = ix.collections()
    if args.json:
        print(json.dumps({"collections": [{"folder": c.root, "name": c.name, "state": c.state, "files": c.files,
                                           "skipped": c.skipped, "passages": c.chunks, "updated_at": c.updated_at,
                                           "message": c.message} for c in cs]}, ensure_ascii=False))
    else:
        for c in cs:
            print(f"{c.root}\t{c.state}\t{c.files} files\t{c.skipped} skipped\t{c.chunks} passages")
    return 0


def _remove(ix: DocumentIndex, args) -> int:
    if not ix.remove_collection(args.folder):
        raise DocumentError(f"{args.folder} is not an indexed collection")
    if args.json:
        print(json.dumps({"removed": os.path.abspath(args.folder)}))
    else:
        print(f"removed {os.path.abspath(args.folder)}")
    return 0


def grounded_prompt(args, counter=None, context: int | None = None) -> Grounding | None:
    """The grounded prompt for generate's --attach/--collection (None without them);
    passages are counted by ``counter`` when there is one (a local model's
    :func:`~core.documents.chunk.model_counter`, as the app counts them), else estimated."""
    if not args.attach and not args.collection:
        for flag, v in (("--doc-budget", args.doc_budget), ("--passages", args.passages)):
            if v is not None:
                raise SettingsError(f"{flag} needs --attach or --collection")
        return None
    if args.doc_budget is not None and args.doc_budget < 16:
        raise SettingsError(f"--doc-budget must be at least 16 tokens, got {args.doc_budget}")
    if args.passages is not None and args.passages < 1:
        raise SettingsError(f"--passages must be at least 1, got {args.passages}")
    count = counter or approx_tokens
    budget = args.doc_budget or default_budget(context or REMOTE_CONTEXT)
    with _open(args) as ix:
        return ground(args.prompt, ix, attachments=args.attach, collections=args.collection, budget_tokens=budget,
                      count_tokens=count, k=args.passages, mode=args.retrieval, embedder=_embedder(args.retrieval, args.embedder))


def say_grounding(g: Grounding) -> None:
    """The grounding's summary, sources and notes, on stderr (stdout keeps the reply)."""
    print(f"documents: {g.summary}", file=sys.stderr)
    for s in g.sources:
        print(f"  [{s.number}] {s.where()}", file=sys.stderr)
    for n in g.notes:
        print(f"  note: {n}", file=sys.stderr)
