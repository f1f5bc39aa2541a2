"""Limits checked before anything is allocated or read in full.

Every number a checkpoint header states is range-checked here before it sizes a tensor,
the memory a model and its KV cache will hold is computed from those numbers alone and
compared with what the machine (or the GPU) has free, and files are read only when they
are regular files, only up to a size limit, and JSON only up to a nesting depth.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from core.errors import CheckpointError, ResourceError

try:
    import resource
except ImportError:  # not on Windows: no address-space limit to read
    resource = None

MiB = 1 << 20
GiB = 1 << 30
MAX_CONFIG_BYTES = 4 * MiB  # params.json, config.json, generation_config.json, tokenizer_config.json
MAX_TOKENIZER_BYTES = 256 * MiB  # tokenizer.json / tokenizer.model / tiktoken ranks
MAX_JSON_DEPTH = 64  # real files nest under 10 levels
#: KV positions a freshly loaded model is budgeted for; longer conversations are checked
#: per request (:func:`check_request`), as the cache grows with them.
LOAD_KV_TOKENS = 2048

# Inclusive ranges for every model dimension; the largest Llama (405B) is far inside them.
INT_RANGES = {
    "dim": (1, 1 << 17), "n_layers": (1, 1024), "n_heads": (1, 4096), "n_kv_heads": (1, 4096),
    "head_dim": (2, 4096), "hidden_dim": (1, 1 << 20), "vocab_size": (1, 1 << 22),
    "max_seq_len": (1, 1 << 24), "multiple_of": (1, 1 << 20),
}
FLOAT_RANGES = {  # (low, high, low inclusive)
    "norm_eps": (0.0, 0.5, False), "rope_theta": (0.0, 1e12, False), "ffn_dim_multiplier": (0.0, 64.0, False),
}


# --------------------------------------------------------------------------- values

def check_int(value: Any, key: str, lo: int, hi: int, *, file: str | None = None, error=CheckpointError) -> int:
    """``value`` as an int in [lo, hi] (integral floats accepted), else ``error`` naming ``key``."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok and isinstance(value, float) and math.isfinite(value) and value == int(value):
        value, ok = int(value), True
    if not ok:
        raise _err(error, f"field '{key}' must be a whole number, got {_show(value)}", file)
    if not lo <= value <= hi:
        raise _err(error, f"field '{key}' = {value} is out of range ({lo} to {hi})", file)
    return value


def check_float(value: Any, key: str, lo: float, hi: float, *, lo_inclusive: bool = True,
                file: str | None = None, error=CheckpointError) -> float:
    """``value`` as a finite float in the range, else ``error`` naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _err(error, f"field '{key}' must be a number, got {_show(value)}", file)
    v = float(value)
    if not math.isfinite(v) or v > hi or v < lo or (v == lo and not lo_inclusive):
        side = "[" if lo_inclusive else "("
        raise _err(error, f"field '{key}' = {_show(value)} is out of range {side}{lo:g}, {hi:g}]", file)
    return v


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def brief(v: Any) -> str:
    """A value from a file, short enough to quote in a message."""
    text = str(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _err(error, message: str, file: str | None):
    return error(message, file=file) if error is CheckpointError else error(f"{message} in {file}" if file else message)


def _file_err(error, message: str, path: str):
    # the file itself is the subject: "PATH: file not found", not "file not found in PATH"
    return error(message, file=path) if error is CheckpointError else error(f"{path}: {message}")


def check_token_id(value: Any, key: str, vocab: int, *, file: str) -> int:
    """A token id stated by a file, inside the vocabulary."""
    return check_int(value, key, 0, max(vocab - 1, 0), file=file)


# --------------------------------------------------------------------------- memory

def param_count(args) -> int:
    """Parameters of the model ``args`` describes, from the numbers alone."""
    d, hd, f, v = args.dim, args.head_dim, args.hidden_dim, args.vocab_size
    attn = d * hd * (2 * args.n_heads + 2 * args.n_kv_heads)
    layer = attn + 3 * d * f + 2 * d
    return args.n_layers * layer + v * d * (1 if args.tie_word_embeddings else 2) + d


def kv_bytes(args, tokens: int, *, batch: int = 1, itemsize: int = 4) -> int:
    """Bytes of K and V for ``tokens`` positions of ``batch`` rows."""
    return 2 * args.n_layers * args.n_kv_heads * args.head_dim * tokens * batch * itemsize


def model_bytes(args, itemsize: int, *, kv_tokens: int | None = None, held: int | None = None) -> int:
    """Memory a loaded model holds: its weights (``held`` when the format keeps them packed)
    and a KV cache of ``kv_tokens`` positions (default: LOAD_KV_TOKENS or the context)."""
    weights = held if held is not None else param_count(args) * itemsize
    kv = kv_bytes(args, min(kv_tokens or LOAD_KV_TOKENS, args.max_seq_len), itemsize=itemsize)
    return weights + kv


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(key.encode() + b":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_free() -> int | None:
    try:
        top = Path("/sys/fs/cgroup")
        limit = (top / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((top / "memory.current").read_text()), 0)
    except (OSError, ValueError):
        return None


def _rlimit_free() -> int | None:
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (OSError, ValueError):
        pass
    return soft


def available_bytes(device=None) -> int | None:
    """Memory free for a new allocation on ``device``: the GPU's free memory, or on the CPU
    the least of MemAvailable, the cgroup's headroom and the address-space limit."""
    dev = str(getattr(device, "type", device) or "cpu")
    if dev == "cuda":
        # Asked through torch only when this process has imported it (every caller that sizes a
        # GPU load has: the worker, the Hub's fit estimate); importing it here would pull torch
        # into the torch-free readers above this module (tokenizers, headers, constraints).
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        try:
            return int(torch.cuda.mem_get_info()[0])
        except Exception:  # noqa: BLE001 — no driver answer: do not block the load on it
            return None
    cands = [_meminfo("MemAvailable"), _cgroup_free(), _rlimit_free()]
    if cands[0] is None:
        try:
            cands[0] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            pass
    known = [c for c in cands if c is not None]
    return min(known) if known else None


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def fits(needed: int, device=None, *, releasable: int = 0) -> bool:
    free = available_bytes(device)
    return free is None or needed <= free + releasable


def check_fits(needed: int, device=None, *, what: str, releasable: int = 0, advice: str = "") -> None:
    """Raise ResourceError saying how much ``what`` needs when it does not fit (and
    ``advice``, what the user can do about it)."""
    free = available_bytes(device)
    if free is None or needed <= free + releasable:
        return
    where = "GPU memory" if str(getattr(device, "type", device)) == "cuda" else "memory"
    raise ResourceError(f"{what} needs {human(needed)} of {where}, but only {human(free + releasable)} "
                        f"is available{': ' + advice if advice else ''}", needed=needed, available=free + releasable)


def check_request(args, tokens: int, *, rows: int = 1, itemsize: int, held: int = 0, device=None) -> None:
    """Refuse, with the figure, a request whose KV cache (``tokens`` positions x ``rows``)
    cannot fit: what it needs beyond the ``held`` bytes of cache already allocated (which
    it reuses) must be free on ``device``."""
    need = kv_bytes(args, tokens, batch=rows, itemsize=itemsize)
    if need > held:
        check_fits(need - held, device, what=f"a request of {tokens} tokens" + (f" x {rows} rows" if rows > 1 else "")
                   + " (the prompt and the most new tokens it may make, held in the KV cache)",
                   advice="ask for fewer new tokens" + (" or fewer lanes" if rows > 1 else ""))


# --------------------------------------------------------------------------- files

@contextlib.contextmanager
def opened_regular(path: str | Path, *, error=CheckpointError) -> Iterator[int]:
    """A read-only descriptor of ``path`` when it is a regular file (symlinks followed);
    FIFOs, devices and sockets are refused without blocking on them."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)

    def refuse_special(mode: int) -> None:
        if not stat.S_ISREG(mode):
            kind = ("a folder" if stat.S_ISDIR(mode) else "a pipe (FIFO)" if stat.S_ISFIFO(mode) else
                    "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "not a regular file")
            raise _file_err(error, f"refused to read {kind}: only regular files are opened", str(path))

    try:
        refuse_special(os.stat(path).st_mode)  # before open: opening a FIFO or socket has effects
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise _file_err(error, "file not found", str(path)) from None
    except OSError as e:
        raise _file_err(error, f"cannot open: {e.strerror or e}", str(path)) from None
    try:
        refuse_special(os.fstat(fd).st_mode)  # what was opened, should it have been swapped since
        yield fd
    finally:
        os.close(fd)


def check_regular(path: str | Path, *, error=CheckpointError) -> int:
    """Size of ``path`` after checking it is a regular file."""
    with opened_regular(path, error=error) as fd:
        return os.fstat(fd).st_size


def read_limited(path: str | Path, limit: int, *, error=CheckpointError) -> bytes:
    """The bytes of a regular file no larger than ``limit``."""
    with opened_regular(path, error=error) as fd:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _file_err(error, f"file is {human(size)}, more than the {human(limit)} allowed for it", str(path))
        chunks, got = [], 0
        while got <= limit:
            b = os.read(fd, min(limit + 1 - got, 1 << 24))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > limit:  # grew while read
            raise _file_err(error, f"file is more than the {human(limit)} allowed for it", str(path))
        return b"".join(chunks)


def read_head(path: str | Path, n: int, *, error=CheckpointError) -> bytes:
    """The first ``n`` bytes of a regular file (a magic-byte check reads nothing more)."""
    with opened_regular(path, error=error) as fd:
        return os.read(fd, n)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")


def json_depth(data: bytes) -> int:
    """Deepest nesting of ``data`` (JSON), counted outside strings, in C/numpy speed."""
    br = _JSON_STRING.sub(b"", data).translate(None, _BRACKETS)
    if not br:
        return 0
    a = np.frombuffer(br, dtype=np.uint8)
    steps = np.where((a == ord("[")) | (a == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def parse_json(data: bytes, *, file: str, error=CheckpointError, depth: int = MAX_JSON_DEPTH,
               object_pairs_hook=None) -> Any:
    """JSON from bytes with a nesting limit; errors name ``file``."""
    d = json_depth(data)
    if d > depth:
        raise _err(error, f"JSON nested {d} levels deep, more than the {depth} allowed", file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _err(error, f"not UTF-8 text (byte {e.start})", file) from None
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise _err(error, "JSON nested too deeply", file) from None
    except ValueError as e:
        raise _err(error, f"not valid JSON: {e}", file) from None


def read_json(path: str | Path, *, limit: int = MAX_CONFIG_BYTES, error=CheckpointError) -> Any:
    """A small JSON file: regular file, size and nesting bounded, errors naming the file."""
    return parse_json(read_limited(path, limit, error=error), file=str(path), error=error)


@contextlib.contextmanager
def native_path(path: str | Path) -> Iterator[str]:
    """A path string native libraries (torch, safetensors, tokenizers) can take.

    A name that is not valid UTF-8 (decoded by Python with surrogate escapes) cannot cross
    into C++ or Rust; on Linux it is then reached through /proc/self/fd while open here.
    """
    s = os.fspath(path)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        if not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd"):
            raise
        fd = os.open(s, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    yield s


def symlinks_in(paths) -> dict[str, str]:
    """{path: its real target} for each path that is (or lies under) a symbolic link."""
    out = {}
    for p in paths:
        p = Path(p)
        try:
            real = p.resolve()
        except (OSError, RuntimeError):
            continue
        if real != p.absolute():
            out[str(p)] = str(real)
    return out


# --------------------------------------------------------------------------- the load budget

# The loader's caller (the worker) decides, per thread of work, what happens before a build.
_before_build: contextvars.ContextVar = contextvars.ContextVar("llamadesk_before_build", default=None)


@contextlib.contextmanager
def before_build(fn) -> Iterator[None]:
    """Within this block, loaders call ``fn(needed_bytes, device)`` once a checkpoint's
    header, config and tokenizer have been validated and its memory need is known, and
    before any weight is built (the worker releases its current model there only when
    both would not fit)."""
    token = _before_build.set(fn)
    try:
        yield
    finally:
        _before_build.reset(token)


def check_model(args, dtype, device, *, source: str, held: int | None = None) -> int:
    """The load budget: the memory the model will hold (weights in ``dtype`` or ``held``
    bytes, plus a KV cache of LOAD_KV_TOKENS) must fit in what ``device`` has free.
    Returns the bytes needed; raises ResourceError naming them."""
    itemsize = getattr(dtype, "itemsize", 4)
    need = model_bytes(args, itemsize, held=held)
    hook = _before_build.get()
    if hook is not None:
        hook(need, device)
    n = param_count(args)
    check_fits(need, device, what=f"the model in {source} ({n / 1e9:.2f}B parameters"
               f"{'' if held is not None else f' at {itemsize} bytes each'} plus its KV cache)")
    return need


# --------------------------------------------------------------------------- documents

#: Largest file read as a document, checked by size before a byte is read (a 2 GB file is
#: refused at once); text formats are read streamed, these bound what is kept in memory.
MAX_TEXT_DOCUMENT_BYTES = 64 * MiB
MAX_PDF_BYTES = 256 * MiB
MAX_OFFICE_BYTES = 64 * MiB  # .docx (zip): also the most its parts may inflate to
MAX_HTML_BYTES = 32 * MiB
MAX_PDF_PAGES = 5000
#: Seconds one PDF may take to read (checked between pages): a bomb cannot hold indexing.
MAX_PDF_SECONDS = 120.0
#: Characters of text one document may yield (about 20 MB of text as UTF-8).
MAX_DOCUMENT_CHARS = 20_000_000
#: Files one collection scan visits (documents or not) before it stops and says so.
MAX_COLLECTION_FILES = 200_000
MAX_COLLECTION_DEPTH = 64  # folder levels below a collection's root
