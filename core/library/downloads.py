"""Downloads from the Hub into the models folder: a queue with pause, resume and cancel.

Why not ``huggingface_hub.hf_hub_download``: it is one blocking call with no way to pause
or cancel it from another thread, reports progress only through tqdm, and keeps its
partial files in its own cache layout. The transfer here is a streamed GET with HTTP
``Range`` on ``huggingface_hub``'s own HTTP session (``get_session``: its proxies and
client settings), against the resolve URLs it builds (``hf_hub_url``), with the token
headers it builds (``build_hf_headers``), its error mapping (``hf_raise_for_status``) and
the checksums it reports (``HfApi.get_paths_info``: LFS sha256, or the git blob id of a
small file).

Where files are: ``{models}/.downloads/{job}/{path}.part`` while downloading (a hidden
folder the library's scanner skips), then ``{models}/{owner}/{name}/{path}`` once every
file of the job has been verified. A job's state lives in ``state_path`` (JSON, rewritten
atomically on every change) and its bytes in the partial files, so a restarted manager
resumes where the last one stopped, with a range request from the partial file's size.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import queue
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from huggingface_hub.utils import HFValidationError, get_session, hf_raise_for_status, validate_repo_id

from core.errors import DownloadError, HubError, LlamaDeskError, one_line
from core.library.checksums import StreamHasher, git_blob_sha1
from core.library.hub import hub_errors, transport_errors
from core.library.library import PARTIAL_DIR, LibraryState, human_size

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.1  # at most ten progress events a second per job
RETRIES = 5  # attempts after a dropped connection without progress in between
RETRY_WAIT_S = (0.2, 0.5, 1.0, 2.0, 4.0)
FREE_MARGIN = 64 << 20  # keep this much disk free beyond what the download needs
STATES = ("queued", "running", "paused", "done", "failed", "cancelled")


# ---------------------------------------------------------------------- events

@dataclass
class DownloadProgress:
    job_id: str
    file: str
    done_bytes: int  # of the whole job
    total_bytes: int
    speed_bps: float
    eta_s: float | None


@dataclass
class DownloadFinished:
    job_id: str
    path: Path  # the .gguf file, or the model folder


@dataclass
class DownloadFailed:
    job_id: str
    message: str
    kind: str  # 'auth', 'not_found', 'network', 'checksum', 'disk', 'hub'


@dataclass
class DownloadStateChanged:
    """A job was queued, started, paused or cancelled (finish and failure have their own events)."""
    job_id: str
    state: str


# ---------------------------------------------------------------------- jobs

@dataclass
class JobFile:
    path: str
    size: int | None = None
    sha256: str | None = None
    blob_id: str | None = None  # git blob sha1 (small, non-LFS files)


@dataclass
class Job:
    """One download: one or more files of a repository that land together."""
    job_id: str
    repo_id: str
    files: list[JobFile]
    state: str = "queued"
    done_bytes: int = 0
    total_bytes: int = 0
    path: str | None = None  # where it landed
    error: str | None = None
    kind: str | None = None
    created: float = field(default_factory=time.time)

    def snapshot(self) -> "Job":
        return Job(self.job_id, self.repo_id, [JobFile(**asdict(f)) for f in self.files], self.state,
                   self.done_bytes, self.total_bytes, self.path, self.error, self.kind, self.created)

    @property
    def name(self) -> str:
        return self.files[0].path if len(self.files) == 1 else self.repo_id


class _Stop(Exception):
    """The transfer was paused or cancelled."""


def _invalid(repo_id: str, names: list) -> str | None:
    """Why ``repo_id`` and ``names`` cannot be a job (they become paths under the models
    folder: no '..', no absolute paths), or None."""
    try:
        validate_repo_id(repo_id)
        ok = isinstance(repo_id, str) and repo_id.count("/") == 1
    except HFValidationError:
        ok = False
    if not ok:
        return f"'{repo_id}' is not a repository name (owner/name)"
    if not names or any(not isinstance(n, str) or not n or n.startswith("/") or "\\" in n or ".." in n.split("/")
                        for n in names):
        return f"nothing to download, or a file name outside the repository: {names!r}"
    return None


def _write(f, chunk: bytes) -> None:
    f.write(chunk)


class DownloadManager:
    """A download queue with its own worker thread (one transfer at a time: the network is
    the limit). ``on_event`` is called on that thread with the events above.

    Args:
        dest_folder: the library's models folder; files land in ``{owner}/{name}/`` there.
        state_path: the JSON file that remembers the queue across restarts.
        hub: a :class:`core.library.hub.HubClient` (endpoint and token).
        library_state: where the library records a download's source repository.
    """

    def __init__(self, dest_folder: str | Path, state_path: str | Path, *, hub, on_event: Callable[[object], None],
                 library_state: LibraryState | None = None, start: bool = True):
        self.dest = Path(dest_folder).expanduser()
        self.partials = self.dest / PARTIAL_DIR
        self.state_path = Path(state_path)
        self.hub = hub
        self.on_event = on_event
        self.library_state = library_state
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        self._stop_flags: dict[str, str] = {}  # job_id -> 'pause' | 'cancel' while running
        self._queue: "queue.Queue[str | None]" = queue.Queue()
        self._closed = False
        self._load()
        self._thread = threading.Thread(target=self._run, name="downloads", daemon=True)
        if start:
            self._thread.start()

    # ------------------------------------------------------------------ public API
    def enqueue(self, repo_id: str, filenames: list[str] | tuple[str, ...] | str) -> str:
        """Queue ``filenames`` of ``repo_id`` as one job (a .gguf file, or a safetensors
        folder's files); returns the job id. Sizes and checksums are asked when it starts."""
        names = [filenames] if isinstance(filenames, str) else list(filenames)
        problem = _invalid(repo_id, names)
        if problem:
            raise DownloadError(problem)
        job = Job(uuid.uuid4().hex[:12], repo_id, [JobFile(n) for n in names])
        with self._lock:
            if self._closed:
                raise DownloadError("the download manager has shut down")
            self._jobs[job.job_id] = job
            self._save()
        self._emit(DownloadStateChanged(job.job_id, "queued"))
        self._queue.put(job.job_id)
        return job.job_id

    def pause(self, job_id: str) -> None:
        """Stop transferring; the partial file stays for :meth:`resume`."""
        with self._lock:
            job = self._job(job_id)
            if job.state == "running":
                self._stop_flags[job_id] = "pause"
            elif job.state == "queued":
                job.state = "paused"
                self._save()
            else:
                return
        if job.state == "paused":
            self._emit(DownloadStateChanged(job_id, "paused"))

    def resume(self, job_id: str) -> None:
        """Queue a paused or failed job again; it continues from its partial files."""
        with self._lock:
            job = self._job(job_id)
            if job.state not in ("paused", "failed"):
                return
            job.state, job.error, job.kind = "queued", None, None
            self._stop_flags.pop(job_id, None)
            self._save()
        self._emit(DownloadStateChanged(job_id, "queued"))
        self._queue.put(job_id)

    def cancel(self, job_id: str) -> None:
        """Stop and forget a job; its partial files are deleted."""
        with self._lock:
            job = self._job(job_id)
            if job.state in ("done", "cancelled"):
                return
            if job.state == "running":
                self._stop_flags[job_id] = "cancel"
                return  # the worker cleans up and reports
            job.state = "cancelled"
            self._save()
        self._remove_partials(job_id)
        self._emit(DownloadStateChanged(job_id, "cancelled"))

    def jobs(self) -> list[Job]:
        """Every job (copies), oldest first."""
        with self._lock:
            return [j.snapshot() for j in sorted(self._jobs.values(), key=lambda j: j.created)]

    def clear_finished(self) -> None:
        """Forget done, failed and cancelled jobs (failed ones' partial files go too)."""
        with self._lock:
            gone = [j for j in self._jobs.values() if j.state in ("done", "failed", "cancelled")]
            for j in gone:
                del self._jobs[j.job_id]
            self._save()
        for j in gone:
            self._remove_partials(j.job_id)

    def set_hub(self, hub) -> None:
        """Use another client from now on (e.g. with a token after a 401); then resume()."""
        with self._lock:
            self.hub = hub

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Pause the running transfer (it resumes on the next start) and end the worker thread.
        Returns whether it ended within ``timeout``."""
        with self._lock:
            self._closed = True
            for j in self._jobs.values():
                if j.state == "running":
                    self._stop_flags[j.job_id] = "shutdown"
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ state
    def _job(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise DownloadError(f"no download with id {job_id}")
        return job

    def _load(self) -> None:
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
            items = data.get("jobs", []) if isinstance(data, dict) else []
        except FileNotFoundError:
            items = []
        except (OSError, ValueError, UnicodeDecodeError):
            items = []  # a damaged queue file: start empty (partials are cleaned below)
        for d in items:
            try:
                files = [JobFile(**f) for f in d.pop("files")]
                job = Job(files=files, **d)
            except (TypeError, KeyError, AttributeError):
                continue
            if job.state not in STATES or _invalid(job.repo_id, [f.path for f in job.files]):
                continue  # a queue file edited by hand must not write outside the models folder
            if job.state in ("running", "queued"):
                job.state = "queued"
                self._queue.put(job.job_id)
            self._jobs[job.job_id] = job
        for job in self._jobs.values():
            job.done_bytes = self._have(job)
        # partial folders no job owns (a crash between cancel and cleanup) go now
        if self.partials.is_dir():
            for d in self.partials.iterdir():
                if d.is_dir() and (d.name not in self._jobs or self._jobs[d.name].state in ("done", "cancelled")):
                    shutil.rmtree(d, ignore_errors=True)

    def _save(self) -> None:
        with self._lock:
            data = {"version": 1, "jobs": [asdict(j) for j in self._jobs.values() if j.state != "cancelled"]}
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_name(f".{self.state_path.name}.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)

    def _emit(self, event: object) -> None:
        try:
            self.on_event(event)
        except Exception:  # noqa: BLE001 — a listener's bug must not kill the downloads
            log.exception("download event listener failed")

    def _partial(self, job_id: str, path: str) -> Path:
        return self.partials / job_id / (path + ".part")

    def _have(self, job: Job) -> int:
        total = 0
        for f in job.files:
            try:
                total += self._partial(job.job_id, f.path).stat().st_size
            except OSError:
                pass
        return total

    def _remove_partials(self, job_id: str) -> None:
        shutil.rmtree(self.partials / job_id, ignore_errors=True)

    def final_folder(self, repo_id: str) -> Path:
        return self.dest.joinpath(*repo_id.split("/"))

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        while True:
            job_id = self._queue.get()
            if job_id is None:
                return
            with self._lock:
                job = self._jobs.get(job_id)
                if job is None or job.state != "queued" or self._closed:
                    continue
                job.state = "running"
                self._stop_flags.pop(job_id, None)
                self._save()
            self._emit(DownloadStateChanged(job_id, "running"))
            try:
                self._download(job)
            except _Stop:
                self._stopped(job)
            except HubError as e:
                self._failed(job, str(e), getattr(e, "kind", "hub"))
            except OSError as e:
                kind = "disk" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "hub"
                msg = (f"the disk is full: {job.name} was not saved ({self.dest})" if kind == "disk"
                       else f"cannot write the download: {one_line(e)}")
                self._failed(job, msg, kind, drop_partials=kind == "disk")
            except LlamaDeskError as e:
                self._failed(job, str(e), "hub")
            except Exception as e:  # noqa: BLE001 — reported, never a dead worker thread
                self._failed(job, f"the download failed: {one_line(e)}", "hub")

    def _stopped(self, job: Job) -> None:
        with self._lock:
            why = self._stop_flags.pop(job.job_id, "pause")
            job.state = "cancelled" if why == "cancel" else "paused" if why == "pause" else "queued"
            self._save()
        if why == "cancel":
            self._remove_partials(job.job_id)
        if why != "shutdown":
            self._emit(DownloadStateChanged(job.job_id, job.state))

    def _failed(self, job: Job, message: str, kind: str, *, drop_partials: bool | None = None) -> None:
        # A checksum mismatch, a full disk or a vanished repository cannot resume: drop the
        # bytes. A network drop or a 401 keeps them for resume().
        if drop_partials is None:
            drop_partials = kind in ("checksum", "not_found", "disk")
        if drop_partials:
            self._remove_partials(job.job_id)
        with self._lock:
            job.state, job.error, job.kind = "failed", message, kind
            job.done_bytes = self._have(job)
            self._stop_flags.pop(job.job_id, None)
            self._save()
        self._emit(DownloadFailed(job.job_id, message, kind))

    def _check_stop(self, job: Job) -> None:
        if job.job_id in self._stop_flags:
            raise _Stop

    def _download(self, job: Job) -> None:
        hub = self.hub
        info = hub.paths_info(job.repo_id, [f.path for f in job.files])
        for f in job.files:
            got = info.get(f.path)
            if got is None:
                raise DownloadError(f"{f.path} is not (any more) in {job.repo_id}", kind="not_found")
            lfs = getattr(got, "lfs", None)
            new = (int(got.size), lfs.sha256 if lfs else None, None if lfs else got.blob_id)
            if f.size is not None and (f.size, f.sha256, f.blob_id) != new:
                # the file changed on the Hub since the partial was started: start it over
                self._partial(job.job_id, f.path).unlink(missing_ok=True)
            f.size, f.sha256, f.blob_id = new
        with self._lock:
            job.total_bytes = sum(f.size or 0 for f in job.files)
            job.done_bytes = self._have(job)
            self._save()
        need = job.total_bytes - job.done_bytes
        (self.partials / job.job_id).mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.partials).free
        if need + FREE_MARGIN > free:
            raise DownloadError(f"not enough disk space for {job.name}: it needs {human_size(need)} more, "
                                f"{human_size(free)} is free on {self.dest}", kind="disk")
        meter = _Meter(job, self)
        for f in job.files:
            digest = self._fetch(job, f, hub, meter)
            self._verify(job, f, digest)
        self._land(job)

    def _fetch(self, job: Job, f: JobFile, hub, meter: "_Meter") -> str | None:
        """Transfer one file into its partial file, resuming with a Range request from what
        is there; a dropped connection is retried (with waits) until it stops progressing.
        Returns the file's sha256 when the Hub gave one (hashed on a second thread while
        the bytes arrive: sha256 runs at a few hundred MB/s, as fast as the transfer)."""
        hasher = StreamHasher() if f.sha256 else None
        try:
            self._transfer(job, f, hub, meter, hasher)
            return hasher.hexdigest() if hasher else None
        finally:
            if hasher:
                hasher.close()

    def _transfer(self, job: Job, f: JobFile, hub, meter: "_Meter", hasher: StreamHasher | None) -> None:


        part = self._partial(job.job_id, f.path)
        part.parent.mkdir(parents=True, exist_ok=True)
        url = hub.file_url(job.repo_id, f.path)
        failures = 0
        while True:
            have = part.stat().st_size if part.exists() else 0
            if have > (f.size or 0):
                part.unlink()
                have = 0
            if hasher and hasher.fed != have:
                hasher.restart(part, have, lambda: self._check_stop(job))
            if have == f.size:
                return
            self._check_stop(job)
            headers = {**hub.headers(), "Accept-Encoding": "identity"}
            if have:
                headers["Range"] = f"bytes={have}-"
            progressed = False
            try:
                with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=30.0) as r:
                    if r.status_code >= 400:
                        r.read()
                        self._raise_http(job, f, r)
                    if have and r.status_code != 206:  # the server ignored the range: start over
                        have = 0
                        if hasher:
                            hasher.restart(part, 0, lambda: None)
                    with open(part, "r+b" if have else "wb") as out:
                        out.seek(have)
                        out.truncate()
                        for chunk in r.iter_bytes():  # as received: a drop loses nothing buffered
                            _write(out, chunk)
                            if hasher:
                                hasher.feed(chunk)
                            progressed = True
                            meter.add(f.path, len(chunk))
                            self._check_stop(job)
                if part.stat().st_size < (f.size or 0):
                    raise ConnectionResetError("the connection closed before the file ended")
                return
            except (*transport_errors(), ConnectionError) as e:
                failures = 0 if progressed else failures + 1
                if failures > RETRIES:
                    raise DownloadError(f"the connection to the Hub keeps failing ({one_line(e, 120)}): "
                                        f"{job.name} stopped at {human_size(self._have(job))} of "
                                        f"{human_size(job.total_bytes)}; resume it when the network is back",
                                        kind="network") from None
                meter.reset_speed()
                self._sleep(job, RETRY_WAIT_S[failures - 1] if failures else 0.05)

    def _sleep(self, job: Job, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._check_stop(job)
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def _raise_http(self, job: Job, f: JobFile, r) -> None:
        """A 4xx/5xx from the resolve URL as the hub's typed error (huggingface_hub reads
        the X-Error-Code header: GatedRepo, RepoNotFound, EntryNotFound)."""


        with hub_errors(job.repo_id, token_given=self.hub.has_token, what=f.path):
            hf_raise_for_status(r)
        raise HubError(f"the Hub answered HTTP {r.status_code} for {f.path}")

    def _verify(self, job: Job, f: JobFile, digest: str | None) -> None:
        part = self._partial(job.job_id, f.path)
        if f.sha256:
            got, want = digest or "", f.sha256
        elif f.blob_id:
            got, want = git_blob_sha1(part), f.blob_id
        else:
            return
        if got != want:
            raise DownloadError(f"{f.path} from {job.repo_id} does not match the Hub's checksum (got {got[:12]}…, "
                                f"expected {want[:12]}…): the download was damaged and has been deleted; "
                                "nothing was added to the library", kind="checksum")

    def _land(self, job: Job) -> None:
        """Move the verified files into the library, config.json last (the scanner looks for it)."""
        folder = self.final_folder(job.repo_id)
        order = sorted(job.files, key=lambda f: os.path.basename(f.path) == "config.json")
        for f in order:
            target = folder / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._partial(job.job_id, f.path), target)
        self._remove_partials(job.job_id)
        if len(job.files) == 1 and job.files[0].path.lower().endswith(".gguf"):
            landed = folder / job.files[0].path
        else:
            landed = (folder / job.files[0].path).parent
            if os.path.basename(job.files[0].path) != job.files[0].path:
                common = os.path.commonpath([f.path for f in job.files])
                landed = folder / common if common else folder
        try:
            (self.library_state or LibraryState()).record_source(landed, job.repo_id)
        except OSError:
            pass  # only a convenience
        with self._lock:
            job.state, job.path, job.done_bytes = "done", str(landed), job.total_bytes
            self._save()
        self._emit(DownloadFinished(job.job_id, landed))


class _Meter:
    """Progress events for one job: bytes, speed (over the last few seconds) and time left."""

    def __init__(self, job: Job, mgr: DownloadManager):
        self.job, self.mgr = job, mgr
        self.done = mgr._have(job)
        self.reset_speed()

    def reset_speed(self) -> None:
        self.samples: list[tuple[float, int]] = [(time.monotonic(), self.done)]
        self.last_emit = 0.0

    def add(self, file: str, n: int) -> None:
        self.done += n
        now = time.monotonic()
        self.samples.append((now, self.done))
        while len(self.samples) > 2 and now - self.samples[0][0] > 3.0:
            self.samples.pop(0)
        with self.mgr._lock:
            self.job.done_bytes = self.done
        if now - self.last_emit < PROGRESS_EVERY_S and self.done < self.job.total_bytes:
            return
        self.last_emit = now
        t0, d0 = self.samples[0]
        speed = (self.done - d0) / (now - t0) if now > t0 else 0.0
        left = self.job.total_bytes - self.done
        eta = left / speed if speed > 0 else None
        self.mgr._emit(DownloadProgress(self.job.job_id, file, self.done, self.job.total_bytes, speed, eta))


__all__ = ["DownloadManager", "DownloadProgress", "DownloadFinished", "DownloadFailed", "DownloadStateChanged",
           "Job", "JobFile"]
