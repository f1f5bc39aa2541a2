"""``python -m core pull`` and ``python -m core models``: the model library from the command line."""
from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from pathlib import Path

from core.cli.common import write_stdout
from core.errors import DownloadError, HubError, SettingsError, plain_text
from core.library.downloads import DownloadFailed, DownloadFinished, DownloadManager, DownloadProgress
from core.library.hub import HubClient, free_memory
from core.library.library import LibraryState, human_params, human_size, scan
from core.paths import check_folder, data_dir


def _pick(client, repo: str, args):
    """The HubFile the arguments ask for (or the recommended one), with why."""
    files = client.repo_files(repo)
    if not files:
        raise HubError(f"{repo} has no GGUF file or safetensors folder this app can load")
    names = ", ".join(f.path or "(safetensors folder)" for f in files)
    if args.file is not None:
        want = args.file.strip("/")
        hit = [f for f in files if f.path == want or f.path.rsplit("/", 1)[-1] == want
               or (want in ("", ".") and f.kind == "hf-folder")]
        if not hit:
            raise SettingsError(f"{repo} has no loadable file '{args.file}' (it has: {names})")
        return hit[0], "asked for"
    if args.quant is not None:
        hit = [f for f in files if (f.quant or "").upper() == args.quant.upper()]
        if not hit:
            quants = sorted({f.quant for f in files if f.quant})
            raise SettingsError(f"{repo} has no {args.quant.upper()} file (it has: {', '.join(quants) or names})")
        return min(hit, key=lambda f: f.size), "asked for"
    if len(files) == 1:
        return files[0], "the only loadable file"
    ram, vram = free_memory()
    pick = client.recommend(files, context_length=args.context, free_ram=ram, free_vram=vram)
    if pick is None:
        raise SettingsError(f"none of {repo}'s files fits in this machine's free memory at context {args.context}; "
                            f"name one with --file (it has: {names})")
    return pick, "recommended for this machine"


class _Progress:
    """One progress line on stderr: redrawn in place on a terminal, every 10% otherwise."""

    def __init__(self, name: str):
        self.name, self.tty = name, sys.stderr.isatty()
        self.last_step = -1

    def __call__(self, ev) -> None:
        frac = ev.done_bytes / ev.total_bytes if ev.total_bytes else 0.0
        eta = f", {_duration(ev.eta_s)} left" if ev.eta_s is not None else ""
        line = (f"{self.name}: {frac:4.0%} {human_size(ev.done_bytes)} / {human_size(ev.total_bytes)}, "
                f"{human_size(int(ev.speed_bps))}/s{eta}")
        if self.tty:
            print("\r" + line.ljust(78), end="", file=sys.stderr, flush=True)
        elif int(frac * 10) > self.last_step:
            self.last_step = int(frac * 10)
            print(line, file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.tty:
            print(file=sys.stderr, flush=True)


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600} h {s % 3600 // 60} min" if s >= 3600 else f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def cmd_pull(args) -> int:
    repo = args.repo.strip().strip("/")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise SettingsError(f"'{args.repo}' is not a repository name: use owner/name")
    if args.context < 1:
        raise SettingsError(f"--context must be at least 1, got {args.context}")
    check_folder(data_dir())  # where the pull's state goes, said before the Hub is asked
    client = HubClient(args.endpoint, args.token or None)
    file, why = _pick(client, repo, args)
    dest = Path(args.dest).expanduser() if args.dest else LibraryState().models_folder()
    # One queue file per pull: running the same command again resumes it, and pulls of other
    # models (or the app's own queue) are not dragged along.
    key = hashlib.sha1(json.dumps([client.endpoint, repo, list(file.files)]).encode()).hexdigest()[:16]
    state = data_dir() / "pulls" / f"{key}.json"
    pull = _Pull(f"{repo}: {file.path or '(safetensors folder)'} ({human_size(file.size)}, {why}) -> {dest}",
                 _Progress(file.name))
    t0 = time.monotonic()
    mgr = DownloadManager(dest, state, hub=client, on_event=pull.on_event)
    try:
        pull.start(mgr, repo, list(file.files))
        while not pull.done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pull.progress.end()
        mgr.shutdown()
        print("error: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    pull.progress.end()
    mgr.shutdown()
    ev = pull.result
    if isinstance(ev, DownloadFailed):
        raise DownloadError(ev.message, kind=ev.kind)
    seconds = time.monotonic() - t0
    try:
        state.unlink()
    except OSError:
        pass
    if args.json:
        print(json.dumps({"path": str(ev.path), "repo": repo, "files": list(file.files), "bytes": file.size,
                          "seconds": round(seconds, 3), "speed_bps": round(file.size / seconds) if seconds else None}))
    else:
        print(ev.path)
    return 0


class _Pull:
    """One pull's download, followed from the download manager's thread: the line that
    announces it (said once bytes flow, so a refusal stays one line), progress, the end."""

    def __init__(self, announce: str, progress: _Progress):
        self.announce, self.progress = announce, progress
        self.announced = False
        self.done = threading.Event()
        self.result: DownloadFinished | DownloadFailed | None = None

    def start(self, mgr: DownloadManager, repo: str, files: list[str]) -> None:
        """Resume this pull's earlier job if one is queued, paused or failed, else queue it."""
        for j in mgr.jobs():
            if j.repo_id != repo or [f.path for f in j.files] != files:
                continue
            if j.state in ("paused", "failed"):
                mgr.resume(j.job_id)
            if j.state in ("paused", "failed", "queued", "running"):
                self.announce += f" (resuming: {human_size(j.done_bytes)} already here)"
                return
        mgr.enqueue(repo, files)

    def on_event(self, ev) -> None:
        if isinstance(ev, DownloadProgress):
            if self.progress.last_step < 0 and not self.announced:
                self.announced = True
                print(self.announce, file=sys.stderr, flush=True)
            self.progress(ev)
        elif isinstance(ev, (DownloadFinished, DownloadFailed)):
            self.result = ev
            self.done.set()


def cmd_models(args) -> int:
    check_folder(data_dir())
    st = LibraryState()
    folders = st.folders() + [Path(f).expanduser() for f in args.folder]
    for f in args.folder:
        if not Path(f).expanduser().is_dir():
            raise SettingsError(f"--folder {f}: no such folder")
    entries = scan(folders, state=st)
    if args.json:
        write_stdout(json.dumps([e.to_json() for e in entries], ensure_ascii=False) + "\n")
        return 0
    if not entries:
        print(f"no models in {', '.join(str(f) for f in folders)}; get one with: python -m core pull OWNER/NAME",
              file=sys.stderr)
        return 0
    rows = [("NAME", "FAMILY", "PARAMS", "FORMAT", "QUANT", "CONTEXT", "SIZE", "LAST USED", "PATH")]
    for e in entries:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used)) if e.last_used else "-"
        rows.append((e.name, e.family if not e.error else "unreadable", human_params(e.params), e.format,
                     e.quant or "-", str(e.context_length or "-"), human_size(e.size_bytes), used, str(e.path)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    write_stdout("".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] + "\n" for r in rows))
    for e in entries:
        if e.error:
            where = "" if str(e.path) in e.error else f"{plain_text(str(e.path))}: "
            print(f"warning: {where}{e.error}", file=sys.stderr)
    return 0

