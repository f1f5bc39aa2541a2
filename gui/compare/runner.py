"""Running a comparison, without widgets: which lanes run together, what is refused before
anything runs, the retry of a request whose draft models failed, and the lanes' results.

Lanes on one model run as one request (one prefill, one batch); each model's request runs
beside the others' (servers in parallel with the local worker). A branched lane is a
request of its own: its kept tokens end the prompt (the KV cache still holds them) and its
chosen token is forced. The view builds a :class:`LaneJob` per lane, asks
:func:`refusals` first, then :meth:`ComparisonRunner.run`; it shows what the runner
reports through its signals.
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.documents import DocumentError
from core.engine.events import Done, Prefilled
from core.engine.lanes import MAX_LANES
from core.engine.settings import SamplingParams
from core.prompt.tool_format import OFF
from core.tools.spec import tools_from_openai
from core.remote.runner import describe_error
from core.worker.protocol import CompareRequest, Error, Prompted

from gui.bridge import BridgeError, Chunk
from gui.widgets.token_run import LaneRun
from gui.compare.grounding import describe, grounded_messages, spec_key
from gui.compare.models import LaneModel, ModelShelf

RETRY_HINT = " — press Run to try again."
DRAFT_HINT = " — choose another draft model (…) or turn speculative decoding off."
BIAS_ON_SERVER = ("A logit bias by text needs the model's tokenizer, and this server's is not known here "
                  "(LlamaDesk's serve takes it): clear the lane's bias or run it on a local model.")
SPECULATIVE_ON_SERVER = ("Prompt lookup and draft models run in LlamaDesk's engine (here or in its serve); this "
                         "server decodes on its own: set the lane's speculative decoding to Off, or run it on a "
                         "local model.")
BEAMS_ON_SERVER = ("Beam search runs in this app's engine only (no server's API offers it): set the lane's "
                   "beams to off, or run it on a local model.")


@dataclass(eq=False)
class LaneJob:
    """One lane of a run: its number as shown, where and how it runs, and its results
    (``run``: a fresh :class:`LaneRun`, or a branch's kept tokens to go on from)."""
    number: int
    model: LaneModel
    params: SamplingParams
    branch: dict | None = None  # the lane's branch (see gui.compare.lane_column.LaneColumn.branch)
    run: LaneRun = field(default_factory=LaneRun)
    documents: dict | None = None  # what the lane's question is grounded in (gui.compare.grounding)

    def __post_init__(self) -> None:
        if self.branch:
            self.run = LaneRun.branch_of(self.branch["kept"], self.branch["at"])


@dataclass
class Group:
    """One request of a run: its model, its lanes (indexes into the jobs) and, for a
    branch, the request fields that continue it."""
    model: LaneModel
    lanes: list[int]
    extra: dict = field(default_factory=dict)


def refusals(jobs: list[LaneJob]) -> tuple[dict[int, str], str]:
    """What a lane's server cannot run, before anything runs: {job index: the lane's
    notice} and the status line that names those lanes ("" when every lane can run)."""
    other = [k for k, j in enumerate(jobs) if not j.model.takes_extensions]
    bias = [k for k in other if jobs[k].params.logit_bias_text]
    spec = [k for k in other if jobs[k].params.speculative and k not in bias]
    beams = [k for k, j in enumerate(jobs) if j.model.kind == "server" and j.params.num_beams > 1]
    beams = [k for k in beams if k not in bias and k not in spec]
    notices = {**{k: BIAS_ON_SERVER for k in bias}, **{k: SPECULATIVE_ON_SERVER for k in spec},
               **{k: BEAMS_ON_SERVER for k in beams}}
    if not notices:
        return {}, ""
    return notices, "Settings: " + " · ".join(
        f"lane {', '.join(str(jobs[k].number) for k in ks)} {what} on a server"
        for ks, what in ((bias, "sets a logit bias"), (spec, "drafts (speculative)"), (beams, "runs beam search"))
        if ks)


def seed_changes(runs: list, *, again: bool, new_seeds: bool, locked: bool) -> list[dict]:
    """What each lane's settings become before a run (``runs``: each lane's LaneRun or None):
    the shown results' exact settings (``again``, when every lane has results), then fresh
    seeds (``new_seeds``; one shared when ``locked``)."""
    exact = again and all(r is not None and r.params for r in runs)
    changes = [dict(r.params) if exact else {} for r in runs]
    if new_seeds:
        shared = random.randrange(2**31)
        for change in changes:
            change["seed"] = shared if locked else random.randrange(2**31)
    return changes


def branch_refusal(run: LaneRun | None, index: int, token_id: int, lanes: int, model: LaneModel) -> str:
    """Why a lane's token cannot be branched from ("" when it can): ``lanes`` is how many
    lanes the comparison has."""
    if run is None or not run.finished or not 0 <= index < len(run.tokens) or token_id < 0:
        return "this lane has no finished token there"
    if lanes >= MAX_LANES:
        return f"a comparison has at most {MAX_LANES} lanes: remove one first"
    if model.kind == "server":
        if model.remote is None or not model.remote.is_llamadesk:
            return ("this lane's server cannot continue a reply from a token (LlamaDesk's serve can; "
                    "OpenAI's API has no way to force one)")
        if not run.prompt_ids:
            return "the server did not report this lane's prompt as token ids: run the lane again, then branch"
    return ""


def branch_spec(src, number: int, run: LaneRun, at: int, token_id: int, model: LaneModel) -> dict:
    """A new lane's branch from token ``at`` of lane ``number`` (``src``, its column; ``run``,
    its results on ``model``): its tokens before ``at`` are kept and ``token_id`` is forced
    there. A server is sent its own prompt ids, then the kept tokens."""
    spec = {"src": src, "from": number, "at": at, "token_id": token_id, "kept": LaneRun.branch_of(run, at)}
    if model.kind == "server":
        spec["prompt_ids"] = list(run.prompt_ids)
        spec["stop_ids"] = [run.stop_token] if run.stop_token is not None else []
    return spec


def base_request(prompt: dict, inspect: int) -> CompareRequest:
    """What every request of a run shares: the prompt (text, mode, chat format, messages)
    and the alternatives recorded per token; lanes and model come per request."""
    return CompareRequest(messages=prompt.get("messages", []), mode=prompt["mode"], prompt=prompt["text"],
                          chat_format=prompt["chat_format"], inspect=inspect,
                          tools=tools_from_openai(prompt.get("tools") or []))


def running_line(jobs: list[LaneJob]) -> str:
    """The status line while a run goes: 'Running 3 lanes on 2 models…'."""
    models = len({_key(job, tools=False) for job in jobs})  # lanes with tools off run on the same model
    return f"Running {len(jobs)} lanes" + (f" on {models} models" if models > 1 else "") + "…"


def plan(jobs: list[LaneJob]) -> list[Group]:
    """The requests of a run: one per model, grounding and tools on/off, and one per
    branched lane. Lanes with tools off share a prompt that declares none."""
    groups: dict[tuple, list[int]] = {}
    for k, job in enumerate(jobs):
        groups.setdefault(_key(job), []).append(k)
    out = []
    for lanes in groups.values():
        b = jobs[lanes[0]].branch
        extra = {"reply_prefix": b["kept"].ids, "forced": [b["token_id"]],
                 "prompt_ids": b.get("prompt_ids", []), "stop_ids": b.get("stop_ids", [])} if b else {}
        if jobs[lanes[0]].params.tool_choice == OFF:
            extra["tools"] = []
        out.append(Group(jobs[lanes[0]].model, lanes, extra))
    return out


def _key(job: LaneJob, tools: bool = True) -> tuple:
    if job.branch:
        return ("branch", id(job))
    return (job.model.group, spec_key(job.documents)) + ((job.params.tool_choice == OFF,) if tools else ())


def missing_drafts(model: LaneModel, lanes: list[SamplingParams]) -> list[int]:
    """The lanes whose draft model is not there (a server's lanes are its business)."""
    if model.kind == "server":
        return []
    return [k for k, q in enumerate(lanes) if q.draft and not Path(q.draft).expanduser().exists()]


def retry_order(lanes: list[SamplingParams]) -> list[str]:
    """The draft models a request's lanes name, lanes without one ("") first: a request
    that failed before anything streamed runs again split by these, so when the lanes
    without a draft model run, the fault is a draft model's and only its lanes fail."""
    drafts = list(dict.fromkeys(q.draft for q in lanes))
    drafts.sort(key=bool)
    return drafts


class ComparisonRunner(QObject):
    """Runs a comparison's lanes through the bridge and fills their :class:`LaneRun`.

    Args:
        bridge: the :class:`gui.bridge.Bridge` (``compare``, ``hold``).
        shelf: the window's :class:`ModelShelf` (a saved lane's checkpoint is opened again
            and recorded there; token pieces are learned there).

    Signals:
        laneFailed(object, str): a :class:`LaneJob` failed; the notice its lane shows (what
            went wrong and what to do).
        progress(str): a status line (the prompt's size, once it is prefilled).
        frame(): a frame's events are in: time to draw the lanes.
    """

    laneFailed = Signal(object, str)
    progress = Signal(str)
    frame = Signal()

    def __init__(self, bridge, shelf: ModelShelf, parent=None):
        super().__init__(parent)
        self.bridge = bridge
        self.shelf = shelf
        self.streams: list = []
        self.stop_asked = False

    async def run(self, base: CompareRequest, jobs: list[LaneJob]) -> list[str]:
        """Run every request of :func:`plan` beside the others; returns what failed
        ('lane 2 (model): message' each)."""
        self.streams, self.stop_asked = [], False
        failed: list[str] = []
        try:
            await asyncio.gather(*(
                self._run_group(g.model, [jobs[k] for k in g.lanes],
                                replace(base, lanes=[jobs[k].params for k in g.lanes], model="", **g.extra), failed)
                for g in await self._grounded(base, jobs, plan(jobs), failed)))
        finally:
            self.streams = []
        return failed

    async def _grounded(self, base: CompareRequest, jobs: list[LaneJob], groups: list[Group],
                        failed: list[str]) -> list[Group]:
        """The groups with their question grounded as their lanes ask (on a thread); a group
        whose documents cannot be read fails its lanes with the reason and is left out."""
        out = []
        context = int((getattr(self.bridge, "model_info", None) or {}).get("context_length") or 4096)
        for g in groups:
            spec = jobs[g.lanes[0]].documents
            if spec_key(spec):
                try:
                    messages, summary = await grounded_messages(base.messages, spec, context)
                except DocumentError as e:
                    self._fail(g.model, [jobs[k] for k in g.lanes], f"documents: {e}", RETRY_HINT, failed)
                    continue
                g = replace(g, extra={**g.extra, "messages": messages})
                for k in g.lanes:
                    jobs[k].run.grounding = describe(spec, summary)
            out.append(g)
        return out

    def stop(self) -> None:
        """Cancel every request of the run (a checkpoint still opening never starts)."""
        self.stop_asked = True
        for stream in list(self.streams):
            stream.cancel()

    def _fail(self, model: LaneModel, jobs: list[LaneJob], message: str, hint: str, failed: list[str]) -> None:
        where = ", ".join(str(j.number) for j in jobs)
        failed.append(f"lane{'s' if len(jobs) > 1 else ''} {where} ({model.name}): {message}")
        for job in jobs:
            job.run.fail(message)
            self.laneFailed.emit(job, message + hint)

    async def _ready(self, model: LaneModel, jobs: list[LaneJob], request: CompareRequest,
                     failed: list[str]) -> tuple[list[LaneJob], CompareRequest] | None:
        """What of a request can start: a server that is not connected fails it, a missing
        draft model fails its lanes, a saved comparison's checkpoint is opened again. None:
        nothing is left to run."""
        if model.kind == "server" and model.remote is None:
            self._fail(model, jobs, f"not connected to {model.record().get('server') or 'its server'}: "
                       "choose the lane's model again", RETRY_HINT, failed)
            return None
        gone = missing_drafts(model, request.lanes)
        for k in gone:
            self._fail(model, [jobs[k]], f"draft model not found: {request.lanes[k].draft}",
                       " — choose another one (…) or turn speculative decoding off.", failed)
        if gone:
            keep = [k for k in range(len(jobs)) if k not in gone]
            if not keep:
                return None
            jobs, request = [jobs[k] for k in keep], replace(request, lanes=[request.lanes[k] for k in keep])
        if model.kind == "checkpoint" and not model.key:  # a saved comparison's checkpoint: open it again
            try:
                self.shelf.held(await self.bridge.hold(model.path))
            except BridgeError as e:
                self._fail(model, jobs, f"could not open {model.path}: {e}", RETRY_HINT, failed)
                return None
            if self.stop_asked:  # Stop came while it opened: these lanes never start
                for job in jobs:
                    job.run.stop_reason = "cancelled"
                return None
        if model.kind == "checkpoint":
            request.model = model.key
        return jobs, request

    async def _run_group(self, model: LaneModel, jobs: list[LaneJob], request: CompareRequest, failed: list[str],
                         split: bool = True, hint: str = RETRY_HINT) -> None:
        """One request (``jobs`` are its lanes, in its order).

        A lane's draft model is loaded (and checked) when its request starts, and one that
        fails fails the whole request: so a request whose lanes name different draft models
        that fails before anything streamed is run again split by draft model (``split``),
        and only the lanes of the draft model at fault fail."""
        ready = await self._ready(model, jobs, request, failed)
        if ready is None:
            return
        jobs, request = ready
        drafts = retry_order(request.lanes)
        split = split and len(drafts) > 1
        error, streamed = await self._stream(model, jobs, request, failed, hint, quiet=split)
        if error is not None and split and not streamed and not self.stop_asked:
            for d in drafts:
                part = [k for k, q in enumerate(request.lanes) if q.draft == d]
                await self._run_group(model, [jobs[k] for k in part],
                                      replace(request, lanes=[request.lanes[k] for k in part]), failed,
                                      split=False, hint=DRAFT_HINT if d else hint)

    async def _stream(self, model: LaneModel, jobs: list[LaneJob], request: CompareRequest, failed: list[str],
                      hint: str, quiet: bool) -> tuple[Error | None, bool]:
        """Play one request's events into its lanes; returns its error (if any) and whether
        anything streamed. ``quiet``: an error before anything streamed fails no lane
        (the request will be run again, split)."""
        names = self.shelf.names_for(model)
        dropped = 0
        streamed = False
        error: Error | None = None
        stream = self.bridge.compare(request, backend=model.remote) if model.kind == "server" \
            else self.bridge.compare(request)
        self.streams.append(stream)
        async for ev in stream:
            match ev:
                case Chunk() if 0 <= ev.lane < len(jobs):
                    streamed = True
                    jobs[ev.lane].run.add(ev.tokens)
                    for t in ev.tokens:
                        names.setdefault(int(t.token_id), t.piece)
                case Done() if 0 <= ev.lane < len(jobs):
                    streamed = True
                    jobs[ev.lane].run.finish(ev)
                case Prompted():
                    dropped = ev.dropped_messages
                case Prefilled():
                    streamed = True
                    self.progress.emit(f"Prompt: {ev.prompt_tokens} tokens"
                                       + (f" on {model.name}" if len(self.streams) > 1 else "")
                                       + (f" ({dropped} oldest messages left out to fit)" if dropped else "")
                                       + " · generating…")
                case Error() if not ev.cancelled:
                    error = ev
                    if not (quiet and not streamed):
                        message = describe_error(ev.kind, ev.message) if ev.kind else ev.message
                        # Lanes that finished before the failure keep their results.
                        self._fail(model, [j for j in jobs if not j.run.finished] or jobs, message, hint, failed)
            # The bridge delivers a frame's events together: draw once they are in.
            if not stream.pending:
                self.frame.emit()
        return error, streamed
