"""Compile ``csrc/*.c`` into one shared library, once per machine, and load it.

The library lands in the data folder's ``kernels/`` under a name keyed by everything that
changes the machine code: the sources, the flags, the compiler's version, this CPU's flag
set and the OpenMP runtime it links. It is written under a temporary name and renamed, so a
half-built library is never loaded and two processes building at once both end with a good
one. OpenMP comes from torch's own ``libgomp`` where torch ships one (PyPI's Linux wheels):
torch and the kernels then share one runtime and one thread count (``torch.set_num_threads``
governs both) instead of two pools spinning against each other on a few cores. Elsewhere
the compiler's own ``-fopenmp``, else no OpenMP (one thread).

Whatever fails (no compiler, a compile error, a load error, ``LLAMADESK_KERNELS=0``) leaves
:func:`library` None and :func:`reason` one line saying why: models then take the torch
path they took before. The build runs once per process, lazily, on the thread that loads a
model (never the UI thread); a cancelled load kills the compiler and leaves nothing behind.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from core.paths import data_dir

ENV = "LLAMADESK_KERNELS"
#: a folder for the built libraries other than the data folder's (the test suite shares one
#: across its sessions: a library's name is its key, so sharing is safe)
DIR_ENV = "LLAMADESK_KERNELS_DIR"
#: must equal LD_ABI_VERSION in csrc/common.h
ABI = 1
CSRC = Path(__file__).resolve().parent / "csrc"
FOLDER = "kernels"
#: ISO C (so no silent FMA contraction: every path rounds where the source says), no
#: fast-math: the kernels' results are defined operation by operation.
FLAGS = ("-std=c11", "-O3", "-fPIC", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall")
#: seconds a compile may take before it counts as failed
TIMEOUT = 120


@dataclass(frozen=True)
class Built:
    """A build's outcome: the library file, or None and the reason."""
    path: Path | None
    reason: str | None = None


def compiler() -> str | None:
    """``$CC``, else ``cc``, else ``gcc`` (a full path, or None when there is none)."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and (found := shutil.which(name)):
            return found
    return None


def torch_gomp() -> Path | None:
    """torch's own OpenMP runtime (``torch/lib/libgomp*.so*``), where its wheel ships one."""
    lib = Path(torch.__file__).resolve().parent / "lib"
    found = sorted(lib.glob("libgomp*.so*"))
    return found[0] if found else None


def cpu_flags() -> str:
    """What this CPU can run, as the OS reports it (part of the library's key)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def arch_flags(march: str | None) -> list[str]:
    """``-march=<march>`` on x86-64 (``native``: every instruction this CPU has); other
    machines build for their baseline."""
    if march and platform.machine().lower() in ("x86_64", "amd64"):
        return [f"-march={march}"]
    return []


def default_folder() -> Path:
    """``$LLAMADESK_KERNELS_DIR``, else the data folder's ``kernels/``."""
    named = os.environ.get(DIR_ENV, "").strip()
    return Path(named).expanduser() if named else data_dir() / FOLDER


def library_name(sources: list[Path], flags: list[str], version: str, gomp: str) -> str:
    h = hashlib.sha256()
    for p in sources:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    for part in (*flags, version, cpu_flags(), gomp, str(ABI)):
        h.update(part.encode() + b"\0")
    suffix = ".dll" if os.name == "nt" else ".dylib" if platform.system() == "Darwin" else ".so"
    return f"ld-kernels-{h.hexdigest()[:20]}{suffix}"


def build(folder: Path | None = None, *, march: str | None = "native", cc: str | None = None,
          tick: Callable[[], None] | None = None) -> Built:
    """Compile every ``csrc/*.c`` into ``folder`` (default: ``$LLAMADESK_KERNELS_DIR``, else
    the data folder's ``kernels/``)
    unless a library of the same key is there already. ``tick`` is called every ~50 ms while
    the compiler runs; what it raises kills the compiler and propagates."""
    cc = cc or compiler()
    if cc is None:
        return Built(None, "no C compiler (set CC, or install gcc or clang)")
    try:
        r = _run([cc, "--version"], tick)
        version = r.stdout.splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.SubprocessError) as e:
        return Built(None, f"the C compiler {cc} does not run: {_first_line(e)}")
    if version is None:
        return Built(None, f"the C compiler {cc} does not run (exit {r.returncode} on --version)")
    sources = sorted(CSRC.glob("*.c"))
    gomp = torch_gomp()
    flags = [*FLAGS, *arch_flags(march)]
    folder = folder or default_folder()
    # the headers too: a change to an inline helper or a declaration changes the machine code
    final = folder / library_name([*sources, *sorted(CSRC.glob("*.h"))], [cc, *flags], version, str(gomp))
    if final.is_file():
        return Built(final)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return Built(None, f"cannot create {folder}: {_first_line(e)}")
    with tempfile.TemporaryDirectory(prefix=".build-", dir=folder) as tmp:
        err = None
        for openmp in ("torch", "system", None) if gomp else ("system", None):
            err = _compile(cc, flags, sources, Path(tmp), openmp, gomp, tick)
            if err is None:
                os.replace(Path(tmp) / "lib", final)  # atomic: a reader sees all of it or nothing
                return Built(final)
        return Built(None, f"the kernels do not compile with {cc}: {err}")


def _compile(cc: str, flags: list[str], sources: list[Path], tmp: Path, openmp: str | None,
             gomp: Path | None, tick) -> str | None:
    """Compile and link into ``tmp/lib``; None when it worked, else the compiler's first error
    line. ``openmp``: 'torch' (link torch's libgomp), 'system' (-fopenmp), None (none)."""
    omp = ["-fopenmp"] if openmp else []
    objs = [tmp / f"{p.stem}.o" for p in sources]
    try:
        for src, obj in zip(sources, objs):
            r = _run([cc, *flags, *omp, f"-I{CSRC}", "-c", str(src), "-o", str(obj)], tick)
            if r.returncode:
                return _first_error(r.stderr)
        link = [cc, "-shared", *[str(o) for o in objs], "-o", str(tmp / "lib")]
        if openmp == "torch":
            link += [str(gomp), f"-Wl,-rpath,{gomp.parent}", "-pthread"]
        elif openmp == "system":
            link += ["-fopenmp"]
        r = _run(link, tick)
        return _first_error(r.stderr) if r.returncode else None
    except (OSError, subprocess.SubprocessError) as e:
        return _first_line(e)


def _run(cmd: list[str], tick) -> subprocess.CompletedProcess:
    """Run ``cmd`` (text output), calling ``tick`` while it runs; kill it if tick raises."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL) as p:
        waited = 0.0
        try:
            while True:
                try:
                    out, err = p.communicate(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    waited += 0.05
                    if waited > TIMEOUT:
                        raise
                    if tick is not None:
                        tick()
        except BaseException:
            p.kill()
            p.wait()
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["failed without a message"])[0][:300]


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


def load(path: Path) -> ctypes.CDLL:
    """Load a built library and check it speaks this ABI (OSError otherwise)."""
    lib = ctypes.CDLL(str(path))
    lib.ld_abi_version.restype = ctypes.c_int
    got = lib.ld_abi_version()
    if got != ABI:
        raise OSError(f"{path.name} has ABI {got}, this code needs {ABI}")
    lib.ld_isa.restype = ctypes.c_char_p
    lib.ld_max_threads.restype = ctypes.c_int
    return lib


class _State:
    lock = threading.Lock()
    done = False
    lib: ctypes.CDLL | None = None
    path: Path | None = None
    reason: str | None = None


def library(tick: Callable[[], None] | None = None) -> ctypes.CDLL | None:
    """This process's kernels, built or found on the first call (None: see :func:`reason`).
    ``tick``: see :func:`build` (a cancelled first call leaves the next one to build)."""
    if os.environ.get(ENV, "").strip() == "0":
        return None
    with _State.lock:
        if not _State.done:
            built = build(tick=tick)
            lib, why = None, built.reason
            if built.path is not None:
                try:
                    lib = load(built.path)
                except (OSError, AttributeError) as e:
                    why = f"the kernels do not load: {_first_line(e)}"
            _State.lib, _State.path, _State.reason, _State.done = lib, built.path, why, True
        return _State.lib


def unavailable() -> bool:
    """Whether this process will have no kernels, known without building them: turned off,
    a build that failed, or no C compiler."""
    if os.environ.get(ENV, "").strip() == "0":
        return True
    if _State.done:
        return _State.lib is None
    return compiler() is None


def reason() -> str | None:
    """Why there are no kernels (None when they are on, or not yet tried)."""
    if os.environ.get(ENV, "").strip() == "0":
        return f"turned off ({ENV}=0)"
    return _State.reason


def describe() -> str:
    """One line for Model Info / ``info``: the kernels' instruction set, or why there are none."""
    lib = library()
    if lib is None:
        return f"off: {reason()}"
    threads = lib.ld_max_threads()
    omp = "no OpenMP" if threads == 0 else "torch's OpenMP" if torch_gomp() else "OpenMP"
    return f"{lib.ld_isa().decode()} ({omp})"
