"""A local stand-in for the Hugging Face Hub, for tests (the test machines have no route out).

Serves the routes ``huggingface_hub`` uses, with the JSON shapes its parsers read (facts
taken from its source: ``HfApi.list_models``, ``model_info``, ``get_paths_info``,
``list_repo_tree``, ``get_hf_file_metadata``):

- ``GET  /api/models?search=&filter=&sort=&limit=``      model search
- ``GET  /api/models/{repo}[/revision/{rev}]``          model info, siblings with sizes and LFS sha256
- ``POST /api/models/{repo}/paths-info/{rev}``          form ``paths=...``
- ``GET  /api/models/{repo}/tree/{rev}[/{path}]``       file listing
- ``HEAD|GET /{repo}/resolve/{rev}/{path}``             downloads, with ``Range: bytes=a-[b]``

Switches a test flips on the server object: ``cut_after[(repo, path)] = n`` closes the
connection after n body bytes (once), ``bad_checksum.add((repo, path))`` announces a wrong
sha256, ``remove(repo)`` makes a repository vanish (404), ``offline = True`` answers
nothing (connections are closed at once). A gated repository answers 401 to downloads
without ``Authorization: Bearer {token}``. ``bytes_sent[(repo, path)]`` counts body bytes
written to the socket, ``transfers`` lists each file GET with its Range and bytes (a
connection the client closed may have taken bytes it never read).
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_MIN = 1024  # files at least this big are "LFS" files (with a sha256); smaller ones plain git blobs


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFileSpec:
    """One file of a fake repository: its bytes live on disk (``source``) or in memory."""
    path: str
    source: Path | None = None
    data: bytes | None = None
    sha256: str = ""
    blob_id: str = ""
    size: int = 0

    def __post_init__(self):
        if self.source is not None:
            h, n = hashlib.sha256(), 0
            with open(self.source, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
                    n += len(chunk)
            self.sha256, self.size = h.hexdigest(), n
            self.blob_id = hashlib.sha1(self.sha256.encode()).hexdigest()  # stands in for the pointer's blob
        else:
            assert self.data is not None
            self.sha256, self.size = hashlib.sha256(self.data).hexdigest(), len(self.data)
            self.blob_id = git_blob_id(self.data)

    @property
    def lfs(self) -> bool:
        return self.size >= LFS_MIN

    def open(self):
        import io
        return open(self.source, "rb") if self.source is not None else io.BytesIO(self.data)


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFileSpec] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2024-09-25T00:00:00.000Z"
    gated: bool = False
    private: bool = False
    safetensors: dict | None = None  # {"parameters": {"F32": n}, "total": n}
    architecture: str = "llama"  # GGUF general.architecture / config model_type

    def add(self, path: str, *, source: Path | None = None, data: bytes | None = None) -> HubFileSpec:
        spec = HubFileSpec(path, source=source, data=data)
        self.files[path] = spec
        return spec


class FakeHub:
    """The server's state; the handler reads it. Start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, repos: list[HubRepo] | None = None, *, token: str = "hf_test_token"):
        self.repos: dict[str, HubRepo] = {r.repo_id: r for r in repos or []}
        self.token = token
        self.lock = threading.Lock()
        self.bytes_sent: dict[tuple[str, str], int] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.transfers: list[dict] = []  # one per file GET: repo, path, range, sent (body bytes)
        self.cut_after: dict[tuple[str, str], int] = {}
        self.bad_checksum: set[tuple[str, str]] = set()
        self.offline = False
        self.offline_after_cut = False  # a cut also takes the network down (until offline = False)
        self.throttle_bps: float | None = None  # slow downloads down (pause tests), bytes/s
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            pass
        Handler.hub = hub
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(10)
            self._httpd = None

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def add(self, repo: HubRepo) -> HubRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def remove(self, repo_id: str) -> None:
        self.repos.pop(repo_id, None)

    def sent(self, repo_id: str, path: str) -> int:
        with self.lock:
            return self.bytes_sent.get((repo_id, path), 0)

    def file_url(self, repo_id: str, path: str) -> str:
        return f"{self.url}/{repo_id}/resolve/main/{path}"

    # ------------------------------------------------------------------ JSON shapes
    def summary(self, repo: HubRepo) -> dict:
        return {"id": repo.repo_id, "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
                "author": repo.repo_id.split("/")[0], "downloads": repo.downloads, "likes": repo.likes,
                "lastModified": repo.last_modified, "createdAt": repo.last_modified,
                "gated": "manual" if repo.gated else False, "private": repo.private, "tags": list(repo.tags),
                "pipeline_tag": "text-generation", "library_name": "gguf" if "gguf" in repo.tags else "transformers",
                "sha": COMMIT,
                **({"gguf": {"architecture": repo.architecture}} if "gguf" in repo.tags else
                   {"config": {"model_type": repo.architecture}})}

    def sha256_of(self, repo: HubRepo, spec: HubFileSpec) -> str:
        if (repo.repo_id, spec.path) in self.bad_checksum:
            return hashlib.sha256(b"not the file" + spec.sha256.encode()).hexdigest()
        return spec.sha256

    def info(self, repo: HubRepo) -> dict:
        sib = []
        for spec in repo.files.values():
            s = {"rfilename": spec.path, "size": spec.size, "blobId": spec.blob_id}
            if spec.lfs:
                s["lfs"] = {"size": spec.size, "sha256": self.sha256_of(repo, spec), "pointerSize": 134}
            sib.append(s)
        lic = next((t.split(":", 1)[1] for t in repo.tags if t.startswith("license:")), None)
        out = {**self.summary(repo), "siblings": sib, "cardData": {"license": lic} if lic else None,
               "usedStorage": sum(s.size for s in repo.files.values())}
        if repo.safetensors:
            out["safetensors"] = repo.safetensors
        return out

    def path_info(self, repo: HubRepo, spec: HubFileSpec) -> dict:
        d = {"type": "file", "path": spec.path, "size": spec.size, "oid": spec.blob_id}
        if spec.lfs:
            d["lfs"] = {"oid": self.sha256_of(repo, spec), "size": spec.size, "pointerSize": 134}
        return d

    def search(self, q: dict[str, list[str]]) -> list[dict]:
        text = (q.get("search") or [""])[0].lower()
        tags = q.get("filter") or []
        repos = [r for r in self.repos.values() if not r.private and text in r.repo_id.lower()
                 and all(t in r.tags for t in tags)]
        key = (q.get("sort") or ["downloads"])[0]
        sort_key = {"downloads": lambda r: r.downloads, "likes": lambda r: r.likes,
                    "lastModified": lambda r: r.last_modified}.get(key, lambda r: r.downloads)
        repos.sort(key=sort_key, reverse=True)
        limit = int((q.get("limit") or [1000])[0])
        return [self.summary(r) for r in repos[:limit]]


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    # ------------------------------------------------------------------ helpers
    def _send_json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str) -> None:
        self._send_json({"error": message}, status, {"X-Error-Code": code, "X-Error-Message": message} if code else
                        {"X-Error-Message": message})

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.hub.token}"

    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            self._error(404 if repo is None else 401, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _offline(self) -> bool:
        if self.hub.offline:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return True
        return False

    # ------------------------------------------------------------------ routes
    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        if self._offline():
            return
        parts = urlsplit(self.path)
        path, q = unquote(parts.path), parse_qs(parts.query)
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range")))
        if path == "/api/models" and self.command == "GET":
            return self._send_json(self.hub.search(q))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/paths-info/([^/]+)", path)
        if m and self.command == "POST":
            repo = self._repo(m.group(1))
            if repo is None:
                return
            n = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(n).decode())
            wanted = form.get("paths", [])
            return self._send_json([self.hub.path_info(repo, repo.files[p]) for p in wanted if p in repo.files])
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m:
            repo = self._repo(m.group(1))
            if repo is None:
                return
            prefix = (m.group(3) or "").strip("/")
            recursive = (q.get("recursive") or ["false"])[0].lower() == "true"
            items, folders = [], set()
            for p, spec in sorted(repo.files.items()):
                if prefix and not p.startswith(prefix + "/"):
                    continue
                rest = p[len(prefix) + 1:] if prefix else p
                if "/" in rest and not recursive:
                    folders.add((prefix + "/" if prefix else "") + rest.split("/")[0])
                    continue
                items.append(self.hub.path_info(repo, spec))
            items += [{"type": "directory", "path": f, "oid": git_blob_id(f.encode()), "size": 0} for f in sorted(folders)]
            return self._send_json(items)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if m:
            repo = self._repo(m.group(1))
            if repo is not None:
                self._send_json(self.hub.info(repo))
            return
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and self.command in ("GET", "HEAD"):
            return self._resolve(m.group(1), m.group(3))
        self._error(404, None, f"no route for {path}")

    def _resolve(self, repo_id: str, file: str) -> None:
        hub = self.hub
        repo = self._repo(repo_id)
        if repo is None:
            return
        if repo.gated and not self._authorized():
            return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                                                 "to it and be authenticated to access it. Please log in.")
        spec = repo.files.get(file)
        if spec is None:
            return self._error(404, "EntryNotFound", f"{file} does not exist on 'main'")
        start, end = 0, spec.size - 1
        rng = self.headers.get("Range")
        status = 200
        if rng:
            mm = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not mm or int(mm.group(1)) >= spec.size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{spec.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(mm.group(1))
            end = min(int(mm.group(2)), spec.size - 1) if mm.group(2) else spec.size - 1
            status = 206
        self.send_response(status)
        etag = hub.sha256_of(repo, spec) if spec.lfs else spec.blob_id
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{spec.size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        key = (repo_id, file)
        record = {"repo": repo_id, "path": file, "range": rng, "sent": 0}
        with hub.lock:
            cut = hub.cut_after.pop(key, None)
            hub.transfers.append(record)
        left, sent, t0 = end - start + 1, 0, time.monotonic()
        with spec.open() as f:
            f.seek(start)
            while left > 0:
                n = min(left, 1 << 20 if hub.throttle_bps is None else 1 << 14)
                if cut is not None:
                    n = min(n, cut - sent)
                    if n <= 0:  # the connection drops mid-file
                        hub.offline = hub.offline or hub.offline_after_cut
                        self.close_connection = True
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                chunk = f.read(n)
                if not chunk:
                    break
                try:
                    self.wfile.write(chunk)
                except OSError:  # the client went away (pause, cancel)
                    self.close_connection = True
                    return
                finally:
                    with hub.lock:
                        hub.bytes_sent[key] = hub.bytes_sent.get(key, 0) + len(chunk)
                        record["sent"] += len(chunk)
                sent += len(chunk)
                left -= len(chunk)
                if hub.throttle_bps:
                    wait = sent / hub.throttle_bps - (time.monotonic() - t0)
                    if wait > 0:
                        time.sleep(wait)
                if repo.repo_id not in hub.repos:  # vanished mid-download
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return


# ---------------------------------------------------------------------- the test tree

GGUF_REPO = "llamadesk-test/stories260K-GGUF"
HF_REPO = "llamadesk-test/tiny-llama-hf"
GATED_REPO = "llamadesk-test/gated-llama-GGUF"


def build_tree(folder: Path, fixtures: Path) -> list[HubRepo]:
    """The fixture repositories: the real stories260K model as GGUF (F32; beside it a random
    model in Q8_0 and one in a Q4_K/Q6_K mix, as llama.cpp's Q4_K_M), a tiny random HF safetensors
    folder, and a gated copy of the GGUF repository."""
    from tests.core.checkpoints.util import random_model, write_gguf, write_tiny_tokenizer
    from tests.helpers import tiny_hf

    folder.mkdir(parents=True, exist_ok=True)
    gguf = HubRepo(GGUF_REPO, tags=["gguf", "llama", "text-generation", "license:mit"], downloads=1500, likes=12,
                   last_modified="2024-06-01T10:00:00.000Z")
    gguf.add("stories260K.gguf", source=fixtures / "stories260K.gguf")
    q8 = folder / "tiny-Q8_0.gguf"
    write_gguf(q8, random_model(seed=3, vocab_size=288, max_seq_len=512), qtype="Q8_0")
    gguf.add(q8.name, source=q8)
    # llama.cpp's Q4_K_M mix: Q4_K mostly, Q6_K for the output and down projections (K-quants need 256-wide rows)
    mix = folder / "tiny-Q4_K_M.gguf"
    model = random_model(seed=4, dim=256, hidden_dim=512, vocab_size=288, max_seq_len=1024)
    write_gguf(mix, model, qtype="Q4_K", qtypes={n: "Q6_K" for n in model.state_dict()
                                                  if n == "output.weight" or n.endswith("w2.weight")})
    gguf.add(mix.name, source=mix)
    gguf.add("README.md", data=b"# stories260K\n\nA tiny story model (llama2.c), MIT.\n")

    hf_dir = folder / "tiny-hf"
    if not (hf_dir / "model.safetensors").exists():
        model = tiny_hf(seed=5)
        model.save_pretrained(hf_dir, safe_serialization=True)
        write_tiny_tokenizer(hf_dir)
    hf = HubRepo(HF_REPO, tags=["transformers", "safetensors", "llama", "text-generation", "license:apache-2.0"],
                 downloads=300, likes=40, last_modified="2025-01-15T08:00:00.000Z")
    for f in sorted(hf_dir.iterdir()):
        hf.add(f.name, source=f) if f.stat().st_size >= LFS_MIN else hf.add(f.name, data=f.read_bytes())
    hf.add("README.md", data=b"# tiny-llama-hf\n\nRandom weights for tests.\n")

    gated = HubRepo(GATED_REPO, tags=["gguf", "llama", "text-generation", "license:llama3.2"], downloads=90,
                    likes=99, last_modified="2025-03-01T00:00:00.000Z", gated=True)
    gated.add("stories260K-gated.gguf", source=fixtures / "stories260K.gguf")
    return [gguf, hf, gated]
