"""Download throughput of the model library against plain curl, from one local server.

    python bench/bench_download.py [--mb 200] [--rounds 3]

Serves a generated random file (default 200 MB) from the tests' fake Hub (tests/hubserver.py)
on loopback and fetches it, interleaved, with: ``curl -o FILE`` (the peer), core.library.downloads'
DownloadManager (transfer, sha256 verification against the Hub's checksum, move into the
library: what a user waits for), curl followed by sha256sum (the same work by hand) and
huggingface_hub's hf_hub_download (local_dir, which hashes too) for reference.
Prints each one's median MB/s and the ratio to curl measured in the same run. The app should
not be the bottleneck: the ratio should be near 1.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REPO = "bench/big-GGUF"
NAME = "big.gguf"
SERVE = f"""
import sys, threading
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tests.hubserver import FakeHub, HubRepo
repo = HubRepo({REPO!r}, tags=["gguf", "llama"])
repo.add({NAME!r}, source=Path(sys.argv[2]))
hub = FakeHub([repo]).start()
print(hub.url, flush=True)
threading.Event().wait()
"""


def _curl(work: Path, url: str) -> float:
    out = work / "curl.bin"
    t = time.perf_counter()
    subprocess.run(["curl", "-s", "-f", "-o", str(out), url], check=True)
    dt = time.perf_counter() - t
    out.unlink()
    return dt


def _curl_sha(work: Path, url: str) -> float:  # what verifying by hand costs: curl, then sha256sum
    out = work / "curl.bin"
    t = time.perf_counter()
    subprocess.run(["curl", "-s", "-f", "-o", str(out), url], check=True)
    subprocess.run(["sha256sum", str(out)], check=True, stdout=subprocess.DEVNULL)
    dt = time.perf_counter() - t
    out.unlink()
    return dt


def _app(work: Path, endpoint: str) -> float:
    from core.library.downloads import DownloadFailed, DownloadFinished, DownloadManager
    from core.library.hub import HubClient
    from core.library.library import LibraryState

    dest = work / "models"
    done = threading.Event()
    got = {}

    def on_event(ev):
        if isinstance(ev, (DownloadFinished, DownloadFailed)):
            got["ev"] = ev
            done.set()
    t = time.perf_counter()
    m = DownloadManager(dest, work / "state.json", hub=HubClient(endpoint), on_event=on_event,
                        library_state=LibraryState(work / "library.json"))
    m.enqueue(REPO, [NAME])
    done.wait()
    dt = time.perf_counter() - t
    m.shutdown()
    assert isinstance(got["ev"], DownloadFinished), got["ev"]
    shutil.rmtree(dest)
    (work / "state.json").unlink()
    return dt


def _hf(work: Path, endpoint: str) -> float:
    from huggingface_hub import hf_hub_download

    out = work / "hf"
    t = time.perf_counter()
    hf_hub_download(REPO, NAME, endpoint=endpoint, local_dir=out, token=False)
    dt = time.perf_counter() - t
    shutil.rmtree(out)
    return dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench_download_"))
    try:
        src = work / "src.bin"
        with open(src, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        size = src.stat().st_size
        # The server runs in its own process, as curl does: in this one it would share the GIL
        # with the downloader being measured.
        server = subprocess.Popen([sys.executable, "-c", SERVE, str(ROOT), str(src)], stdout=subprocess.PIPE,
                                  text=True)
        endpoint = server.stdout.readline().strip()
        url = f"{endpoint}/{REPO}/resolve/main/{NAME}"
        peers = {"curl": lambda: _curl(work, url), "curl + sha256sum": lambda: _curl_sha(work, url),
                 "app (DownloadManager)": lambda: _app(work, endpoint), "hf_hub_download": lambda: _hf(work, endpoint)}
        times: dict[str, list[float]] = {k: [] for k in peers}
        for fn in peers.values():  # warm-up, untimed: imports, first connections, page cache
            fn()
        for _ in range(args.rounds):
            for name, fn in peers.items():  # interleaved: the machine's load hits all alike
                times[name].append(fn())
        server.kill()
        server.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(times["curl"])
    print(f"{size / 1e6:.0f} MB from a local server, {args.rounds} interleaved rounds, medians "
          f"(load average {os.getloadavg()[0]:.1f})")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:24s} {size / med / 1e6:8.0f} MB/s  {med:6.2f} s  x{base / med:.2f} of curl's speed"
              f"  (runs: {', '.join(f'{t:.2f}' for t in ts)} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
