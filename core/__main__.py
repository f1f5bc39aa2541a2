"""``python -m core``: the command line (see core/cli/)."""
import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["tools"]:
        # why: checking a tool must not wait seconds for torch (nor, for a built-in, the MCP SDK)
        from core.cli.tools import main as tools_main
        raise SystemExit(tools_main(sys.argv[1:]))
    from core.cli.main import main  # why: the other commands' parser imports torch
    raise SystemExit(main())
