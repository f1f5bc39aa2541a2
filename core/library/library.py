"""The model library: the checkpoints found in the models folder (and any extra folders).

:func:`scan` reads only headers and config files (GGUF metadata, ``config.json``,
``params.json``), never weights, so a folder of large models scans in well under a second
each. What the library remembers (when each model was last used, which folders to scan,
where a download came from) is one small JSON file in the data folder, rewritten
atomically. Partial downloads (:mod:`core.library.downloads`) live in a hidden ``.downloads``
folder and end in ``.part``: the scanner skips both.
"""
from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import sentencepiece as spm
from gguf.constants import LlamaFileType

from core import limits
from core.checkpoints import pack_cache
from core.checkpoints.gguf_header import ROPE_FREQS, header_args, read_header
from core.checkpoints.hf import args_from_config
from core.checkpoints.meta import read_params
from core.model.args import checked_args
from core.errors import LlamaDeskError, one_line
from core.paths import data_dir

STATE_NAME = "library.json"
MODELS_DIR = "models"
PARTIAL_DIR = ".downloads"  # inside a models folder; hidden, so never scanned
PARTIAL_SUFFIXES = (".part", ".incomplete", ".tmp")

FAMILIES = ("Llama 2", "Llama 3", "Llama 3.1", "Llama 3.2", "Llama-compatible")
OTHER = FAMILIES[-1]

# Files an HF or Meta model folder is made of: delete() removes these and nothing else.
HF_FILES = re.compile(r"(config\.json|generation_config\.json|tokenizer(_config)?\.json|tokenizer\.model|"
                      r"special_tokens_map\.json|added_tokens\.json|vocab\.json|merges\.txt|"
                      r"model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json|"
                      r"pytorch_model(-\d+-of-\d+)?\.bin|pytorch_model\.bin\.index\.json|"
                      r"chat_template\.(json|jinja)|README\.md|LICENSE(\.txt)?|USE_POLICY\.md|"
                      r"\.gitattributes)")
_META_FILES = re.compile(r"(params\.json|consolidated\.\d+\.pth|tokenizer\.model|checklist\.chk|"
                         r"README\.md|LICENSE(\.txt)?|USE_POLICY\.md|eval\.json|MODEL_CARD\.md)")

# llama.cpp's quantization names as they appear in file names (Q4_K_M, IQ3_XS, Q8_0, F16, ...).
QUANT_RE = re.compile(r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[0-9KLMSX]+)*|TQ[12]_0|BF16|F16|F32|FP16|FP32)(?![A-Za-z0-9])",
                      re.IGNORECASE)


def quant_from_name(name: str) -> str | None:
    """The quantization a file name states (``llama-3.2-1b.Q4_K_M.gguf`` -> ``Q4_K_M``), or None."""
    found = QUANT_RE.findall(name)
    if not found:
        return None
    q = found[-1].upper()
    return {"FP16": "F16", "FP32": "F32"}.get(q, q)


@dataclass
class LibraryEntry:
    """One model on disk, as the library lists it.

    ``format`` is 'gguf', 'hf' or 'meta'; ``params`` and ``context_length`` are None when
    the header could not be read, and then ``error`` says why in one line.
    """
    path: Path
    name: str
    family: str
    params: int | None
    format: str
    quant: str | None
    context_length: int | None
    size_bytes: int
    last_used: float | None
    error: str | None
    source: str | None = None  # the Hub repository it was downloaded from, when known

    @property
    def location(self) -> Path:
        """The folder the model sits in (a model folder's parent, a file's folder)."""
        return Path(self.path).parent

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        d["location"] = str(self.location)
        return d


# --------------------------------------------------------------------------- where

def state_path() -> Path:
    return data_dir() / STATE_NAME


def default_models_folder() -> Path:
    """``models`` in the app's data folder: where downloads go unless the user chose another."""
    return data_dir() / MODELS_DIR


class LibraryState:
    """The library's small persistent state: last-used times, folders, download sources.

    Thread-safe; every change rewrites the file atomically (temp file + ``os.replace``).
    A damaged file is read as empty (it only holds conveniences) and replaced on the next change.
    """

    _lock = threading.Lock()  # one per process: the GUI, downloads and the CLI share the file

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else state_path()

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def update(self, change) -> dict[str, Any]:
        """Apply ``change(data)`` (mutating a dict) and write the result atomically."""
        with self._lock:
            data = self.read()
            change(data)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            return data

    # what each key holds
    def last_used(self) -> dict[str, float]:
        v = self.read().get("last_used")
        return {k: float(t) for k, t in v.items() if isinstance(t, (int, float))} if isinstance(v, dict) else {}

    def sources(self) -> dict[str, str]:
        v = self.read().get("sources")
        return {k: s for k, s in v.items() if isinstance(s, str)} if isinstance(v, dict) else {}

    def models_folder(self) -> Path:
        v = self.read().get("models_folder")
        return Path(v).expanduser() if isinstance(v, str) and v else default_models_folder()

    def extra_folders(self) -> list[Path]:
        v = self.read().get("extra_folders")
        return [Path(p).expanduser() for p in v if isinstance(p, str) and p] if isinstance(v, list) else []

    def folders(self) -> list[Path]:
        """The models folder first, then the extra folders (no duplicates)."""
        out: list[Path] = []
        for p in [self.models_folder(), *self.extra_folders()]:
            if p not in out:
                out.append(p)
        return out

    def set_models_folder(self, folder: str | Path | None) -> None:
        """Where downloads go (None: back to the default)."""
        self.update(lambda d: d.__setitem__("models_folder", str(Path(folder).expanduser()) if folder else None))

    def set_extra_folders(self, folders: Iterable[str | Path]) -> None:
        self.update(lambda d: d.__setitem__("extra_folders", [str(Path(p).expanduser()) for p in folders]))

    def record_source(self, path: str | Path, repo_id: str) -> None:
        self.update(lambda d: d.setdefault("sources", {}).__setitem__(path_key(path), repo_id))

    def forget(self, path: str | Path) -> None:
        def change(d):
            for k in ("last_used", "sources"):
                if isinstance(d.get(k), dict):
                    d[k].pop(path_key(path), None)
        self.update(change)


def path_key(path: str | Path) -> str:
    """How the state file names a model: its absolute, resolved path."""
    return str(Path(path).expanduser().resolve())



def library_folders(state: LibraryState | None = None) -> list[Path]:
    """The folders the library scans: the models folder and the extra folders the user added."""
    return (state or LibraryState()).folders()


def record_used(path: str | Path, *, state: LibraryState | None = None, when: float | None = None) -> None:
    """Remember that the model at ``path`` was just opened (persisted atomically)."""
    t = time.time() if when is None else when
    (state or LibraryState()).update(lambda d: d.setdefault("last_used", {}).__setitem__(path_key(path), t))


# --------------------------------------------------------------------------- names

# Names that say nothing about the model: the folders Meta and Hugging Face repositories use
# ("original", "hf"), converters' outputs ("ggml-model-Q4_K_M.gguf"), HF cache snapshots.
GENERIC_NAMES = frozenset({"hf", "meta", "original", "model", "models", "ggml-model", "weights", "weight",
                           "checkpoint", "checkpoints", "consolidated", "gguf", "safetensors", "pytorch", "snapshot",
                           "snapshots", "main", "latest", "final", "output", "export", "converted", "llama", ""})
_HF_CACHE_REPO = re.compile(r"models--(.+?)--(.+)")


def is_generic_name(name: str) -> bool:
    """Whether a file or folder name (a quantization suffix aside) could be any model's."""
    base = QUANT_RE.sub("", name).strip(" -_.").lower()
    return base in GENERIC_NAMES or bool(re.fullmatch(r"[0-9a-f]{40}", base))


def model_name(path: str | Path, source: str | None = None) -> str:
    """What the library calls a model: its file or folder name, unless that name is generic
    (``hf``, ``original``, ``model.gguf``); then the Hub repository it came from, the
    repository of an HF cache snapshot, or the parent folder when its name tells more."""
    p = Path(path)
    own = p.stem if p.suffix.lower() == ".gguf" else p.name
    if not is_generic_name(own):
        return own
    if source:
        return source
    for part in reversed(p.parts[:-1]):  # ~/.cache/huggingface/hub/models--org--name/snapshots/<hash>
        m = _HF_CACHE_REPO.fullmatch(part)
        if m:
            return f"{m.group(1)}/{m.group(2)}"
    # Llama-3.2-1B/original, Llama-3.2-1B/hf/, Tiny/model.gguf; no further up: above a
    # "models" folder is the app's data folder, which names no model.
    return own if is_generic_name(p.parent.name) else p.parent.name


# --------------------------------------------------------------------------- families

def family_of(*, vocab_size: int | None, rope_theta: float | None, scaling_factor: float | None,
              scaled: bool = False, dim: int | None = None, context_length: int | None = None) -> str:
    """Llama 2 / 3 / 3.1 / 3.2, or 'Llama-compatible', from the numbers every format carries.

    Llama 2: 32,000-token vocabulary, RoPE theta 10,000, 4,096 context. Llama 3.x: 128,256
    tokens and theta 500,000; 3.1 adds llama3 RoPE scaling with factor 8, 3.2 (1B/3B) with
    factor 32. Fine-tunes of these keep the numbers; anything else that loads is 'compatible'.
    """
    if vocab_size == 32000 and rope_theta is not None and abs(rope_theta - 10000) < 1 and not scaled \
            and context_length in (None, 4096):
        return "Llama 2"
    if vocab_size in (128256, 128000) and rope_theta is not None and abs(rope_theta - 500000) < 1:
        if scaled:
            if scaling_factor is not None:
                return "Llama 3.2" if scaling_factor >= 16 else "Llama 3.1"
            return "Llama 3.2" if dim in (2048, 3072) else "Llama 3.1"
        return "Llama 3"
    return OTHER


# --------------------------------------------------------------------------- readers

def _entry(path: Path, fmt: str, *, name: str, size: int, error: str | None = None, **kw) -> LibraryEntry:
    return LibraryEntry(path=path, name=name, family=kw.get("family", OTHER), params=kw.get("params"), format=fmt,
                        quant=kw.get("quant"), context_length=kw.get("context_length"), size_bytes=size,
                        last_used=None, error=error)


def read_gguf(path: Path) -> LibraryEntry:
    """A GGUF file's entry from its header alone (core.checkpoints.gguf_header): metadata and
    tensor shapes, by the loader's own rules; the weights are never read."""
    size = path.stat().st_size
    name = path.stem
    try:
        limits.check_regular(path)
        meta, tensors = read_header(path)
        args = header_args(meta, tensors, str(path))
    except LlamaDeskError as e:
        return _entry(path, "gguf", name=name, size=size, error=str(e), quant=quant_from_name(path.name))
    params = 0
    by_type: dict[str, int] = {}
    for n, kind, shape, nbytes in tensors:
        if n != ROPE_FREQS:
            params += math.prod(shape)
        by_type[kind] = by_type.get(kind, 0) + nbytes
    quant = None
    ft = meta.get("general.file_type")
    if isinstance(ft, int):
        try:
            quant = LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            quant = None
    if quant is None or quant == "GUESSED":  # the type holding most of the bytes names the file
        quant = max(by_type, key=by_type.get) if by_type else quant_from_name(path.name)
    # llama.cpp stores Llama 3.1/3.2's RoPE scaling as a rope_freqs tensor; the family then
    # follows the model's width (3.2 is 1B/3B), see family_of.
    scaled = any(n == ROPE_FREQS for n, *_ in tensors) or meta.get("llama.rope.scaling.type") == "llama3"
    factor = meta.get("llama.rope.scaling.factor")
    family = family_of(vocab_size=args.vocab_size, rope_theta=args.rope_theta, scaled=scaled,
                       scaling_factor=factor if isinstance(factor, (int, float)) else None,
                       dim=args.dim, context_length=args.max_seq_len)
    return _entry(path, "gguf", name=name, size=size, family=family, params=params, quant=quant,
                  context_length=args.max_seq_len)


def _folder_size(path: Path, owned: re.Pattern | None = None) -> int:
    total = 0
    for f in path.iterdir():
        try:
            if f.is_file() and (owned is None or owned.fullmatch(f.name)):
                total += f.stat().st_size
        except OSError:
            pass
    return total


def read_hf(path: Path) -> LibraryEntry:
    """A Hugging Face folder's entry from ``config.json``."""
    size = _folder_size(path, HF_FILES)
    cfg_file = path / "config.json"
    try:
        cfg = limits.read_json(cfg_file)
        if not isinstance(cfg, dict):
            raise LlamaDeskError(f"{cfg_file} is not a JSON object")
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if cfg.get("model_type", "llama") != "llama" and "LlamaForCausalLM" not in archs:
            raise LlamaDeskError(f"model type '{limits.brief(cfg.get('model_type'))}' is not a Llama model")
        args = args_from_config(cfg, file=str(cfg_file))
    except LlamaDeskError as e:
        return _entry(path, "hf", name=path.name, size=size, error=str(e))
    qc = cfg.get("quantization_config")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    quant = (str(qc.get("quant_method")) if isinstance(qc, dict) and qc.get("quant_method") else
             {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(str(dtype)))
    sc = args.rope_scaling
    family = family_of(vocab_size=args.vocab_size, rope_theta=args.rope_theta, scaled=bool(sc),
                       scaling_factor=sc.get("factor") if sc else None, dim=args.dim,
                       context_length=args.max_seq_len)
    return _entry(path, "hf", name=path.name, size=size, family=family, params=limits.param_count(args),
                  quant=quant, context_length=args.max_seq_len)


def _meta_vocab(path: Path) -> int | None:
    """A Meta folder's vocabulary size when params.json says -1: from tokenizer.model's kind."""
    tok = path / "tokenizer.model"
    try:
        with open(tok, "rb") as f:
            head = f.read(64)
            if re.fullmatch(rb"[A-Za-z0-9+/=]+ \d+\n.*", head, re.S):  # tiktoken ranks: one token a line
                f.seek(0)
                return sum(1 for _ in f) + 256  # Meta adds 256 special tokens
        return int(spm.SentencePieceProcessor(model_file=str(tok)).get_piece_size())
    except Exception:  # noqa: BLE001 — a missing or odd tokenizer only leaves the count unknown
        return None


def read_meta(path: Path) -> LibraryEntry:
    """A Meta folder's entry from ``params.json`` (and the tokenizer's size when it says -1)."""
    size = _folder_size(path, _META_FILES)
    try:
        params = read_params(path)
        vocab = params.get("vocab_size", -1)
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab <= 0:
            vocab = _meta_vocab(path) or 32000
        theta = params.get("rope_theta", 1e4)
        ctx = params.get("max_seq_len") or (131072 if params.get("use_scaled_rope") else
                                            8192 if isinstance(theta, (int, float)) and theta >= 5e5 else 4096)
        args = checked_args({**params, "vocab_size": vocab, "max_seq_len": ctx,
                                    "tie_word_embeddings": bool(params.get("tie_word_embeddings", False))},
                                   file=str(path / "params.json"))
    except LlamaDeskError as e:
        return _entry(path, "meta", name=path.name, size=size, error=str(e))
    scaled = bool(params.get("use_scaled_rope"))
    factor = params.get("rope_scaling_factor") if isinstance(params.get("rope_scaling_factor"), (int, float)) else None
    family = family_of(vocab_size=args.vocab_size, rope_theta=args.rope_theta, scaled=scaled, scaling_factor=factor,
                       dim=args.dim, context_length=None if "max_seq_len" not in params else ctx)
    return _entry(path, "meta", name=path.name, size=size, family=family, params=limits.param_count(args),
                  quant=None, context_length=args.max_seq_len)


def read_entry(path: str | Path) -> LibraryEntry:
    """The library entry for one model path (a .gguf file, an HF or a Meta folder), named
    by :func:`model_name` (without the download's source, which :func:`scan` adds)."""
    e = _read_entry(Path(path))
    e.name = model_name(e.path)
    return e


def _read_entry(p: Path) -> LibraryEntry:
    try:
        if p.is_file():
            return read_gguf(p)
        names = {c.name for c in p.iterdir()}
        if "params.json" in names and any(re.fullmatch(r"consolidated\.\d+\.pth", n) for n in names):
            return read_meta(p)
        return read_hf(p)
    except OSError as e:
        return _entry(p, "gguf" if p.suffix == ".gguf" else "hf", name=p.stem if p.is_file() else p.name,
                      size=0, error=f"cannot read it: {one_line(e)}")
    except Exception as e:  # noqa: BLE001 — one odd file must not end the scan
        return _entry(p, "gguf" if p.suffix == ".gguf" else "hf", name=p.stem if p.suffix == ".gguf" else p.name,
                      size=p.stat().st_size if p.is_file() else 0, error=f"cannot be read: {one_line(e)}")


def _skipped(name: str) -> bool:
    return name.startswith(".") or name.endswith(PARTIAL_SUFFIXES)


def _is_split_tail(name: str) -> bool:
    m = re.search(r"-(\d{5})-of-(\d{5})\.gguf$", name)
    return bool(m and int(m.group(1)) > 1)


def find_models(folder: Path, *, cancel: threading.Event | None = None, max_depth: int = 6) -> list[tuple[Path, str]]:
    """(path, kind) for every model under ``folder``: each .gguf file, each HF or Meta folder.

    Hidden entries (the downloads' ``.downloads`` folder) and partial files are skipped;
    symlinked folders are not followed (a link loop must not hang the scan).
    """
    found: list[tuple[Path, str]] = []
    top = len(folder.parts)
    for root, dirs, files in os.walk(folder, followlinks=False):
        if cancel is not None and cancel.is_set():
            break
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not _skipped(d)) if len(here.parts) - top < max_depth else []
        names = set(files)
        if "params.json" in names and any(re.fullmatch(r"consolidated\.\d+\.pth", n) for n in names):
            found.append((here, "meta"))
        elif "config.json" in names and any(n.endswith(".safetensors") or n == "model.safetensors.index.json"
                                            for n in names):
            found.append((here, "hf"))
        for n in sorted(files):
            if n.lower().endswith(".gguf") and not _skipped(n) and not _is_split_tail(n):
                found.append((here / n, "gguf"))
    return found


def scan(folders: Iterable[str | Path] | None = None, *, cancel: threading.Event | None = None,
         state: LibraryState | None = None) -> list[LibraryEntry]:
    """Every model in ``folders`` (default: the library's folders), read from headers only.

    Missing folders are skipped. Returns what was found so far when ``cancel`` is set.
    Entries are sorted by last use (most recent first), then by name.
    """
    st = state or LibraryState()
    used, sources = st.last_used(), st.sources()
    out: list[LibraryEntry] = []
    seen: set[str] = set()
    for folder in (st.folders() if folders is None else folders):
        folder = Path(folder).expanduser().absolute()
        if not folder.is_dir():
            continue
        for path, _kind in find_models(folder, cancel=cancel):
            if cancel is not None and cancel.is_set():
                return _sorted(out)
            key = path_key(path)
            if key in seen:
                continue
            seen.add(key)
            e = read_entry(path)
            e.last_used = used.get(key)
            e.source = sources.get(key)
            e.name = model_name(path, e.source)
            out.append(e)
    return _sorted(out)


def _sorted(entries: list[LibraryEntry]) -> list[LibraryEntry]:
    return sorted(entries, key=lambda e: (-(e.last_used or 0.0), e.name.lower(), str(e.path)))


def owned_files(entry: LibraryEntry) -> list[Path]:
    """The files deleting ``entry`` removes: the .gguf file, or a folder's model files only."""
    p = Path(entry.path)
    if entry.format == "gguf" and p.is_file():
        return [p]
    pattern = _META_FILES if entry.format == "meta" else HF_FILES
    return sorted(f for f in p.iterdir() if f.is_file() and pattern.fullmatch(f.name)) if p.is_dir() else []


def delete(entry: LibraryEntry, *, state: LibraryState | None = None) -> list[Path]:
    """Remove what ``entry`` owns (see :func:`owned_files`); a folder left empty goes too,
    anything else in it stays. Returns the files removed. Raises LlamaDeskError (one line)
    when a file cannot be removed."""
    removed = []
    for f in owned_files(entry):
        try:
            f.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise LlamaDeskError(f"could not delete {f}: {e.strerror or one_line(e)}") from None
        removed.append(f)
    st = state or LibraryState()
    p = Path(entry.path)
    for c in pack_cache.caches_of(p, st.path.parent / pack_cache.FOLDER):  # no use without its model
        pack_cache.remove(c.path)
        removed.append(c.path)
    folder = p if p.is_dir() else p.parent
    try:  # a library folder itself stays, even when empty
        if folder.is_dir() and not any(folder.iterdir()) and path_key(folder) not in {path_key(f) for f in st.folders()}:
            folder.rmdir()
    except OSError:
        pass
    st.forget(p)
    return removed


def human_size(n: int | None) -> str:
    """1.2 GB style (decimal units, as file managers and the Hub show sizes)."""
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_params(n: int | None) -> str:
    """8.0B / 260K style parameter counts."""
    if n is None:
        return "?"
    for unit, v in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= v:
            return f"{n / v:.1f}{unit}"
    return str(n)


__all__ = ["LibraryEntry", "LibraryState", "default_models_folder", "scan", "record_used", "delete", "read_entry",
           "family_of", "quant_from_name", "owned_files", "library_folders", "FAMILIES", "PARTIAL_DIR", "model_name",
           "is_generic_name", "path_key"]
