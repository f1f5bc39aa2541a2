"""Resource bombs under a memory limit: each is refused quickly with exit 2 and one line,
never a MemoryError or a climb to the limit (issue 12). Run as CLI subprocesses under
``resource.setrlimit(RLIMIT_AS)``."""
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.badinputs import write_gguf

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is Linux's")]
ROOT = Path(__file__).resolve().parents[2]
LIMIT = 3 << 30  # torch itself runs in this; every bomb below asks for far more


def run_limited(*argv):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "core", *map(str, argv)], cwd=ROOT, preexec_fn=limit,
                       capture_output=True, text=True, timeout=120)
    return r, time.monotonic() - t0


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
