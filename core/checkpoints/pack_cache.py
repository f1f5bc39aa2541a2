"""A cache of a GGUF file's packed int4 layers, memory-mapped on the next open.

Packing quantized blocks into the CPU kernels' layout is most of what opening a Q4_K_M
file costs (``torch._convert_weight_to_int4pack_for_cpu`` alone was ~37% of a load, the
block decoding most of the rest), and it is the same work every time. So the first CPU
open of a file writes its packed layers to ``<data folder>/packed/``, and later opens map
that file (``torch.load(mmap=True, weights_only=True)``): the layers' bytes are read from
the page cache on first use, like llama.cpp's mapping of the GGUF itself.

What keeps a cache honest:
- its name carries a key of the GGUF's identity (size, modification time, a hash of its
  first and last MiB), the torch version and this layout's version: another file, a
  rewritten file or another torch never finds it;
- each entry records the GGUF tensor's type and shape, checked against the file being
  opened, and every tensor's shape is checked again by the loader's usual checks;
- it is written to a temporary name and renamed into place once complete (fsync'd): a
  killed writer leaves a temporary that is never read, and is swept on the next write;
- a cache that cannot be read is deleted and the file is packed again.

The cache is written on a background thread once the model is built: the load returns (and
cancels) as before, and the first reply does not wait for a disk write of the whole model.
The thread only reads the packed tensors, which nothing writes once built.

``LLAMADESK_PACK_CACHE=0`` turns it off (the test suite does, except where it tests it).
A cache is skipped when the disk lacks room for it twice over.
"""
from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from core.model.quant import Int4Linear, cpu_layout
from core.paths import data_dir

ENV = "LLAMADESK_PACK_CACHE"
FOLDER = "packed"
SUFFIX = ".packed.pt"
LAYOUT_VERSION = 1  # bump when Int4Linear's packed layout or this file's entries change
SAMPLE = 1 << 20

log = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_folder() -> Path:
    return data_dir() / FOLDER


def source_key(path: Path) -> str:
    """Who the GGUF file is, cheaply: size, mtime, its first and last MiB, torch, layout
    (ours and the CPU packer's, which follows the capability torch runs with)."""
    st = path.stat()
    lay = getattr(cpu_layout(), "name", "unknown")
    h = hashlib.sha256(f"{st.st_size}|{st.st_mtime_ns}|{torch.__version__}|{LAYOUT_VERSION}|{lay}".encode())
    with open(path, "rb") as f:
        h.update(f.read(SAMPLE))
        f.seek(max(0, st.st_size - SAMPLE))
        h.update(f.read(SAMPLE))
    return h.hexdigest()[:20]


def cache_path(path: Path) -> Path:
    return cache_folder() / f"{path.stem[:60]}-{source_key(path)}{SUFFIX}"


@dataclass
class CachedFile:
    """One cache on disk, for the library's listing."""
    path: Path
    source: str  # the GGUF it was written for (as recorded; it may since have moved)
    bytes: int


def list_caches(folder: Path | None = None) -> list[CachedFile]:
    """The complete caches in ``folder`` (default: the data folder's), newest first."""
    folder = folder or cache_folder()
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True):
        source = ""
        try:
            source = (p.with_suffix(".source")).read_text(encoding="utf-8").strip()
        except OSError:
            pass
        out.append(CachedFile(p, source, p.stat().st_size))
    return out


def caches_of(gguf: Path, folder: Path | None = None) -> list[CachedFile]:
    """The caches written for the GGUF file at ``gguf`` (any version of it)."""
    want = str(Path(gguf).resolve())
    return [c for c in list_caches(folder) if c.source == want]


def remove(cache: Path) -> None:
    """Delete one cache (and its note of the source); a missing one is already gone."""
    for p in (cache, cache.with_suffix(".source")):
        p.unlink(missing_ok=True)


class PackCache:
    """The packed layers of one GGUF file: ``get`` those a complete cache holds, ``put``
    those packed now, ``commit`` writes a cache when anything was packed.

    A cache is all-or-nothing: one entry that does not match the file (type or shape) or
    cannot be read makes the whole cache stale, and it is removed."""

    def __init__(self, gguf: Path):
        self.gguf = Path(gguf).resolve()
        self.path = cache_path(self.gguf)
        self.entries: dict[str, dict] = {}
        # every packed layer of this load, from the cache or packed now: a cache is
        # rewritten whole, never as the part this load happened to pack
        self.layers: dict[str, tuple[str, tuple[int, int], Int4Linear]] = {}
        self.packed_now = 0
        if self.path.exists():
            try:
                self.entries = torch.load(self.path, mmap=True, weights_only=True)["layers"]
            except Exception as e:  # noqa: BLE001 — any unreadable cache is packed again
                log.warning("ignoring the unreadable packed cache %s: %s", self.path, e)
                self._drop()

    def get(self, name: str, kind: str, shape: tuple[int, int]) -> Int4Linear | None:
        e = self.entries.get(name)
        if e is None:
            return None
        if e.get("kind") != kind or tuple(e.get("shape", ())) != tuple(shape):
            log.warning("packed cache %s does not match %s; packing again", self.path, name)
            self._drop()
            return None
        n, k = shape
        layer = Int4Linear(e["packed"], e["scale_zeros"], k, n, int(e["planes"]), kind)
        self.layers[name] = (kind, tuple(shape), layer)
        return layer

    def put(self, name: str, kind: str, shape: tuple[int, int], layer: Int4Linear) -> None:
        self.layers[name] = (kind, tuple(shape), layer)
        self.packed_now += 1

    def commit(self, background: bool = True) -> threading.Thread | None:
        """Write the cache when this load packed anything (on a thread, see the module's
        docstring; :func:`flush` waits for it); None when there is nothing to write."""
        if not self.packed_now or not enabled():
            return None
        if not background:
            self.write()
            return None
        t = threading.Thread(target=self.write, name="pack-cache", daemon=True)
        with _WRITERS_LOCK:
            _WRITERS.append(t)
        t.start()
        return t

    def write(self) -> Path | None:
        """Write the cache now; None when it was not written (no room, not writable)."""
        layers = {name: {"kind": kind, "shape": list(shape), "planes": layer.planes,
                         "packed": layer.packed, "scale_zeros": layer.scale_zeros}
                  for name, (kind, shape, layer) in self.layers.items()}
        need = sum(v["packed"].nbytes + v["scale_zeros"].nbytes for v in layers.values())
        folder = self.path.parent
        # pid (for the sweep of dead writers) and thread: two loads of one file may both write
        tmp = folder / f".{self.path.name}.{os.getpid()}-{threading.get_ident()}.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if shutil.disk_usage(folder).free < 2 * need:
                log.info("not caching packed layers of %s: too little free disk", self.gguf)
                return None
            _sweep_temporaries(folder)
            with open(tmp, "wb") as f:
                torch.save({"version": LAYOUT_VERSION, "layers": layers}, f)
                f.flush()
                os.fsync(f.fileno())
            self.path.with_suffix(".source").write_text(str(self.gguf), encoding="utf-8")
            os.replace(tmp, self.path)
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as RuntimeError
            log.warning("could not write the packed cache %s: %s", self.path, e)
            tmp.unlink(missing_ok=True)
            return None
        return self.path

    def _drop(self) -> None:
        self.entries = {}
        remove(self.path)


_WRITERS: list[threading.Thread] = []
_WRITERS_LOCK = threading.Lock()


def flush(timeout: float | None = None) -> None:
    """Wait for the caches being written (tests, benchmarks, a CLI about to exit)."""
    with _WRITERS_LOCK:
        writers = list(_WRITERS)
        _WRITERS.clear()
    for t in writers:
        t.join(timeout)


# A command that loads and exits at once (generate, info) still leaves its cache behind.
atexit.register(flush)


def _sweep_temporaries(folder: Path) -> None:
    """Remove temporaries of writers that died (their pid is gone)."""
    for tmp in folder.glob(".*.tmp"):
        try:
            pid = int(tmp.name.rsplit(".", 2)[-2].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except (ValueError, PermissionError, OSError):
            continue


def for_load(gguf: Path, device: torch.device, keep_packed: bool) -> PackCache | None:
    """The cache to use for this open, or None (off, not a CPU load, nothing kept packed)."""
    if not (enabled() and keep_packed and device.type == "cpu"):
        return None
    try:
        return PackCache(gguf)
    except OSError:
        return None
