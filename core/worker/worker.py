"""The worker: one long-lived thread that owns the model, its KV cache and the sampler.

Commands go in through a queue (every method is a non-blocking put that returns a
request id); events come out through one callback, called on the worker thread. Torch
state is created, used and dropped only on that thread, so the UI thread never waits on
a matmul. Nothing raised while serving a command escapes: it becomes an :class:`Error`
event and the worker takes the next command.

Cancel is a ``threading.Event`` per command, checked between load tensors, between
prefill chunks and at every decode step, so it lands within one step. No Qt here: the
GUI reaches this through ``gui/bridge.py``; the CLI and tests use it directly.
"""
from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from core import checkpoints, limits
from core.engine import engine as _engine
from core.documents.chunk import model_counter
from core.engine.events import Done, Reply, Stats
from core.errors import LlamaDeskError, SettingsError, one_line
from core.model.tuning import plan_for
from core.prompt.chat_format import chat_format_for
from core.prompt.prompting import build_prompt
from core.tokenizer.fingerprint import tokenizer_fingerprint
from core.worker.attribute import run_attribution
from core.worker.protocol import (MAX_INSPECT, MODES, AttributeRequest, CompareRequest, Error, GenerateRequest, Held, Loaded,
                                  LoadProgress, Counted, Prompted, Unloaded)

log = logging.getLogger(__name__)

THREADS_ENV = "LLAMADESK_THREADS"


# --------------------------------------------------------------------------- threads

def default_torch_threads(cpu_count: int | None = None) -> int:
    """Torch intra-op threads when neither the caller nor LLAMADESK_THREADS says.

    One core is left to the UI thread: on a 2-core machine 2 torch threads stall the
    event loop far beyond a frame while 1 thread keeps it smooth for a small decode-speed
    cost (bench/bench_responsiveness.py measures both).
    """
    n = cpu_count or os.cpu_count() or 1
    return max(1, n - 1)


def resolve_torch_threads(requested: int | None = None) -> int:
    """The thread count to use: ``requested``, else LLAMADESK_THREADS, else the default."""
    if requested is not None:
        if int(requested) < 1:
            raise SettingsError(f"torch threads must be at least 1, got {requested}")
        return int(requested)
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        try:
            n = int(env)
            if n >= 1:
                return n
        except ValueError:
            pass
        log.warning("ignoring %s=%r (want a whole number ≥ 1)", THREADS_ENV, env)
    return default_torch_threads()


# --------------------------------------------------------------------------- the worker

class _Cancelled(BaseException):
    """Raised from the load progress callback; a BaseException so that loaders' own
    ``except Exception`` clean-ups cannot turn a cancel into a load error."""


@dataclass
class _Command:
    kind: str
    request_id: int
    args: dict[str, Any]
    cancel: threading.Event = field(default_factory=threading.Event)


def load_failure(exc: BaseException) -> str:
    """An unexpected exception from a loader, in the user's words (the traceback goes to the log)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return ("not enough memory to load this model: try Model → Data Type → bfloat16, "
                "a smaller model, or closing other programs")
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"could not read the model's files{where}: {exc.strerror or 'input/output error'}"
    return (f"could not load the model: it is damaged or in a form this app does not handle "
            f"(an unexpected {type(exc).__name__}; details are in the log)")


_DOING = {"load": "loading the model", "adopt": "installing the model", "hold": "loading the second model",
          "generate": "generating",
          "compare": "running the comparison"}


def _is_oom(exc: BaseException | None) -> bool:
    """MemoryError, or torch's allocator failing (a RuntimeError / OutOfMemoryError)."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower() if exc is not None else ""
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                              or "not enough memory" in text or "defaultcpuallocator" in text)


def _memory_message(exc: BaseException | None, what: str) -> str:
    if exc is not None and not _is_oom(exc):
        return f"{what} failed: {type(exc).__name__}: {one_line(exc)}"
    return f"out of memory while {what}: close other programs, or choose a smaller model or context"


class Worker:
    """One thread that owns all torch state; see the module docstring.

    Args:
        on_event: called with every event, ON THE WORKER THREAD; must be thread-safe and
            quick (hand the event to another thread, don't work on it). Exceptions it
            raises are logged and ignored.
        torch_threads: intra-op threads (default: LLAMADESK_THREADS, else one per core
            less one for the UI).
        prefill_chunk: prompt tokens per forward pass; cancel lands between chunks.
        collect_garbage: called (on the worker thread) after a model is dropped, to free
            tensors held in reference cycles. The default collects right there; a GUI
            passes one that collects on its own thread instead, because a collection
            finalises every unreachable cycle in the process, Qt objects included, and
            Qt objects must never be destroyed off their thread.
    """

    def __init__(self, on_event: Callable[[object], None], *, torch_threads: int | None = None,
                 prefill_chunk: int = 256, collect_garbage: Callable[[], object] = gc.collect):
        self._on_event = on_event
        self._collect_garbage = collect_garbage
        self.torch_threads = resolve_torch_threads(torch_threads)
        # a count the user chose (argument or LLAMADESK_THREADS) is used for both phases
        self._threads_override = self.torch_threads if (
            torch_threads is not None or os.environ.get(THREADS_ENV, "").strip()) else None
        self._prefill_chunk = prefill_chunk
        self._queue: queue.Queue[_Command | None] = queue.Queue()
        self._lock = threading.Lock()
        self._live: list[_Command] = []  # queued or running: what cancel() reaches
        self._next_id = 1
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._info: dict | None = None
        # Worker-thread state only.
        self._loaded = None
        self._engine: _engine.Engine | None = None
        self._formats: dict[str, Any] = {}
        self._held: dict[str, tuple[Any, _engine.Engine, dict]] = {}  # key -> (loaded, engine, formats)

    # -- public API (any thread) -------------------------------------------------------

    def start(self) -> None:
        """Start the thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            # daemon: a worker stuck in a long native call must not keep the process alive
            # after shutdown() gave up waiting for it.
            self._thread = threading.Thread(target=self._run, name="llamadesk-worker", daemon=True)
            self._thread.start()

    def load(self, path, *, device: str = "auto", dtype: str = "auto", max_seq_len: int | None = None,
             compile: bool = False) -> int:
        """Load a checkpoint, cancelling whatever runs or waits first. ``compile``: decode
        through torch.compile (CUDA graphs on a GPU; :mod:`core.model.decode_step`).

        The current model stays if the path is not a model at all; otherwise it is
        unloaded (Unloaded event) before the new one loads, so two models never need
        memory at once. Events: LoadProgress…, then Loaded or Error.
        """
        return self._submit("load", cancel_all=True, path=path, device=device, dtype=dtype,
                            max_seq_len=max_seq_len, compile=bool(compile))

    def adopt(self, loaded) -> int:
        """Use an already built :class:`~core.checkpoints.LoadedModel` (tests, benchmarks)."""
        return self._submit("adopt", cancel_all=True, loaded=loaded)

    def unload(self) -> int:
        """Cancel what runs, drop the model and free its memory; then an Unloaded event."""
        return self._submit("unload", cancel_all=True)

    def hold(self, path, *, device: str = "auto", dtype: str = "auto") -> int:
        """Load another checkpoint beside the main model (comparison lanes across models).

        Unlike :meth:`load` it cancels nothing and never releases the main model: it is
        refused (an Error naming what it needs) when it does not fit beside it. Events:
        Held (again at once when that checkpoint is already held) or Error.
        """
        return self._submit("hold", path=path, device=device, dtype=dtype)

    def release(self, key: str) -> int:
        """Drop a checkpoint held with :meth:`hold` (no event; unknown keys are ignored)."""
        return self._submit("release", key=key)

    def generate(self, request: GenerateRequest) -> int:
        """Queue one reply: Prompted, then Reply(Prefilled), Reply(Token)…, Reply(Done) (or Error)."""
        return self._submit("generate", request=request)

    def count(self, request: GenerateRequest) -> int:
        """Count the prompt ``request`` makes for the loaded model: Counted (or Error)."""
        return self._submit("count", request=request)

    def compare(self, request: CompareRequest) -> int:
        """Queue a comparison: like :meth:`generate`, with lane-tagged tokens and one Done per lane."""
        return self._submit("compare", request=request)

    def attribute(self, request: AttributeRequest) -> int:
        """Where a span of a reply came from (core/worker/attribute.py): Attributed or Error."""
        return self._submit("attribute", request=request)

    def cancel(self, request_id: int) -> None:
        """Cancel one request, running or queued; the others go on. Unknown or finished
        ids are ignored (a late Stop must not reach the next request)."""
        with self._lock:
            for cmd in self._live:
                if cmd.request_id == request_id:
                    cmd.cancel.set()

    def cancel_all(self) -> None:
        """Cancel the running command and everything queued (model load/unload, shutdown)."""
        with self._lock:
            for cmd in self._live:
                cmd.cancel.set()

    def stop(self) -> None:
        """Cancel everything and ask the thread to end; does not wait (see :meth:`join`)."""
        with self._lock:
            self._stopping = True
            for cmd in self._live:
                cmd.cancel.set()
        self._queue.put(None)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread; True when it has ended (or never started)."""
        t = self._thread
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel, stop and join (returns after ``timeout`` at worst)."""
        self.stop()
        self.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def info(self) -> dict | None:
        """The loaded model's info (a copy), or None."""
        with self._lock:
            return dict(self._info) if self._info is not None else None

    # -- internals ---------------------------------------------------------------------

    def _submit(self, kind: str, *, cancel_all: bool = False, **args) -> int:
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            stopping = self._stopping
            if not stopping:
                if cancel_all:
                    for cmd in self._live:
                        cmd.cancel.set()
                cmd = _Command(kind, rid, args)
                self._live.append(cmd)
                self._queue.put(cmd)
        if stopping:
            self._emit(Error(rid, "the model worker has shut down"))
        return rid

    def _emit(self, event) -> None:
        try:
            self._on_event(event)
        except Exception:  # a listener's bug must not kill the worker
            log.exception("worker event listener failed on %s", type(event).__name__)

    def _run(self) -> None:
        # Process-wide setting, but applied here so it is in force before any torch work.
        torch.set_num_threads(self.torch_threads)
        handlers = {"load": self._do_load, "adopt": self._do_adopt, "unload": self._do_unload,
                    "hold": self._do_hold, "release": self._do_release,
                    "generate": self._do_generate, "compare": self._do_generate, "count": self._do_count,
                    "attribute": lambda c: self._emit(run_attribution(self._loaded, self._engine, c.request_id,
                                                                      c.args["request"], c.cancel))}
        try:
            while True:
                cmd = self._queue.get()
                if cmd is None:
                    break
                try:
                    handlers[cmd.kind](cmd)
                except _Cancelled:
                    self._emit(Error(cmd.request_id, "cancelled", cancelled=True))
                except LlamaDeskError as e:
                    self._emit(Error(cmd.request_id, one_line(e)))
                except MemoryError as e:
                    # Handled without logging a traceback: formatting one needs memory too,
                    # and a second MemoryError here would end the thread.
                    e = None  # noqa: F841 — drop the frames that hold the big allocations
                    self._collect_garbage()
                    self._emit(Error(cmd.request_id, _memory_message(None, _DOING.get(cmd.kind, cmd.kind))))
                except BaseException as e:  # noqa: BLE001 — the thread must survive anything
                    if _is_oom(e):
                        self._emit(Error(cmd.request_id, _memory_message(e, _DOING.get(cmd.kind, cmd.kind))))
                    else:
                        try:
                            log.exception("worker command %s failed", cmd.kind)
                        except BaseException:  # noqa: BLE001
                            pass
                        self._emit(Error(cmd.request_id, f"{cmd.kind} failed: {type(e).__name__}: {one_line(e)}"))
                finally:
                    with self._lock:
                        if cmd in self._live:
                            self._live.remove(cmd)
        finally:
            self._held.clear()
            self._drop_model()

    # -- models --------------------------------------------------------------------------

    def _held_bytes(self) -> int:
        """Bytes the current model and its KV cache hold (what dropping it would free)."""
        if self._loaded is None:
            return 0
        n = sum(p.numel() * p.element_size() for p in self._loaded.model.parameters())
        cache = getattr(self._engine, "cache", None)
        return n + (cache.nbytes() if cache is not None else 0)

    def _drop_model(self) -> bool:
        had = self._loaded is not None
        self._engine = None
        self._loaded = None
        self._formats = {}
        with self._lock:
            self._info = None
        if had:
            self._collect_garbage()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return had

    def _install(self, loaded, rid: int, compile: bool = False) -> None:
        args = loaded.args
        plan = plan_for(loaded.model.tok_embeddings.weight.device, self.torch_threads, self._threads_override)
        self._engine = _engine.Engine(loaded.model, loaded.tokenizer, max_context=args.max_seq_len,
                                      prefill_chunk=self._prefill_chunk, stop_ids=loaded.stop_ids,
                                      threads=(plan.prefill, plan.decode) if plan else None, compile=compile)
        self._loaded = loaded
        self._formats = {}
        info = _model_info(loaded)
        if plan is not None:
            info["threads"] = plan.reason
        info["decode"] = self._engine.compile_status
        with self._lock:
            self._info = info
        self._emit(Loaded(rid, dict(info), model_counter(loaded)))

    def _do_load(self, cmd: _Command) -> None:
        rid, a = cmd.request_id, cmd.args
        if cmd.cancel.is_set():
            self._emit(Error(rid, "loading cancelled", cancelled=True))
            return
        # A failed load must not cost the user the model they have: the path and device
        # are checked first, then the loader validates the checkpoint's header, config and
        # tokenizer and computes its memory need; only then, and only when the new model
        # would not fit beside the current one, is the current one released (before_build).
        checkpoints.detect(a["path"])
        checkpoints.resolve_dtype(a["dtype"], checkpoints.resolve_device(a["device"]))
        watch = _LoadWatch(self, cmd, self._held_bytes())
        self._emit(LoadProgress(rid, 0.0, "opening"))
        loaded = self._load_or_say_why(cmd, watch)
        if loaded is None:
            return
        if cmd.cancel.is_set():  # cancelled after the last tensor: honour it
            del loaded
            self._collect_garbage()
            self._emit(Error(rid, "loading cancelled" + watch.suffix(), cancelled=True))
            return
        if self._drop_model():  # the new model was built beside the old one
            self._emit(Unloaded(rid))
        self._emit(LoadProgress(rid, 1.0, "ready"))
        self._install(loaded, rid, a.get("compile", False))

    def _load_or_say_why(self, cmd: _Command, watch: "_LoadWatch"):
        """The loaded checkpoint, or None once an Error event has said why not."""
        rid, a = cmd.request_id, cmd.args
        try:
            with limits.before_build(watch.before_build):
                return checkpoints.load(a["path"], device=a["device"], dtype=a["dtype"],
                                        max_seq_len=a["max_seq_len"], progress=watch.progress)
        except _Cancelled:
            self._emit(Error(rid, "loading cancelled" + watch.suffix(), cancelled=True))
        except LlamaDeskError as e:
            # A loader may wrap the cancel exception; the flag tells the truth.
            if cmd.cancel.is_set():
                self._emit(Error(rid, "loading cancelled" + watch.suffix(), cancelled=True))
            else:
                self._emit(Error(rid, one_line(e) + watch.suffix()))
        except (MemoryError, RuntimeError) as e:  # torch's allocator raises RuntimeError (OOM)
            self._collect_garbage()
            self._emit(Error(rid, load_failure(MemoryError() if _is_oom(e) else e) + watch.suffix()))
            if not _is_oom(e):
                log.error("loading %s failed: %s: %s", a["path"], type(e).__name__, e)
        except Exception as e:
            if cmd.cancel.is_set():
                self._emit(Error(rid, "loading cancelled" + watch.suffix(), cancelled=True))
            else:
                log.exception("loading %s failed", a["path"])
                self._emit(Error(rid, load_failure(e) + watch.suffix()))
        return None

    def _do_adopt(self, cmd: _Command) -> None:
        if self._drop_model():
            self._emit(Unloaded(cmd.request_id))
        self._install(cmd.args["loaded"], cmd.request_id)

    def _do_unload(self, cmd: _Command) -> None:
        self._drop_model()
        self._emit(Unloaded(cmd.request_id))

    def _do_hold(self, cmd: _Command) -> None:
        rid, a = cmd.request_id, cmd.args
        key = str(Path(a["path"]).expanduser().resolve())
        if key in self._held:
            self._emit(Held(rid, _model_info(self._held[key][0], key)))
            return
        checkpoints.detect(a["path"])
        checkpoints.resolve_dtype(a["dtype"], checkpoints.resolve_device(a["device"]))
        name = Path(key).name

        def beside(needed: int, device) -> None:  # never release the main model for it
            limits.check_fits(needed, device, what=f"{name} beside the loaded model")

        def progress(fraction: float, stage: str) -> None:
            if cmd.cancel.is_set():
                raise _Cancelled

        try:
            with limits.before_build(beside):
                loaded = checkpoints.load(a["path"], device=a["device"], dtype=a["dtype"], progress=progress)
        except (_Cancelled, LlamaDeskError):
            raise
        except (MemoryError, RuntimeError) as e:
            self._collect_garbage()
            raise SettingsError(load_failure(MemoryError() if _is_oom(e) else e)) from None
        except Exception as e:
            log.exception("holding %s failed", a["path"])
            raise SettingsError(load_failure(e)) from None
        engine = _engine.Engine(loaded.model, loaded.tokenizer, max_context=loaded.args.max_seq_len,
                                prefill_chunk=self._prefill_chunk, stop_ids=loaded.stop_ids)
        self._held[key] = (loaded, engine, {})
        self._emit(Held(rid, _model_info(loaded, key)))

    def _do_release(self, cmd: _Command) -> None:
        if self._held.pop(cmd.args["key"], None) is not None:
            self._collect_garbage()

    # -- generation ------------------------------------------------------------------------

    @staticmethod
    def _chat_format(loaded, formats: dict, name: str):
        if name in (None, "", "auto"):
            return loaded.chat_format
        if name not in formats:
            formats[name] = chat_format_for(loaded.tokenizer, override=name)
        return formats[name]

    def _do_count(self, cmd: _Command) -> None:
        req, eng = cmd.args["request"], self._engine
        if eng is None:
            raise SettingsError("no model is loaded: open a model first")
        fmt = self._chat_format(self._loaded, self._formats, req.chat_format)
        ids = build_prompt(req, fmt, self._loaded.stop_ids, eng.max_context, req.params.max_new_tokens).ids
        self._emit(Counted(cmd.request_id, len(ids), eng.max_context))

    def _do_generate(self, cmd: _Command) -> None:
        rid, req = cmd.request_id, cmd.args["request"]
        lanes = list(req.lanes) if cmd.kind == "compare" else [req.params]
        if cmd.cancel.is_set():  # cancelled while queued: end it without touching the model
            for i, p in enumerate(lanes):
                self._emit(Reply(rid, Done(i, "cancelled", [], "", [], p, Stats())))
            return
        key = getattr(req, "model", "")
        if key:
            if key not in self._held:
                raise SettingsError(f"the checkpoint {key} is not loaded any more: choose it for the lane again")
            loaded, eng, formats = self._held[key]
        elif self._engine is None:
            raise SettingsError("no model is loaded: open a model first")
        else:
            loaded, eng, formats = self._loaded, self._engine, self._formats
        if req.mode not in MODES:
            raise SettingsError(f"unknown mode {req.mode!r}: use chat or completion")
        if not 0 <= int(req.inspect) <= MAX_INSPECT:
            raise SettingsError(f"inspect must be between 0 and {MAX_INSPECT}, got {req.inspect}")
        if not lanes:
            raise SettingsError("a comparison needs at least one lane")
        # Resolve seeds here so Done.params records the seed that was really used.
        lanes = [p.validate().resolved() for p in lanes]
        prompt = build_prompt(req, self._chat_format(loaded, formats, req.chat_format), loaded.stop_ids,
                              eng.max_context, max(p.max_new_tokens for p in lanes))
        eng.check_memory(len(prompt.ids), lanes)  # before the draft loader or anything else runs
        how = dict(cancel=cmd.cancel, strip_leading_space=prompt.strip_leading_space, inspect=int(req.inspect),
                   stop_ids=prompt.stop_ids, continued=req.continue_reply, tools=prompt.tools)
        if eng.draft_loader is None:
            eng.draft_loader = draft_loader(eng)
        if cmd.kind == "compare":
            events = eng.generate_lanes(prompt.ids, lanes, forced=list(getattr(req, "forced", ())), **how)
        else:
            events = eng.generate(prompt.ids, lanes[0], forced=list(getattr(req, "forced", ())), **how)
        self._emit(Prompted(rid, prompt.dropped_messages, eng.max_context))
        try:
            for ev in events:
                if isinstance(ev, Done) and eng is self._engine:
                    # The first step may have compiled, or fallen back: info() says so by now.
                    with self._lock:
                        if self._info is not None:
                            self._info["decode"] = eng.compile_status
                self._emit(Reply(rid, ev))
        except BaseException:
            # The cache may hold a half-written step: never reuse it.
            eng.cache.reset()
            raise
        finally:
            events.close()


class _LoadWatch:
    """The callbacks of one load: ``progress`` (which honours cancel) and ``before_build``
    (which releases the current model only when the new one would not fit beside it)."""

    def __init__(self, worker: Worker, cmd: _Command, held: int):
        self.worker, self.cmd, self.held = worker, cmd, held
        self.dropped = False
        self.last = 0.0

    def before_build(self, needed: int, device) -> None:
        w = self.worker
        if w._loaded is None or limits.fits(needed, device):
            return  # nothing held, or both fit: build the new one beside the old
        if not limits.fits(needed, device, releasable=self.held):
            return  # will not fit even alone: check_fits refuses, the old model stays
        w._drop_model()
        self.dropped = True
        w._emit(Unloaded(self.cmd.request_id))

    def progress(self, fraction: float, stage: str) -> None:
        if self.cmd.cancel.is_set():
            raise _Cancelled
        now = time.perf_counter()
        # Per-tensor callbacks can come by the thousand: ~30 updates a second is plenty.
        if fraction >= 1.0 or fraction == 0.0 or now - self.last >= 0.033:
            self.last = now
            self.worker._emit(LoadProgress(self.cmd.request_id, float(fraction), stage))

    def suffix(self) -> str:
        return " (the previous model was unloaded)" if self.dropped else ""


def draft_loader(eng, *, named: bool = False):
    """Loads a draft model (the app: on the worker thread, the first time a lane names it;
    the CLI and ``serve`` use the same): on the engine's device, its own dtype; the engine
    keeps it under its path (``named``: under the checkpoint's own name, which ``serve``
    lists) and checks its vocabulary (DraftModelError when it differs from the engine's)."""
    def load_draft(path: str):
        d = checkpoints.load(path, device=eng.device.type, dtype="auto")
        return eng.add_draft(d.name if named else path, d.model, d.tokenizer)
    return load_draft


def _model_info(loaded, key: str | None = None) -> dict:
    """A model's info for Loaded/Held: the checkpoint's facts, its name, context length and
    tokenizer fingerprint (plus the hold key)."""
    info = dict(loaded.info)
    info.setdefault("context_length", loaded.args.max_seq_len)
    info.setdefault("name", loaded.name)
    info["tokenizer"] = tokenizer_fingerprint(loaded.tokenizer, loaded.args.vocab_size)
    # SentencePiece's dummy prefix: a word-start token's text drops its space to encode alone.
    info["dummy_prefix"] = bool(getattr(loaded.tokenizer, "add_dummy_prefix", False))
    if key is not None:
        info["key"] = key
    return info


__all__ = ["Worker", "THREADS_ENV", "default_torch_threads", "resolve_torch_threads", "draft_loader", "load_failure"]
