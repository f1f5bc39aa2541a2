"""``generate --builtin/--mcp``: the reply's calls to those tools run here and the reply
goes on with their results, round after round, as the app's chat does.

Only tools the user named on the command line run (built-ins with ``--builtin``, MCP
servers with ``--mcp``/``--mcp-server``): naming them is the approval a command line gives.
A call to a ``--tools`` function ends the reply as before (the caller runs it), and the
rounds stop after ``--max-tool-rounds``.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from core.cli.backends import messages
from core.cli.tool_opts import wants_toolbox
from core.engine.events import Done, Token
from core.errors import SettingsError, plain_text
from core.tools.spec import Tool, ToolResult

DEFAULT_ROUNDS = 8


def open_toolbox(args):
    """The ToolBox the options name, or None; SettingsError (exit 2) when they cannot apply."""
    if not wants_toolbox(args):
        return None
    if not args.chat:
        raise SettingsError("--builtin and --mcp need --chat: a completion makes no calls")
    from core.cli.tools import builtin_names, servers_from_args  # the MCP SDK (~1 s): only when asked for
    from core.tools.box import ToolBox
    from core.tools.builtin import BuiltinTools
    # Servers only when named: --builtin alone never starts the user's configured servers.
    providers = servers_from_args(args) if (args.mcp or args.mcp_server) else []
    names = builtin_names(args.builtin)
    if names:
        providers.append(BuiltinTools(names, folders=args.allow_folder, timezone=args.timezone))
    return ToolBox(providers, timeout=args.tool_timeout)


def offered(declared: list[Tool], box) -> list[Tool]:
    """--tools' functions and the box's, names unique (one clash is said, not guessed)."""
    if box is None:
        return declared
    have = {t.name for t in declared}
    mine = box.tools()  # starts the servers
    clash = sorted(have & {t.name for t in mine})
    if clash:
        raise SettingsError(f"--tools and --builtin/--mcp both offer {', '.join(clash)}; rename one")
    if not mine and not declared:
        raise SettingsError("the tools asked for offer nothing: " + ("; ".join(box.notes) or "no tool listed"))
    return declared + mine


def drain(events, args) -> Done:
    done = None
    for ev in events:
        if isinstance(ev, Token) and not args.json and ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Done):
            done = ev
    return done


def run_rounds(first, again, params, box, args) -> tuple[Done, list[dict]]:
    """Drain ``first``'s events; while the reply ends calling only the box's tools, run them
    and drain ``again(messages, params)``. (the last Done, the calls made with their results)"""
    done, ran = drain(first, args), []
    if box is None:
        return done, ran
    msgs = messages(args)
    limit = getattr(args, "max_tool_rounds", None) or DEFAULT_ROUNDS
    for n in range(limit + 1):
        calls = done.tool_calls if done is not None and done.stop_reason == "tool_calls" else []
        if not calls or any(box.provider_of(c.name) is None for c in calls):
            return done, ran  # an answer, or a --tools function the caller runs
        if n == limit:
            _say(args, f"stopped after {limit} tool rounds (--max-tool-rounds); the last calls were not run")
            return done, ran
        if not args.json:
            sys.stdout.write("\n")  # the call the model wrote ends its line before the results are said
        msgs.append({"role": "assistant", "content": done.text or None, "tool_calls": [c.to_openai() for c in calls]})
        for c in calls:
            result = (ToolResult.bounded(c, f"not run: {c.error}", is_error=True) if c.error else box.call(c))
            ran.append({"call": c.to_openai(), "source": box.provider_of(c.name), "result": result.content,
                        "is_error": result.is_error, "truncated": result.truncated})
            _say(args, f"{c.name} {json.dumps(c.arguments, ensure_ascii=False)} → "
                       f"{'error: ' if result.is_error else ''}{result.content}")
            msgs.append({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": result.content})
        # A forced call is for the user's turn; held to it after the results the model would
        # call again every round (OpenAI's clients send "auto" with the results).
        p = params if params.tool_choice in ("auto", "none") else replace(params, tool_choice="auto")
        done = drain(again(msgs, p), args)
    return done, ran


def _say(args, text: str) -> None:
    if not args.json:
        print(f"[tool] {plain_text(text, 300)}", file=sys.stderr, flush=True)
