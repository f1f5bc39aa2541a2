"""The Hugging Face Hub, through ``huggingface_hub``: search, a repository's loadable files,
and whether a file fits this machine.

:class:`HubClient` wraps ``HfApi`` (its ``endpoint`` points tests at a local server) and
turns the library's exceptions into :mod:`core.errors` hub errors a user can act on.
The memory estimate reads a GGUF file's header with HTTP range requests (a few MB of a
multi-GB file) and applies the loader's own rule per tensor (:func:`core.checkpoints.gguf.holding`):
packed types stay packed (Q5_*/Q6_K in two 4-bit planes), others are dequantized, plus the KV
cache at the chosen context.
"""
from __future__ import annotations

import contextlib
import json
import posixpath
import re
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit

import httpx
import torch
from huggingface_hub import HfApi, constants, get_token, hf_hub_url
from huggingface_hub import errors as hf
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from core import limits
from core.checkpoints.common import DTYPES, auto_dtype
from core.checkpoints.gguf import holding, meta_name, planned_kernel_kinds
from core.checkpoints.gguf_header import NeedMore, header_args, parse_header
from core.checkpoints.hf import args_from_config
from core.errors import CheckpointError, HubAuthError, HubError, HubNetworkError, HubNotFoundError, LlamaDeskError, one_line
from core.library.library import HF_FILES, quant_from_name
from core.library.reach import check_reachable, quiet_retry_logs
from core.model.kv_cache import rounded_capacity
from core.model.quant import PACKED_TYPES

try:
    import httpx2  # the fork huggingface_hub 2.x uses, when installed
except ImportError:
    httpx2 = None

SORTS = {"downloads": "downloads", "likes": "likes", "last_modified": "last_modified"}
FORMATS = ("gguf", "safetensors")
EXPAND = ["downloads", "likes", "lastModified", "gated", "private", "tags", "gguf", "config"]
HEADER_FIRST = 2 << 20  # bytes of a GGUF file read first; doubled until the header is whole
HEADER_MAX = 256 << 20

quiet_retry_logs()  # huggingface_hub is imported above; its retries log on every attempt


@dataclass
class RepoSummary:
    """One search hit. ``gated`` is False, 'auto' or 'manual' (as the Hub says)."""
    repo_id: str
    downloads: int | None
    likes: int | None
    last_modified: datetime | None
    license: str | None
    gated: bool | str
    formats: tuple[str, ...]


@dataclass
class HubFile:
    """A loadable file of a repository: one .gguf file (``kind`` 'gguf') or a safetensors
    folder (``kind`` 'hf-folder', ``path`` the folder, '' for the repository's root,
    ``files`` what it is made of). ``size`` is in bytes; ``sha256`` is the Hub's checksum
    of a single LFS file (None for a folder: each part has its own)."""
    repo_id: str
    path: str
    size: int
    sha256: str | None
    quant: str | None
    kind: str
    files: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return posixpath.basename(self.path) if self.path else self.repo_id.split("/")[-1]


@dataclass
class FitEstimate:
    """Memory a file needs once loaded: ``weights_bytes`` as held (packed or dequantized),
    ``kv_bytes`` for the KV cache at ``context_length``; ``fits`` against the free memory
    of ``device`` ('cpu', or 'cuda' when free VRAM was given)."""
    weights_bytes: int
    kv_bytes: int
    total_bytes: int
    fits: bool
    device: str = "cpu"
    context_length: int = 0
    free_bytes: int | None = None
    dtype: str = ""


def _status(e: Exception) -> int | None:
    resp = getattr(e, "response", None)
    return getattr(resp, "status_code", None)


@contextlib.contextmanager
def hub_errors(repo_id: str, *, token_given: bool, what: str = "") -> Iterator[None]:
    """Turn ``huggingface_hub``/``httpx`` exceptions into HubError subclasses with one plain line."""
    thing = f"'{what}' in '{repo_id}'" if what else f"'{repo_id}'"
    try:
        yield
    except LlamaDeskError:
        raise
    except hf.GatedRepoError as e:
        if token_given:
            raise HubAuthError(f"{repo_id} is gated and your token has no access to it (HTTP {_status(e)}): accept "
                               "its terms on its Hugging Face page while logged in, then try again") from None
        raise HubAuthError(f"{repo_id} is gated: accept its terms on its Hugging Face page, then give a Hugging Face "
                           "token (the token field, the HF_TOKEN environment variable or 'hf auth login')") from None
    except getattr(hf, "RemoteEntryNotFoundError", hf.EntryNotFoundError):
        raise HubNotFoundError(f"{thing} does not exist (any more) on the Hub") from None
    except hf.RepositoryNotFoundError as e:
        if _status(e) in (401, 403):
            raise HubAuthError(f"{repo_id} was not found, or it is private: if it is yours or shared with you, give "
                               "a Hugging Face token with access (HF_TOKEN or 'hf auth login')") from None
        raise HubNotFoundError(f"repository {repo_id} does not exist on the Hub (deleted, renamed or mistyped)") from None
    except hf.RevisionNotFoundError:
        raise HubNotFoundError(f"{repo_id} has no such revision") from None
    except hf.HfHubHTTPError as e:
        code = _status(e)
        if code in (401, 403):
            raise HubAuthError(f"the Hub refused access to {thing} (HTTP {code}): check your Hugging Face token") from None
        raise HubError(f"the Hub answered HTTP {code} for {thing}: {one_line(e, 200)}") from None
    except (*transport_errors(), ConnectionError, TimeoutError) as e:
        raise HubNetworkError(f"cannot reach the Hugging Face Hub ({one_line(e, 120)}): check the network "
                              "connection") from None
    except hf.HFValidationError as e:
        raise HubError(f"'{repo_id}' is not a repository name (owner/name): {one_line(e, 150)}") from None


def transport_errors() -> tuple[type[Exception], ...]:
    """Connection-level exceptions of httpx and of httpx2 (the fork huggingface_hub 2.x uses)."""
    out: list[type[Exception]] = [httpx.TransportError, httpx.StreamError]
    if httpx2 is not None:
        out += [httpx2.TransportError, httpx2.StreamError]
    return tuple(out)


class HubClient:
    """Search and inspect Hub repositories.

    Args:
        endpoint: the Hub's URL (default: $HF_ENDPOINT or huggingface.co).
        token: a Hugging Face token; None uses HF_TOKEN or the token ``huggingface_hub``
            stored at login (``hf auth login``).
    """

    def __init__(self, endpoint: str | None = None, token: str | None = None):
        self.endpoint = (endpoint or constants.ENDPOINT).strip().rstrip("/")
        try:
            parts = urlsplit(self.endpoint)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
        except ValueError:  # an unclosed IPv6 bracket, a port that is not a number
            ok = False
        if not ok:
            raise HubError(f"'{self.endpoint}' is not a Hub address: give an http:// or https:// URL")
        self.token = token or None
        self.api = HfApi(endpoint=self.endpoint, token=self.token)
        self._headers_cache: dict[tuple[str, str], tuple[dict, list]] = {}
        self._lock = threading.Lock()

    def with_token(self, token: str | None) -> "HubClient":
        """The same endpoint with another token (after a 401 asked for one)."""
        return HubClient(self.endpoint, token)

    @property
    def has_token(self) -> bool:
        return bool(self.token or get_token())

    def headers(self) -> dict[str, str]:
        """Request headers for downloads (user agent, and the token when there is one)."""
        return build_hf_headers(token=self.token, library_name="llamadesk")

    def file_url(self, repo_id: str, path: str, revision: str = "main") -> str:
        """The resolve URL of one file (huggingface_hub's own helper)."""
        return hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)

    def _errors(self, repo_id: str, what: str = ""):
        return hub_errors(repo_id, token_given=self.has_token, what=what)

    # ------------------------------------------------------------------ search
    def search(self, query: str = "", *, formats: Iterable[str] = FORMATS, sort: str = "downloads",
               limit: int = 50, llama_only: bool = True) -> list[RepoSummary]:
        """Repositories matching ``query`` that carry one of ``formats``, most downloaded
        (or liked, or recently updated) first. ``llama_only`` keeps the Llama architecture
        (tag 'llama', GGUF architecture or config model_type 'llama')."""
        if sort not in SORTS:
            raise HubError(f"unknown sort '{sort}' (use {', '.join(SORTS)})")
        wanted = tuple(f for f in formats if f in FORMATS)
        if not wanted:
            raise HubError(f"no known format among {list(formats)} (use gguf, safetensors)")
        # One query per format: the Hub ANDs filter tags, and an unfiltered query's first page
        # fills up with models of other kinds. Safetensors Llamas carry the 'llama' model-type
        # tag; GGUF repositories often do not, so those are checked by their GGUF architecture.
        found: dict[str, Any] = {}
        check_reachable(self.endpoint)  # offline: said in seconds, not after half a minute of retries
        for fmt in wanted:
            tags = [fmt, "llama"] if fmt == "safetensors" and llama_only else [fmt]
            with self._errors("search"):
                for m in self.api.list_models(search=query.strip() or None, filter=tags, sort=SORTS[sort],
                                              limit=max(1, int(limit)), expand=EXPAND):
                    found.setdefault(m.id, m)
        out = []
        for m in found.values():
            mtags = list(m.tags or [])
            fmts = tuple(f for f in FORMATS if f in mtags or (f == "gguf" and getattr(m, "gguf", None)))
            if not set(fmts) & set(wanted):
                continue
            if llama_only and not _is_llama(m, mtags):
                continue
            lic = next((t.split(":", 1)[1] for t in mtags if t.startswith("license:")), None)
            if lic is None and m.card_data is not None:
                lic = getattr(m.card_data, "license", None)
            out.append(RepoSummary(m.id, m.downloads, m.likes, m.last_modified, lic,
                                   m.gated if m.gated else False, fmts))
        key = {"downloads": lambda r: r.downloads or 0, "likes": lambda r: r.likes or 0,
               "last_modified": lambda r: r.last_modified.timestamp() if r.last_modified else 0.0}[sort]
        out.sort(key=key, reverse=True)  # the merged lists, in the Hub's order
        return out[:max(1, int(limit))]

    # ------------------------------------------------------------------ files
    def repo_files(self, repo_id: str) -> list[HubFile]:
        """The files of ``repo_id`` this app can load: each .gguf file (split GGUFs are left
        out: the loader reads single files) and each safetensors folder as one entry."""
        check_reachable(self.endpoint)
        with self._errors(repo_id):
            info = self.api.model_info(repo_id, files_metadata=True, timeout=30)
        sib = {s.rfilename: s for s in info.siblings or []}
        out: list[HubFile] = []
        for name, s in sorted(sib.items()):
            if name.lower().endswith(".gguf") and not _split_gguf(name):
                out.append(HubFile(repo_id, name, int(s.size or 0), s.lfs.sha256 if s.lfs else None,
                                   quant_from_name(posixpath.basename(name)), "gguf", (name,)))
        folders: dict[str, list[str]] = {}
        for name in sib:
            folders.setdefault(posixpath.dirname(name), []).append(name)
        dtypes = list((info.safetensors.parameters or {}).keys()) if getattr(info, "safetensors", None) else []
        for folder, names in sorted(folders.items()):
            base = {posixpath.basename(n): n for n in names}
            if "config.json" not in base or not any(b.endswith(".safetensors") for b in base):
                continue
            parts = tuple(sorted(n for b, n in base.items() if HF_FILES.fullmatch(b) and not b.endswith(".bin")
                                 and b not in ("README.md", ".gitattributes") and not b.startswith("LICENSE")))
            size = sum(int(sib[n].size or 0) for n in parts)
            quant = dtypes[0] if len(dtypes) == 1 else None
            out.append(HubFile(repo_id, folder, size, None, quant, "hf-folder", parts))
        return out

    def paths_info(self, repo_id: str, paths: list[str]) -> dict[str, Any]:
        """{path: RepoFile} for ``paths`` (size, LFS sha256, git blob id), from the Hub now."""
        with self._errors(repo_id):
            got = self.api.get_paths_info(repo_id, paths)
        return {p.path: p for p in got if hasattr(p, "size")}

    def read_range(self, repo_id: str, path: str, start: int, length: int) -> bytes:
        """``length`` bytes of a file from ``start`` (an HTTP range request)."""
        headers = {**self.headers(), "Range": f"bytes={start}-{start + length - 1}"}
        with self._errors(repo_id, path):
            r = get_session().get(self.file_url(repo_id, path), headers=headers, follow_redirects=True, timeout=30)
            hf_raise_for_status(r)
            return r.content

    def read_json(self, repo_id: str, path: str) -> Any:
        with self._errors(repo_id, path):
            r = get_session().get(self.file_url(repo_id, path), headers=self.headers(), follow_redirects=True,
                                  timeout=30)
            hf_raise_for_status(r)
        try:
            return json.loads(r.content)
        except ValueError:
            raise HubError(f"{path} in {repo_id} is not valid JSON") from None

    def gguf_header(self, file: HubFile) -> tuple[dict[str, Any], list[tuple[str, str, tuple[int, ...], int]]]:
        """A remote GGUF file's metadata and tensor list (name, type, numpy shape, bytes),
        read with range requests: the first 2 MB, more only when the header is longer."""
        key = (file.repo_id, file.path)
        with self._lock:
            if key in self._headers_cache:
                return self._headers_cache[key]
        n = HEADER_FIRST
        while True:
            want = min(n, file.size) if file.size else n
            data = self.read_range(file.repo_id, file.path, 0, want)
            try:
                parsed = parse_header(data, source=f"{file.repo_id}/{file.path}")[:2]
                break
            except CheckpointError as e:
                raise HubError(f"{file.path} in {file.repo_id}: {e}") from None
            except NeedMore:
                if len(data) < want or want >= (file.size or HEADER_MAX) or n >= HEADER_MAX:
                    raise HubError(f"{file.path} in {file.repo_id}: the GGUF header is damaged or too long") from None
                n *= 4
        with self._lock:
            self._headers_cache[key] = parsed
        return parsed

    # ------------------------------------------------------------------ memory
    def model_args(self, file: HubFile):
        """(ModelArgs, tensors or None) of a remote file, from its GGUF header or config.json."""
        if file.kind == "gguf":
            meta, tensors = self.gguf_header(file)
            try:
                return header_args(meta, tensors, f"{file.repo_id}/{file.path}"), tensors
            except LlamaDeskError as e:
                raise HubError(f"{file.path} cannot be loaded here: {e}") from None
        cfg_path = posixpath.join(file.path, "config.json") if file.path else "config.json"
        cfg = self.read_json(file.repo_id, cfg_path)
        if not isinstance(cfg, dict):
            raise HubError(f"{cfg_path} in {file.repo_id} is not a JSON object")
        try:
            return args_from_config(cfg, file=cfg_path), None
        except LlamaDeskError as e:
            raise HubError(f"{file.repo_id} cannot be loaded here: {e}") from None

    def fit(self, file: HubFile, *, context_length: int | None = None, free_ram: int | None = None,
            free_vram: int | None = None, dtype: str = "auto") -> FitEstimate:
        """Memory ``file`` needs once loaded at ``context_length`` (default: the model's own,
        capped at the model's maximum), against ``free_vram`` when given (a GPU: bfloat16,
        CUDA packing), else ``free_ram`` (default: this machine's available memory)."""
        args, tensors = self.model_args(file)
        gpu = free_vram is not None
        dev = torch.device("cuda" if gpu else "cpu")
        if dtype in DTYPES:
            dt = DTYPES[dtype]
        elif gpu:
            dt = torch.bfloat16
        else:
            dt = auto_dtype(dev, args)[0]
        ctx = min(int(context_length or args.max_seq_len), args.max_seq_len)
        if tensors is None:
            weights = limits.param_count(args) * dt.itemsize
        else:
            weights = 0
            kernels = planned_kernel_kinds({kind for _, kind, shape, _ in tensors if len(shape) == 2}, dev, dtype)
            dt = torch.float32 if kernels else dt  # as the loader runs a model around the kernels
            for name, kind, shape, nbytes in tensors:
                meta = meta_name(name)
                if meta is None:  # rope_freqs: a few floats, turned into constants at load
                    continue
                weights += holding(meta, kind, shape, nbytes, dev, dt, keep_packed=dtype == "auto",
                                   tied=args.tie_word_embeddings, kernels=kernels)[1]
        kv = limits.kv_bytes(args, rounded_capacity(ctx), itemsize=dt.itemsize)  # as the cache allocates
        free = free_vram if gpu else (free_ram if free_ram is not None else limits.available_bytes())
        total = weights + kv
        return FitEstimate(weights, kv, total, free is None or total <= free, dev.type, ctx, free,
                           str(dt).removeprefix("torch."))

    def recommend(self, files: Iterable[HubFile], *, context_length: int | None = 4096,
                  free_ram: int | None = None, free_vram: int | None = None,
                  estimates: dict[str, FitEstimate] | None = None) -> HubFile | None:
        """The pick among ``files``: the largest that fits (bigger quantizations lose less),
        preferring types that stay packed in memory (Q4_K, Q4_0, Q8_0) at equal footing; None
        when nothing fits. ``estimates`` (path -> FitEstimate) saves recomputing them."""
        best, best_key = None, None
        for f in files:
            try:
                est = (estimates or {}).get(f.path) or self.fit(f, context_length=context_length, free_ram=free_ram,
                                                               free_vram=free_vram)
            except HubError:
                continue
            if not est.fits:
                continue
            q = (f.quant or "").upper()
            packed = any(q.startswith(p) for p in PACKED_TYPES)
            # headroom: a pick that leaves a quarter of memory free beats one that just squeezes in
            roomy = est.free_bytes is None or est.total_bytes <= 0.75 * est.free_bytes
            key = (roomy, packed, f.size)
            if best_key is None or key > best_key:
                best, best_key = f, key
        return best


def _is_llama(m, tags: list[str]) -> bool:
    if "llama" in tags or any(t.startswith("llama-") or t == "llama3" for t in tags):
        return True
    g = getattr(m, "gguf", None)
    if isinstance(g, dict) and g.get("architecture") == "llama":
        return True
    cfg = getattr(m, "config", None)
    return isinstance(cfg, dict) and cfg.get("model_type") == "llama"


def _split_gguf(name: str) -> bool:
    return re.search(r"-\d{5}-of-\d{5}\.gguf$", name) is not None


def free_memory() -> tuple[int | None, int | None]:
    """(free RAM, free VRAM or None without a CUDA GPU), in bytes."""
    vram = None
    try:
        if torch.cuda.is_available():
            vram = limits.available_bytes("cuda")
    except Exception:  # noqa: BLE001 — a driver that does not answer: no GPU estimate
        vram = None
    return limits.available_bytes(), vram


__all__ = ["HubClient", "RepoSummary", "HubFile", "FitEstimate", "hub_errors", "free_memory"]
