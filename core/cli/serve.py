"""``python -m core serve``: one model over an OpenAI-compatible HTTP API (core/serving/)."""
from __future__ import annotations

import os
import sys

from core.cli.backends import load_model
from core.engine.settings import SCHEMA
from core.errors import SettingsError
from core.model.tuning import plan_for
from core.serving.guard import HTTPOptions
from core.serving.run import is_loopback, serve_forever
from core.serving.state import ServerState
from core.worker.worker import THREADS_ENV, resolve_torch_threads


def check_serve_args(args) -> None:
    """Refuse what cannot be served before the model loads."""
    if not is_loopback(args.host) and not args.api_key:
        raise SettingsError(f"--host {args.host} lets other machines connect: it needs --api-key "
                            "(or LLAMADESK_API_KEY); without one, serve on 127.0.0.1")
    if args.api_key and not args.api_key.isascii():  # an HTTP header carries ASCII: no client could send it
        raise SettingsError("--api-key must be ASCII (HTTP headers carry no other characters)")
    if not 0 <= args.port <= 65535:
        raise SettingsError(f"--port must be 0 to 65535, got {args.port}")
    if not 1 <= args.max_batch <= 256:
        raise SettingsError(f"--max-batch must be 1 to 256, got {args.max_batch}")
    if args.max_queue < 0:
        raise SettingsError(f"--max-queue must be 0 or more, got {args.max_queue}")
    if not SCHEMA["lookup"].accepts(args.lookup):
        raise SettingsError(SCHEMA["lookup"].error(args.lookup, "--lookup"))
    if args.lookup and args.draft:
        raise SettingsError("choose --lookup or --draft, not both")
    if args.threads is not None and not 1 <= args.threads <= 1024:
        raise SettingsError(f"--threads must be 1 to 1024, got {args.threads}")
    if not 1024 <= args.max_body <= 1 << 30:
        raise SettingsError(f"--max-body must be 1024 to {1 << 30} bytes, got {args.max_body}")
    for flag, value in (("--read-timeout", args.read_timeout), ("--shutdown-timeout", args.shutdown_timeout)):
        if not 0 < value <= 3600:
            raise SettingsError(f"{flag} must be more than 0 and at most 3600 seconds, got {value:g}")
    for origin in args.cors_origin:
        if not origin.startswith(("http://", "https://")) or origin.endswith("/"):
            raise SettingsError(f"--cors-origin takes an origin such as http://localhost:3000, got {origin!r}")


def http_options(args) -> HTTPOptions:
    hosts = tuple(h.strip() for item in args.allowed_hosts for h in item.split(",") if h.strip())
    return HTTPOptions(allowed_hosts=hosts, cors_origins=tuple(args.cors_origin), max_body=args.max_body,
                       read_timeout=args.read_timeout, shutdown_timeout=args.shutdown_timeout)


def serve_threads(loaded, requested: int | None):
    """The engine's thread plan: --threads, else LLAMADESK_THREADS, else the CPU probe's
    pick per phase over every core but one; that core is the event loop's and the request
    threads' (parsing, tokenizing, JSON), as the app keeps one for its UI."""
    override = resolve_torch_threads(requested) if requested is not None or os.environ.get(THREADS_ENV, "").strip() \
        else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return plan_for(loaded.model.tok_embeddings.weight.device, max(1, cores - 1), override)


def cmd_serve(args) -> int:
    check_serve_args(args)
    loaded, load_s = load_model(args)
    plan = serve_threads(loaded, args.threads)
    names = [n.strip() for n in (args.model_name or "").split(",") if n.strip()]
    state = ServerState(loaded, model_id=names[0] if names else None, aliases=tuple(names[1:]),
                        any_model=args.any_model_name, api_key=args.api_key,
                        max_batch=args.max_batch, max_queue=args.max_queue, lookup=args.lookup, draft=args.draft,
                        compile=args.compile, threads=(plan.prefill, plan.decode) if plan else None)

    def announce(url: str) -> None:
        threads = f"; {plan.reason}" if plan else ""
        print(f"serving {state.model_id} at {url} (loaded in {load_s:.1f} s{threads}; Ctrl+C stops)",
              file=sys.stderr, flush=True)

    serve_forever(state, args.host, args.port, announce, http_options(args))
    return 0
