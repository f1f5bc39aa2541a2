"""A reproducible corpus of broken and hostile inputs, and a runner that feeds them to the CLI.

    python tools/badinputs.py --out /tmp/bad [--seed 0] [--limit N] [--list]

Every input is generated here from one valid seed model (the shared fixture
stories260K.gguf, also written as a Meta and a Hugging Face folder): wrong values in
every header field, byte flips and truncations of every file, special files (FIFOs,
devices, sockets, folders), JSON and GGUF bombs, NaN weights, re-typed and misaligned
tensors, duplicate keys, extreme sampler settings and invalid UTF-8 arguments. Nothing
is committed but this code: the same seed gives the same corpus.

Each input runs ``python -m core`` in a process forked from one that has already imported
torch (a fresh interpreter per input would take hours), with a 30 s limit, and the
runner reports per category:

- traceback: a Python traceback on stderr, an exit status other than 0 or 2, or a crash;
- hang: still running after 30 s (killed);
- peak: a peak RSS above 1 GB (the inputs' real data are all under 10 MB);
- silent: an input that must be refused was accepted, or a setting that must behave as
  its limit (a tiny temperature as greedy) gave other output.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import signal
import stat
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout: test that checkout's core
    sys.path.insert(0, str(ROOT))
# After the path fix: run as a script, tools/ is not importable as a package before it.
from tools.badcases import Case, generate  # noqa: E402

HANG_S = 30.0
PEAK_BYTES = 1 << 30


# --------------------------------------------------------------------------- the runner

@dataclass
class Result:
    case: Case
    rc: int | None
    seconds: float
    peak_bytes: int
    stdout: str
    stderr: str
    verdicts: list[str] = field(default_factory=list)


def _run_forked(case: Case, tmp: Path) -> Result:
    out_f, err_f = tmp / "out", tmp / "err"
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: run the CLI and leave without cleanup handlers
        try:
            os.setpgid(0, 0)
            fo = os.open(out_f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            fe = os.open(err_f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fo, 1)
            os.dup2(fe, 2)
            sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            from core.cli.main import main
            rc = main(list(case.argv))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc if isinstance(rc, int) else 0)
        except SystemExit as e:
            os._exit(e.code if isinstance(e.code, int) else 1)
        except BaseException:  # noqa: BLE001 — what escapes main is the finding
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(99)
    rc = None
    while True:
        done, status, ru = os.wait4(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() - t0 > HANG_S:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                os.kill(pid, signal.SIGKILL)
            _, status, ru = os.wait4(pid, 0)
            rc = None
            break
        time.sleep(0.005)
    read = lambda f: f.read_bytes().decode("utf-8", "replace") if f.exists() else ""  # noqa: E731
    return Result(case, rc, time.monotonic() - t0, ru.ru_maxrss * 1024, read(out_f), read(err_f))


def judge(r: Result, by_name: dict[str, Result]) -> list[str]:
    v = []
    if r.rc is None:
        v.append("hang")
    elif "Traceback (most recent call last)" in r.stderr or r.rc not in (0, 2):
        v.append("traceback")
    if r.peak_bytes > PEAK_BYTES:
        v.append("peak")
    err_lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    if r.rc == 2 and (len(err_lines) != 1 or "\x1b" in r.stderr):
        v.append("message")
    e = r.case.expect
    if r.rc is not None and "traceback" not in v:
        if e == "error" and r.rc == 0:
            v.append("silent")
        elif e == "ok" and r.rc != 0:
            v.append("refused-valid")
        elif e.startswith("same:"):
            ref = by_name.get(e[5:])
            if ref is None or r.rc != 0 or ref.stdout != r.stdout:
                v.append("silent")
    return v


def run(cases: list[Case], tmp: Path, *, progress=True) -> list[Result]:
    import torch  # noqa: F401 — imported once here, inherited by every forked child
    import core.cli.main  # noqa: F401
    import core.cli.compare, core.cli.convert, core.cli.generate, core.cli.info, core.cli.library  # noqa: F401,E401 — the commands load lazily
    import core.checkpoints.gguf, core.checkpoints.hf, core.checkpoints.meta  # noqa: F401,E401
    import gguf, safetensors, sentencepiece, tiktoken, tokenizers  # noqa: F401,E401
    torch.set_num_threads(1)
    tmp.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    by_name: dict[str, Result] = {}
    t0 = time.monotonic()
    for i, c in enumerate(cases):
        r = _run_forked(c, tmp)
        by_name[c.name] = r
        r.verdicts = judge(r, by_name)
        results.append(r)
        if progress and (i % 100 == 0 or r.verdicts):
            tag = ",".join(r.verdicts) or "ok"
            print(f"[{i + 1}/{len(cases)} {time.monotonic() - t0:.0f}s] {c.name}: rc={r.rc} {tag} "
                  f"{r.stderr.strip().splitlines()[-1][:160] if r.stderr.strip() else ''}", flush=True)
    return results


def report(results: list[Result]) -> dict:
    counts = Counter(v for r in results for v in r.verdicts)
    per_cat = defaultdict(Counter)
    for r in results:
        per_cat[r.case.category]["inputs"] += 1
        for v in r.verdicts:
            per_cat[r.case.category][v] += 1
    return {
        "inputs": len(results),
        "tracebacks": counts["traceback"], "hangs_over_30s": counts["hang"], "peaks_over_1GB": counts["peak"],
        "silently_wrong": counts["silent"], "valid_inputs_refused": counts["refused-valid"],
        "messages_not_one_clean_line": counts["message"],
        "max_peak_MB": round(max((r.peak_bytes for r in results), default=0) / 2**20),
        "max_seconds": round(max((r.seconds for r in results), default=0), 1),
        "refused_cleanly": sum(1 for r in results if r.rc == 2 and not r.verdicts),
        "loaded": sum(1 for r in results if r.rc == 0),
        "by_category": {k: dict(v) for k, v in sorted(per_cat.items())},
        "findings": [{"name": r.case.name, "verdicts": r.verdicts, "rc": r.rc,
                      "stderr": r.stderr.strip()[-400:]} for r in results if r.verdicts][:200],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the generated corpus (rewritten)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-file", type=int, default=110, help="byte mutations per seed file")
    ap.add_argument("--limit", type=int, default=0, help="run only every n-th case (0: all)")
    ap.add_argument("--list", action="store_true", help="generate and count, do not run")
    ap.add_argument("--json", type=Path, help="write the report here too")
    a = ap.parse_args(argv)
    cases = generate(a.out, seed=a.seed, per_file=a.per_file)
    digest = hashlib.sha256("\n".join(c.name for c in cases).encode()).hexdigest()[:12]
    print(f"{len(cases)} inputs (corpus {digest})", flush=True)
    if a.list:
        print(json.dumps(Counter(c.category for c in cases), indent=1))
        return 0
    if a.limit:
        cases = [c for i, c in enumerate(cases) if i % a.limit == 0 or c.name in ("cli-greedy",)]
    results = run(cases, a.out / "run")
    rep = report(results)
    text = json.dumps(rep, indent=1, ensure_ascii=False)
    print(text)
    if a.json:
        a.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
