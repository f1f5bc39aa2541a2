"""``python -m core tools list|call``: check an MCP configuration and the built-in tools from
the command line: which servers start, what tools (prompts, resources) they offer, and what
one call gives back.

:func:`toolbox_from_args` (over the options :mod:`core.cli.tool_opts` declares) is shared
with ``generate --mcp``: the same options build the same :class:`~core.tools.box.ToolBox`.

Exit status: 0; 1 when a server could not start (``list``) or the call failed (``call``),
the reason on stderr (or in the JSON); 2 for bad input (one line).

``python -m core tools`` runs from :func:`main` without the rest of the command line: it
imports no torch, and a built-in tool's call no MCP SDK (a second or more of start-up each).
"""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from core.cli.exits import Parser, guarded, write_stdout
from core.cli.tool_opts import add_tools_parser
from core.errors import SettingsError
from core.tools import config as mcp_config
from core.tools.box import ToolBox
from core.tools.builtin import BUILTIN_TOOLS, BuiltinTools
from core.tools.mcp_shapes import McpError
from core.tools.spec import ToolCall


def main(argv: list[str]) -> int:
    """``python -m core tools ...`` (``argv`` from "tools" on), as the full command line runs it."""
    def command() -> int:
        ap = Parser(prog="python -m core", description="LlamaDesk core: check MCP servers and built-in tools.")
        add_tools_parser(ap.add_subparsers(dest="cmd", required=True, parser_class=Parser))
        return cmd_tools(ap.parse_args(argv))
    return guarded(command)


def servers_from_args(args, hub=None) -> list:
    """The MCP servers (``core.tools.mcp_client.McpServer``) ``--mcp``/``--mcp-server`` name
    (none when there is no configuration)."""
    path = Path(args.mcp) if args.mcp else mcp_config.default_path()
    if not args.mcp and not path.exists():
        if args.mcp_server:
            raise SettingsError(f"--mcp-server {args.mcp_server[0]}: there is no MCP configuration ({path}); give --mcp")
        return []
    if args.mcp and not path.exists():
        raise SettingsError(f"--mcp: no file {path}")
    conf = mcp_config.load(path)
    missing = [n for n in args.mcp_server if n not in conf.servers]
    if missing:
        raise SettingsError(f"--mcp-server {missing[0]}: {path} has no such server "
                            f"(it has: {', '.join(conf.servers) or 'none'})")
    chosen = [conf.servers[n] for n in args.mcp_server] if args.mcp_server else conf.enabled()
    if not chosen:
        return []
    from core.tools.mcp_client import McpServer  # why: the MCP SDK takes seconds to import; only servers need it
    return [McpServer(s, hub=hub) for s in chosen]


def builtin_names(chosen: list[str]) -> list[str]:
    """``--builtin`` values as tool names, "all" standing for every built-in tool."""
    return list(BUILTIN_TOOLS) if "all" in chosen else list(dict.fromkeys(chosen))


def toolbox_from_args(args, hub=None, *, servers: bool = True) -> ToolBox:
    """A ToolBox of the built-in tools and MCP servers the options enable (servers start on
    first use; close the box when done). ``servers`` False: the built-in tools alone."""
    names = builtin_names(args.builtin)
    builtin = BuiltinTools(names, folders=args.allow_folder, timezone=args.timezone) if names else None
    providers = [*(servers_from_args(args, hub) if servers else []), *([builtin] if builtin else [])]
    return ToolBox(providers, timeout=getattr(args, "tool_timeout", None))


def cmd_tools(args) -> int:
    # a built-in tool called with no server named starts none (the default mcp.json's included)
    alone = args.tools_cmd == "call" and args.name in builtin_names(args.builtin) and not (args.mcp or args.mcp_server)
    box = toolbox_from_args(args, servers=not alone)
    try:
        return _list(box, args) if args.tools_cmd == "list" else _call(box, args)
    finally:
        box.close()


def _list(box: ToolBox, args) -> int:
    tools = box.tools()  # starts every server
    providers = []
    for p in box.providers:
        entry = {"name": p.name, "source": p.source, "tools": [t.name for t in tools if box.provider_of(t.name) == p.source]}
        if p.source.startswith("mcp:"):
            entry.update(kind=p.config.kind, target=p.config.target, status=p.status, error=p.error)
            if args.prompts and p.status == "ready":
                entry.update(_prompts_and_resources(p))
        providers.append(entry)
    failed = [p for p in providers if p.get("status") == "failed"]
    if args.json:
        write_stdout(json.dumps({"providers": providers, "notes": box.notes,
                                 "tools": [{**t.to_openai(), "source": t.source} for t in tools]},
                                ensure_ascii=False) + "\n")
    else:
        write_stdout(_table(providers, tools, box.notes))
    for p in failed:
        print(f"error: {p['error']}", file=sys.stderr)
    return 1 if failed else 0


def _prompts_and_resources(server) -> dict:
    out = {}
    try:
        out["prompts"] = [{"name": p.name, "description": p.description,
                           "arguments": [a.name + ("" if a.required else "?") for a in p.arguments]}
                          for p in server.prompts()]
    except McpError as e:
        out["prompts_error"] = str(e)
    try:
        out["resources"] = [{"uri": r.uri, "name": r.name, "mime_type": r.mime_type} for r in server.resources()]
    except McpError as e:
        out["resources_error"] = str(e)
    return out


def _table(providers: list[dict], tools, notes: list[str]) -> str:
    by_name = {t.name: t for t in tools}
    lines = []
    for p in providers:
        head = p["source"] if "status" not in p else f"{p['source']} ({p['kind']}: {p['target'][:80]})"
        state = "" if "status" not in p else f"  [{p['status']}]"
        lines.append(head + state)
        if p.get("error"):
            lines.append(f"  ! {p['error']}")
        for name in p["tools"]:
            desc = by_name[name].description.strip().splitlines()
            lines.append(f"  {name}" + (f" - {desc[0][:100]}" if desc else ""))
        for pr in p.get("prompts", []):
            lines.append(f"  prompt {pr['name']}({', '.join(pr['arguments'])})")
        for r in p.get("resources", []):
            lines.append(f"  resource {r['uri']} ({r['name']})")
    said = {p.get("error") for p in providers}  # a server's failure is said once, under the server
    lines += [f"note: {n}" for n in notes if n not in said]
    return "\n".join(lines) + "\n" if lines else "no tools: give --mcp CONFIG, or --builtin for the built-in tools\n"


def _call(box: ToolBox, args) -> int:
    try:
        arguments = json.loads(args.arguments)
    except ValueError as e:
        raise SettingsError(f"ARGS_JSON is not valid JSON: {e}") from None
    if not isinstance(arguments, dict):
        raise SettingsError("ARGS_JSON must be a JSON object, e.g. '{\"a\": 1}'")
    names = [t.name for t in box.tools()]
    if args.name not in names:
        raise SettingsError(f"no tool named '{args.name}' (the tools: {', '.join(names) or 'none'})"
                            + _builtin_hint(args.name) + "".join(f"; {n}" for n in box.notes))
    result = box.call(ToolCall(args.name, arguments), cancel=threading.Event())
    run = box.runs[-1]
    if args.json:
        write_stdout(json.dumps({"name": args.name, "provider": run.provider, "tool": run.tool,
                                 "content": result.content, "is_error": result.is_error,
                                 "truncated": result.truncated, "seconds": round(run.seconds, 4)},
                                ensure_ascii=False) + "\n")
    elif not result.is_error:
        write_stdout(result.content + ("" if result.content.endswith("\n") else "\n"))
    if result.is_error:
        print(f"error: {result.content.splitlines()[0] if result.content else 'the call failed'}", file=sys.stderr)
        return 1
    return 0


def _builtin_hint(name: str) -> str:
    # built-in tools are off unless named, which a first-time user cannot guess from "the tools: none"
    return f"; '{name}' is a built-in tool: add --builtin {name}" if name in BUILTIN_TOOLS else ""
