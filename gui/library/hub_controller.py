"""The Hub tab's controller: search, a repository's files and what fits here, the token and
the Hub's address, downloads. It holds no widget (tested without a window); the Hub tab's
view reads its signals and models.

Every hub call runs on the library's threads (:meth:`LibraryService.call`), one request at a
time: a new one replaces the one still running. A 401/403 asks for a token and keeps what
was refused, to run again once one is given.
"""
from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal
from shiboken6 import isValid

from core.errors import HubError
from core.library import hub as hub_lib
from core.library.library import human_size
from gui.library.hub_models import HubSearchModel, RepoFilesModel, access_text, date_text, explain

FORMATS = (("GGUF", ("gguf",)), ("safetensors", ("safetensors",)), ("GGUF or safetensors", ("gguf", "safetensors")))
SORTS = (("Most downloaded", "downloads"), ("Most liked", "likes"), ("Recently updated", "last_modified"))
DEFAULT_HUB = "https://huggingface.co"
DEFAULT_CONTEXT = 4096
RESULTS_PAGE, REPO_PAGE = 0, 1


@dataclass
class Estimates:
    """What fits here: free memory, an estimate per file, the ones that could not be estimated, the pick."""
    free_ram: int | None
    free_vram: int | None
    fits: dict = field(default_factory=dict)      # file path -> FitEstimate
    failed: dict = field(default_factory=dict)    # file path -> why there is no estimate
    pick: object = None                           # the recommended HubFile (or path), None when none fits

    @property
    def pick_path(self) -> str | None:
        return getattr(self.pick, "path", self.pick)


def estimate(hub, files: list, context_length: int) -> Estimates:
    """The memory each file needs at ``context_length`` against this machine's free memory
    (blocking: it reads file headers from the Hub). One odd file leaves only its own estimate out."""
    ram, vram = hub_lib.free_memory()
    out = Estimates(ram, vram)
    for f in files:
        try:
            out.fits[f.path] = hub.fit(f, context_length=context_length, free_ram=ram, free_vram=vram)
        except HubError as e:
            if getattr(e, "kind", "") in ("auth", "network"):
                raise
            out.failed[f.path] = str(e)
    out.pick = hub.recommend([f for f in files if f.path in out.fits], context_length=context_length,
                             free_ram=ram, free_vram=vram, estimates=out.fits)
    return out


def machine_text(est: Estimates) -> str:
    ram, vram = est.free_ram, est.free_vram
    return (f"This machine: {human_size(ram) if ram else '?'} RAM free"
            + (f", {human_size(vram)} GPU memory free" if vram is not None else ", no GPU")
            + " · estimate = weights as loaded + KV cache at the context below")


def estimates_text(files: list, est: Estimates) -> str:
    n_fit = sum(1 for e in est.fits.values() if e.fits)
    pick_name = next((f.name for f in files if f.path == est.pick_path), est.pick_path)
    return (f"{n_fit} of {len(files)} fit this machine"
            + (f"; recommended: {pick_name}" if est.pick is not None else "; none fits")
            + (f"; {len(est.failed)} cannot be estimated" if est.failed else ""))


def repo_details(repo) -> str:
    """The repository page's line under the title (empty for a bare repo id)."""
    if not hasattr(repo, "license"):
        return ""
    return (f"License: {repo.license or 'not stated'} · {access_text(repo.gated)} · "
            f"{repo.downloads or 0:,} downloads · {repo.likes or 0:,} likes · updated {date_text(repo.last_modified)}")


class HubController(QObject):
    """The Hub tab without its widgets, over a :class:`~gui.library.service.LibraryService`.

    ``results`` (:class:`HubSearchModel`) and ``files`` (:class:`RepoFilesModel`) are what a view shows.

    Signals:
        busyChanged(bool): a hub request started or ended.
        noticeChanged(str): the one-line notice for errors and empty results ('' hides it).
        retryOffered(bool): the Hub could not be reached: offer Retry (False: hide it).
        authChanged(str): the Hub wants a (another) token, in these words ('' hides the token panel).
        pageChanged(int): show RESULTS_PAGE or REPO_PAGE.
        repoChanged(str, str): the repository page's title and details.
        filesChanged(): the files model was filled again.
        filesStatusChanged(str): the line under the files.
        machineChanged(str): this machine's free memory, in words.
        recommended(str): the path of the file recommended (to select).
        resultsShown(int): a search's results are in (how many).
        downloadStarted(str): a download was queued (its job id).
    """

    busyChanged = Signal(bool)
    noticeChanged = Signal(str)
    retryOffered = Signal(bool)
    authChanged = Signal(str)
    pageChanged = Signal(int)
    repoChanged = Signal(str, str)
    filesChanged = Signal()
    filesStatusChanged = Signal(str)
    machineChanged = Signal(str)
    recommended = Signal(str)
    resultsShown = Signal(int)
    downloadStarted = Signal(str)

    def __init__(self, service, parent: QObject | None = None):
        super().__init__(parent)
        self.service = service
        self.results = HubSearchModel(self)
        self.files = RepoFilesModel(self)
        self.repo = None  # the RepoSummary (or repo id) on the repository page
        self.free_ram: int | None = None
        self.free_vram: int | None = None
        self.task: asyncio.Task | None = None  # the one hub request (None: none ever ran)
        self.retry = None  # what to run again once a token is given
        self.network_retry = None  # what Retry runs again after the Hub could not be reached
        self.context_length = DEFAULT_CONTEXT  # tokens of KV cache the estimates count

    # -- the one request ---------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()

    def _run(self, job) -> asyncio.Task:
        """Run ``job()`` (a coroutine function) as the one hub request: it replaces the one still running."""
        if self.busy:
            self.task.cancel()
        self.task = asyncio.ensure_future(self._guarded(job))
        self.busyChanged.emit(True)  # now, not when the task first runs: a click shows at once
        return self.task

    async def _guarded(self, job) -> None:
        try:
            await job()
        finally:
            # Only the request still current says the hub is idle: one replaced (cancelled)
            # by a newer request ends after that one began, and must not re-enable Search.
            if isValid(self) and self.task is asyncio.current_task():  # the window may be gone
                self.busyChanged.emit(False)

    def close_down(self) -> None:
        """The window is closing: drop the running request (its thread's answer is ignored)."""
        if self.busy:
            self.task.cancel()

    def show_error(self, err: Exception, retry=None) -> str:
        """Say what went wrong: the token panel for 401/403 (keeping ``retry``), the notice otherwise."""
        kind, text = explain(err, token_given=self.service.has_token(), endpoint=self.service.endpoint())
        if kind in ("auth", "forbidden"):
            self.retry = retry
            self.noticeChanged.emit("")
            self.authChanged.emit(text)
        else:
            self.noticeChanged.emit(text)
            if kind == "network" and retry is not None:
                self.network_retry = retry
                self.retryOffered.emit(True)
        return kind

    def retry_now(self) -> asyncio.Task | None:
        """Run again what failed for want of a network (Retry)."""
        retry, self.network_retry = self.network_retry, None
        self.retryOffered.emit(False)
        return retry() if retry is not None else None

    def _clear_errors(self) -> None:
        self.noticeChanged.emit("")
        self.authChanged.emit("")
        self.network_retry = None
        self.retryOffered.emit(False)

    def set_context_length(self, tokens: int) -> None:
        """The context length the next estimates count KV cache for."""
        self.context_length = int(tokens)

    # -- the token and the address -----------------------------------------------------------
    def use_token(self, token: str) -> asyncio.Task | None:
        """Use ``token`` from now on (this session) and run again what the Hub refused."""
        self.service.set_token(token)
        retry, self.retry = self.retry, None
        self.authChanged.emit("")
        return retry() if retry is not None else None

    def forget_token(self) -> None:
        self.service.set_token(None)

    def endpoint(self) -> str | None:
        """The Hub's address set here (None: HF_ENDPOINT or the default)."""
        return self.service.endpoint()

    def address_text(self) -> str:
        """The Hub's address in use: the setting, HF_ENDPOINT, or the default."""
        return self.service.endpoint() or os.environ.get("HF_ENDPOINT") or DEFAULT_HUB

    def token_text(self) -> str | None:
        """Where the token comes from when none was typed here (None: one was typed here)."""
        if self.service.token:
            return None
        return "HF_TOKEN or huggingface_hub's login" if self.service.has_token() else "none"

    def set_endpoint(self, url: str) -> bool:
        """Use ``url`` as the Hub (saved in the settings; '' = the default); False (and the
        notice says why) for a text that is no web address."""
        url = url.strip().rstrip("/")
        if url and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            self.noticeChanged.emit(f"“{url}” is not a web address (it starts with https:// or http://).")
            return False
        self.service.set_endpoint(url or None)
        return True

    # -- search ------------------------------------------------------------------------------
    def search(self, query: str, formats, sort) -> asyncio.Task:
        """Search the Hub (results replace the table)."""
        return self._run(lambda: self._search(query, formats, sort))

    async def _search(self, query: str, formats, sort) -> None:
        self._clear_errors()
        self.pageChanged.emit(RESULTS_PAGE)
        try:
            hub = self.service.hub()
            repos = await self.service.call(hub.search, query, formats=formats, sort=sort, limit=50)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # every hub failure is shown, never raised into Qt
            # The rows shown answered another query (or the tab's first listing): kept under
            # this failure's notice they would read as its results.
            self.results.set_repos([])
            self.show_error(e, retry=lambda: self.search(query, formats, sort))
            return
        self.results.set_repos(repos)
        if not repos:
            self.noticeChanged.emit(f"No Llama-family repository on the Hub matches “{query}” in "
                                    f"{' or '.join(formats)} format.")
        self.resultsShown.emit(len(repos))

    # -- a repository ------------------------------------------------------------------------
    def open_repo(self, repo) -> asyncio.Task | None:
        """Show a repository's page (a RepoSummary or a repo id) and load its files."""
        if repo is None:
            return None
        if isinstance(repo, str):  # a name: its search result, when shown, has the details
            repo = next((r for r in self.results.repos if r.repo_id == repo), repo)
        self.repo = repo
        self.repoChanged.emit(self.repo_id, repo_details(repo))
        self.files.set_files([])
        self.filesChanged.emit()
        self.filesStatusChanged.emit("Loading the file list…")
        self.pageChanged.emit(REPO_PAGE)
        return self._run(lambda: self._load_repo(self.repo_id))

    @property
    def repo_id(self) -> str | None:
        return getattr(self.repo, "repo_id", self.repo)

    async def _load_repo(self, repo_id: str) -> None:
        self._clear_errors()
        try:
            hub = self.service.hub()
            files = await self.service.call(hub.repo_files, repo_id)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.filesStatusChanged.emit("")
            self.show_error(e, retry=lambda: self.open_repo(self.repo))
            return
        self.files.set_files(files)
        self.filesChanged.emit()
        if not files:
            self.filesStatusChanged.emit("No file here that LlamaDesk can load (GGUF, or a safetensors Llama model).")
            return
        await self._fit(files)

    def refit(self) -> asyncio.Task | None:
        """Estimate again for the context length now set."""
        if self.files.files:
            return self._run(lambda: self._fit(self.files.files))
        return None

    async def _fit(self, files: list) -> None:
        try:
            est = await self.service.call(estimate, self.service.hub(), files, self.context_length)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.show_error(e, retry=self.refit)
            return
        self.free_ram, self.free_vram = est.free_ram, est.free_vram
        self.machineChanged.emit(machine_text(est))
        self.files.set_files(files, est.fits, est.pick_path, est.failed)
        self.filesChanged.emit()
        self.filesStatusChanged.emit(estimates_text(files, est))
        if est.pick is not None:
            self.recommended.emit(est.pick_path)

    # -- downloads ---------------------------------------------------------------------------
    def download(self, files: list) -> str | None:
        """Queue ``files`` of the repository shown for download; returns the job id."""
        if not files or self.repo is None:
            return None
        try:
            job = self.service.enqueue(self.repo_id, files)
        except Exception as e:  # e.g. not enough disk space: said here, nothing queued
            self.show_error(e)
            return None
        self.filesStatusChanged.emit(f"Queued {len(files)} file(s) from {self.repo_id}: see Downloads")
        self.downloadStarted.emit(str(job))
        return job
