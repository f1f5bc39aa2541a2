"""Resource bombs under a memory limit: each is refused quickly with exit 2 and one line,
never a MemoryError or a climb to the limit (issue 12). Run as CLI subprocesses whose real
memory is bounded (see :func:`run_limited`)."""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests import forked
from tools.badseeds import write_gguf

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_DATA is Linux's")]
ROOT = Path(__file__).resolve().parents[2]
LIMIT = 3 << 30  # torch itself runs in this; every bomb below asks for far more
SAMPLE_S = 0.05


def run_limited(*argv):
    """``python -m core ARGV`` with its memory bounded the same way on every torch build, in
    a process forked from one that imported torch already (tests/forked.py): the bound and
    the sampling are :func:`run_bounded`'s; a fresh interpreter per bomb only added ~2.5 s."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        out, err = Path(d) / "out", Path(d) / "err"
        child = forked.start(forked.cli, list(argv), stdout=str(out), stderr=str(err), cwd=ROOT, data_limit=LIMIT)
        r = _bounded(_Forked(child), ["python", "-m", "core", *map(str, argv)], 120,
                     lambda: (out.read_text(), err.read_text()))
    return r, time.monotonic() - t0


def run_bounded(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``cmd`` with its real memory bounded by LIMIT.

    RLIMIT_AS counted address space, and a CUDA build of torch maps more than 3 GB of
    libraries before doing anything. RLIMIT_DATA counts only private writable memory (heap,
    anonymous mappings: what an allocation takes), so libraries do not count and an
    over-large allocation still fails at once. File pages mapped and read are not data: the
    child's resident set is sampled too, and past LIMIT the child is killed and the test
    fails."""
    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (LIMIT, LIMIT))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # no pipe to fill
        child = subprocess.Popen(cmd, cwd=ROOT, preexec_fn=limit, stdout=out, stderr=err, text=True)

        def read():
            out.seek(0), err.seek(0)
            return out.read(), err.read()
        return _bounded(child, cmd, timeout, read)


def _bounded(child, cmd: list[str], timeout: float, read) -> subprocess.CompletedProcess:
    """Watch ``child`` (poll/kill/wait/returncode/pid) to its end under LIMIT and ``timeout``;
    ``read()`` gives its (stdout, stderr) once it ended."""
    peak, late = _watch_rss(child, time.monotonic() + timeout)
    child.wait()
    r = subprocess.CompletedProcess(cmd, child.returncode, *read())
    if late:
        raise subprocess.TimeoutExpired(cmd, timeout, r.stdout, r.stderr)
    assert peak <= LIMIT, f"resident memory reached {peak >> 20} MiB (bound {LIMIT >> 20} MiB): {r.stderr[-1000:]}"
    return r


class _Forked:
    """A forked child (tests/forked.py) seen as a subprocess.Popen by :func:`_bounded`."""

    def __init__(self, proc):
        self.proc, self.pid = proc, proc.pid

    def poll(self):
        return self.proc.exitcode

    def kill(self):
        self.proc.kill()

    def wait(self):
        self.proc.join()

    @property
    def returncode(self):
        return self.proc.exitcode


def _watch_rss(child: subprocess.Popen, deadline: float) -> tuple[int, bool]:
    """(the child's peak resident set, whether it ran past ``deadline``), sampled until it
    ends; killed past LIMIT or the deadline."""
    proc, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        late = time.monotonic() > deadline
        if peak > LIMIT or late:
            child.kill()
            return peak, late
        time.sleep(SAMPLE_S)
    return peak, False


def test_the_bound_counts_allocations_not_mapped_files(tmp_path):
    """What RLIMIT_AS got wrong on a CUDA build: mapping more than LIMIT of library files
    (here a sparse file) is fine; allocating more than LIMIT is refused at once."""
    big = tmp_path / "libbig.so"
    with open(big, "wb") as fh:
        fh.truncate(LIMIT + (1 << 30))
    mapped = run_bounded([sys.executable, "-c", "import mmap, sys; f = open(sys.argv[1], 'rb'); "
                          "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); print(len(m))", str(big)])
    assert mapped.returncode == 0 and int(mapped.stdout) > LIMIT, mapped.stderr
    alloc = run_bounded([sys.executable, "-c", f"b = bytearray({LIMIT + (1 << 30)})"])
    assert alloc.returncode != 0 and "MemoryError" in alloc.stderr
    # The same bound holds in a child forked from the preloaded server (what run_limited runs).
    child = forked.start(bytearray, LIMIT + (1 << 30), stdout=str(tmp_path / "out"), stderr=str(tmp_path / "err"),
                         cwd=ROOT, data_limit=LIMIT)
    child.join(120)
    assert child.exitcode == 1 and "MemoryError" in (tmp_path / "err").read_text()


def refused(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]


def test_config_bombs(seeds, clone):
    cases = [("meta", "params.json", {"n_layers": 10**9}, "n_layers"),
             ("meta", "params.json", {"dim": 8192, "n_layers": 1000, "n_heads": 64, "vocab_size": 4_000_000}, "needs"),
             ("hf", "config.json", {"max_position_embeddings": 10**12}, "max_position_embeddings"),
             ("hf", "config.json", {"hidden_size": 65536, "num_hidden_layers": 512, "intermediate_size": 1 << 20,
                                    "num_attention_heads": 512, "num_key_value_heads": 512, "head_dim": 128}, "needs"),
             ("hf", "config.json", {"max_position_embeddings": 1 << 24, "num_hidden_layers": 1000}, "missing tensor")]
    for kind, file, change, word in cases:
        d = clone(seeds[kind])
        data = json.loads((d / file).read_text())
        data.update(change)
        (d / file).write_text(json.dumps(data))
        r, dt = run_limited("info", d, "--device", "cpu")
        refused(r, word)


def test_gguf_block_count_bomb(seeds, tmp_path):
    f = tmp_path / "bomb.gguf"
    write_gguf(seeds["gguf"], f, set_kv={"llama.block_count": 10**9})
    r, _ = run_limited("info", f, "--device", "cpu")
    refused(r, "block_count")


def test_file_bombs(seeds, clone, tmp_path):
    d = clone(seeds["hf"])
    (d / "config.json").write_text("[" * 10**6 + "]" * 10**6)
    r, _ = run_limited("info", d, "--device", "cpu")
    refused(r, "nested")
    d = clone(seeds["meta"])
    (d / "params.json").unlink()
    os.symlink("/dev/zero", d / "params.json")
    r, _ = run_limited("info", d, "--device", "cpu")
    refused(r, "device")
    big = tmp_path / "sparse.gguf"
    with open(big, "wb") as fh:
        fh.write(b"GGUF" + (3).to_bytes(4, "little") + (2**60).to_bytes(8, "little") * 2)
        fh.truncate(6 << 30)  # 6 GB, none of it stored: only the magic may be read
    r, _ = run_limited("tokenize", big, "--text", "x")
    refused(r)
    r, _ = run_limited("info", big, "--device", "cpu")
    refused(r)


def test_generation_request_bomb(seeds):
    # 2**40 new tokens on a 2048-token model: bounded by the context, not allocated up front.
    r, _ = run_limited("generate", seeds["gguf"], "--prompt", "x", "--device", "cpu", "--max-new-tokens",
                       str(2**40), "--stop", "a", "--seed", "1")
    assert r.returncode == 0, r.stderr[-1000:]
