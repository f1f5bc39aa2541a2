"""Where a command's model runs: loaded here (the checkpoint, the engine with the CLI's
thread plan, the prompt as token ids) or on an OpenAI-compatible server (connect, stream
one reply)."""
from __future__ import annotations

import os
import time

from core.checkpoints import load
from core.engine.engine import Engine
from core.errors import SettingsError
from core.model.tuning import plan_for
from core.prompt.chat_format import chat_format_for
from core.remote.client import RemoteModel
from core.worker.worker import THREADS_ENV, draft_loader, resolve_torch_threads


def load_model(args):
    """(the loaded checkpoint args.model names, seconds it took)."""
    t0 = time.perf_counter()
    loaded = load(args.model, device=args.device, dtype=args.dtype)
    return loaded, time.perf_counter() - t0


def thread_plan(loaded):
    """(prefill, decode) threads for the CLI's engine and why: LLAMADESK_THREADS if set,
    else the CPU probe's pick per phase over every core (the CLI owns the machine)."""
    override = resolve_torch_threads() if os.environ.get(THREADS_ENV, "").strip() else None
    return plan_for(loaded.model.tok_embeddings.weight.device, os.cpu_count() or 1, override)


def engine_for(loaded, args, *, drafts: bool = False) -> Engine:
    """The engine over ``loaded`` with the CLI's thread plan; ``drafts``: it loads draft
    models by the app's own draft loader (one path for the app, the CLI and serve)."""
    plan = thread_plan(loaded)
    engine = Engine(loaded.model, loaded.tokenizer, stop_ids=loaded.stop_ids, compile=getattr(args, "compile", False),
                    threads=(plan.prefill, plan.decode) if plan else None)
    if drafts:
        engine.draft_loader = draft_loader(engine)
    return engine


def messages(args) -> list[dict]:
    """--system and --prompt as chat messages."""
    msgs = []
    if args.system:
        msgs.append({"role": "system", "content": args.system})
    msgs.append({"role": "user", "content": args.prompt})
    return msgs


def prompt_ids(loaded, args, tools: list | None = None) -> tuple[list[int], bool, object]:
    """(ids, strip_leading_space, the chat format) for the prompt as the user asked for it
    (``tools``: the functions a chat reply may call, declared in the prompt)."""
    tok = loaded.tokenizer
    if args.chat:
        fmt = loaded.chat_format if args.chat_format == "auto" else chat_format_for(tok, override=args.chat_format)
        return (fmt.encode_dialog(messages(args), tools=tuple(tools or ())),
                bool(getattr(tok, "add_dummy_prefix", False)), fmt)
    if args.system:
        raise SettingsError("--system needs --chat")
    return tok.encode(args.prompt, bos=True), False, loaded.chat_format


def connect(url: str, args, model: str | None = None) -> tuple[RemoteModel, float]:
    """(the model on the server at ``url``, connected; seconds it took)."""
    r = RemoteModel(url, api_key=args.api_key, model=model)
    t0 = time.perf_counter()
    r.connect()
    return r, time.perf_counter() - t0


def check_remote_opts(args) -> None:
    """Refuse the options that only a local model takes, with --server."""
    if args.model is not None:
        raise SettingsError("give MODEL or --server, not both")
    for opt, val, default in (("--device", args.device, "auto"), ("--dtype", args.dtype, "auto"),
                              ("--chat-format", args.chat_format, "auto")):
        if val != default:
            raise SettingsError(f"{opt} applies to local models; the server chooses its own")
    if args.system and not args.chat:
        raise SettingsError("--system needs --chat")


def remote_stream(remote: RemoteModel, args, params, lane: int = 0, meta: dict | None = None,
                  tools: list | None = None, parallel: bool = True):
    """One reply from a server: a chat reply with --chat (that may call ``tools``), else a completion."""
    if args.chat:
        return remote.stream(params, messages=messages(args), lane=lane, meta=meta, tools=tools or None,
                             parallel_tool_calls=parallel)
    return remote.stream(params, prompt=args.prompt, lane=lane, meta=meta)
