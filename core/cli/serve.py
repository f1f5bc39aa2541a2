"""``python -m core serve``: one model over an OpenAI-compatible HTTP API (core/serving/)."""
from __future__ import annotations

import sys

from core.cli.backends import load_model
from core.engine.settings import SCHEMA
from core.errors import SettingsError
from core.serving.run import is_loopback, serve_forever
from core.serving.state import ServerState


def check_serve_args(args) -> None:
    """Refuse what cannot be served before the model loads."""
    if not is_loopback(args.host) and not args.api_key:
        raise SettingsError(f"--host {args.host} lets other machines connect: it needs --api-key "
                            "(or LLAMADESK_API_KEY); without one, serve on 127.0.0.1")
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


def cmd_serve(args) -> int:
    check_serve_args(args)
    loaded, load_s = load_model(args)
    state = ServerState(loaded, model_id=args.model_name, api_key=args.api_key,
                        max_batch=args.max_batch, max_queue=args.max_queue, lookup=args.lookup, draft=args.draft,
                        compile=args.compile)

    def announce(url: str) -> None:
        print(f"serving {state.model_id} at {url} (loaded in {load_s:.1f} s; Ctrl+C stops)", file=sys.stderr, flush=True)

    serve_forever(state, args.host, args.port, announce)
    return 0
