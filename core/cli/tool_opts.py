"""The options that choose a chat's tools on the command line (``tools``, ``generate``),
declared without importing the MCP SDK: the parser is built on every start."""
from __future__ import annotations

from core.tools.builtin import BUILTIN_TOOLS


def add_tool_opts(p, *, call_timeout: bool = True) -> None:
    p.add_argument("--mcp", default=None, metavar="CONFIG",
                   help="an mcp.json in Claude Desktop's / LM Studio's shape (default: mcp.json in the "
                        "config folder, when there is one)")
    p.add_argument("--mcp-server", action="append", default=[], metavar="NAME",
                   help="use only this MCP server of the configuration, even a disabled one (repeatable)")
    # a bare --builtin (or --builtin all) is every built-in tool: a user looking for them need not know the names
    p.add_argument("--builtin", action="append", default=[], metavar="NAME", nargs="?", const="all",
                   choices=[*BUILTIN_TOOLS, "all"],
                   help="enable a built-in tool: " + ", ".join(BUILTIN_TOOLS) + " (repeatable); alone or 'all': "
                        "every one")
    p.add_argument("--allow-folder", action="append", default=[], metavar="FOLDER",
                   help="a folder read_file may read (repeatable)")
    p.add_argument("--timezone", default=None, metavar="ZONE", help="current_time's zone (default: this machine's)")
    if call_timeout:
        p.add_argument("--tool-timeout", type=float, default=None, metavar="S",
                       help="seconds one tool call may take (default: the server's 'timeout', else 60)")


def wants_toolbox(args) -> bool:
    """Tools that run here were named (--builtin, --mcp, --mcp-server)."""
    return bool(getattr(args, "builtin", None) or getattr(args, "mcp", None) or getattr(args, "mcp_server", None))


def add_tools_parser(sub) -> None:
    t = sub.add_parser("tools", help="list the MCP servers' and built-in tools, or call one (to check a config)")
    tsub = t.add_subparsers(dest="tools_cmd", required=True, parser_class=type(t))
    ls = tsub.add_parser("list", help="start each configured server and list its tools")
    add_tool_opts(ls, call_timeout=False)
    ls.add_argument("--prompts", action="store_true", help="list the servers' prompts and resources too")
    ls.add_argument("--json", action="store_true", help="print one JSON object")
    c = tsub.add_parser("call", help="call one tool and print its result")
    c.add_argument("name", help="the tool, as 'tools list' names it")
    c.add_argument("arguments", nargs="?", default="{}", metavar="ARGS_JSON",
                   help="the arguments as a JSON object (default: {})")
    add_tool_opts(c)
    c.add_argument("--json", action="store_true", help="print one JSON object")
