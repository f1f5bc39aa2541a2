"""Child processes forked from one interpreter that has already imported torch and the CLI.

A test that needs a fresh process per trial (a memory bound, a SIGKILL) pays Python's and
torch's start-up in each one: about 2.5 s of CPU for ``python -m core``, most of a robustness
test's time. Here a multiprocessing fork server imports those modules once per test process
(it runs no torch op, so no thread pool exists yet to break in a fork); each trial is then a
fork of it (milliseconds) running the same code in a process of its own, with its own stdout,
stderr, environment, working folder and resource limits.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import resource
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from core.cli.main import main as cli_main

PRELOAD = ["torch", "core.cli.main", "core.history.store", "core.history.partial"]
_context = None


def context():
    """The fork-server context, its server preloading :data:`PRELOAD` (started on first use)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def start(target, *args, stdout, stderr, cwd, data_limit: int | None = None, env: dict | None = None):
    """Start ``target(*args)`` in a forked child; its return value is the exit status, as a
    script's ``raise SystemExit(main())``. ``stdout``/``stderr``: a file path, or the write
    end of a :func:`context`'s ``Pipe(duplex=False)``; ``data_limit``: RLIMIT_DATA in bytes.
    The child gets ``env``, by default this process's environment as it is now; it gets
    SIGTERM if the fork server ends (as it does with this process). Returns the Process."""
    proc = context().Process(target=_child, args=(target, args, stdout, stderr, str(cwd),
                                                  dict(os.environ if env is None else env), data_limit))
    proc.start()
    return proc


class Popen:
    """:func:`start`'s child with the face of a :class:`subprocess.Popen` (pid, poll, wait,
    send_signal, terminate, kill, returncode, and ``stderr`` when it is piped here)."""

    def __init__(self, target, *args, cwd, env: dict | None = None, pipe_stderr: bool = False):
        reader = writer = None
        if pipe_stderr:
            reader, writer = context().Pipe(duplex=False)
        self.process = start(target, *args, stdout=os.devnull, stderr=writer or os.devnull, cwd=cwd, env=env)
        self.pid = self.process.pid
        self.stderr = None
        if pipe_stderr:
            writer.close()
            self.stderr = os.fdopen(os.dup(reader.fileno()), encoding="utf-8", errors="replace")
            reader.close()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        return self.process.exitcode

    def send_signal(self, sig: int) -> None:
        if self.process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def cli(argv: list[str]) -> int:
    """``python -m core ARGV`` as a child's target (core/__main__.py does no more)."""
    return cli_main([str(a) for a in argv])


def script(path: str, argv: list[str]) -> int:
    """``python PATH ARGV`` as a child's target."""
    sys.argv = [path, *argv]
    sys.path.insert(0, str(Path(path).parent))
    runpy.run_path(path, run_name="__main__")
    return 0


def module(name: str, argv: list[str]) -> int:
    """``python -m NAME ARGV`` as a child's target."""
    sys.argv = [name, *argv]
    runpy.run_module(name, run_name="__main__", alter_sys=True)
    return 0


def run(target, *args, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """``target(*args)`` in a forked child, waited for: its exit status, stdout and stderr
    as :func:`subprocess.run` gives them (``args`` is the target's name and arguments)."""
    with tempfile.TemporaryDirectory() as d:
        out, err = Path(d) / "out", Path(d) / "err"
        proc = start(target, *args, stdout=str(out), stderr=str(err), cwd=cwd)
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired([target.__name__, *map(str, args)], timeout, out.read_text(),
                                            err.read_text())
        return subprocess.CompletedProcess([target.__name__, *map(str, args)], proc.exitcode, out.read_text(),
                                           err.read_text())


def _child(target, args, stdout, stderr, cwd, env, data_limit) -> None:
    if sys.platform == "linux":  # never outlive the run: the fork server ends with the test process
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, where in ((1, stdout), (2, stderr)):
        if isinstance(where, str):
            opened = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        else:
            os.dup2(where.fileno(), fd)
    if data_limit:
        resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))
    code = 1
    try:
        code = target(*args)
    except SystemExit as e:
        code = e.code
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    finally:
        if isinstance(code, str):
            print(code, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))
