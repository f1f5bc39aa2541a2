"""A first-time user's commands for tools and documents: what they type before they know
the exact flags, and the answers that must not be silent or misleading."""
import json

import pytest

from core.tools.builtin import BUILTIN_TOOLS
from tests.core.cli.helpers import run_cli
from tests.helpers import ROOT


@pytest.fixture
def no_config(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMADESK_CONFIG_DIR", str(tmp_path))


@pytest.mark.parametrize("flag", [["--builtin"], ["--builtin", "all"]])
def test_bare_builtin_lists_every_builtin_tool(capsys, tmp_path, no_config, flag):
    rc, out, err = run_cli(capsys, "tools", "list", *flag, "--allow-folder", tmp_path, "--json")
    assert rc == 0 and err == ""
    assert [t["function"]["name"] for t in json.loads(out)["tools"]] == list(BUILTIN_TOOLS)


def test_calling_a_builtin_not_enabled_says_how(capsys, no_config):
    rc, out, err = run_cli(capsys, "tools", "call", "calculator", '{"expression": "2^10"}')
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "'calculator' is a built-in tool: add --builtin calculator" in err
    assert run_cli(capsys, "tools", "call", "calculator", '{"expression": "2^10"}', "--builtin")[:2] == (0, "1024\n")


def test_a_failed_server_is_said_once_in_the_table(capsys, tmp_path, no_config):
    conf = tmp_path / "mcp.json"
    conf.write_text(json.dumps({"mcpServers": {"ghost": {"command": "no-such-mcp-server-xyz"}}}))
    rc, out, err = run_cli(capsys, "tools", "list", "--mcp", conf)
    assert rc == 1 and out.count("did not start") == 1 and err.count("did not start") == 1


def test_search_with_an_empty_query_is_bad_input(capsys, tmp_path):
    rc, out, err = run_cli(capsys, "documents", "search", "  ", "--store", tmp_path / "h.sqlite3")
    assert rc == 2 and out == "" and err.startswith("error: QUERY is empty")


def test_search_without_a_match_says_so(capsys, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("Llamas hum when calm.\n")
    s = ["--store", tmp_path / "h.sqlite3"]
    assert run_cli(capsys, "documents", "index", tmp_path / "docs", *s)[0] == 0
    rc, out, err = run_cli(capsys, "documents", "search", "zebra", *s)
    assert (rc, out, err) == (0, "", "no passage matches 'zebra'\n")
    assert run_cli(capsys, "documents", "search", "llamas", *s)[1].startswith("[1] a.md")


def test_a_missing_file_is_named_first(capsys, tmp_path, fixtures):
    missing = tmp_path / "notes.txt"
    rc, out, err = run_cli(capsys, "generate", fixtures / "stories260K.gguf", "--prompt", "q", "--max-new-tokens", "2",
                           "--store", tmp_path / "h.sqlite3", "--attach", missing)
    assert (rc, out, err) == (2, "", f"error: {missing}: file not found\n")  # was "file not found in PATH"


def test_a_tool_call_cut_short_is_said(capsys, tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]))
    rc, out, err = run_cli(capsys, "generate", ROOT / "assets" / "models" / "llamadesk-demo", "--chat", "--prompt",
                           "Paris?", "--tools", tools, "--tool-choice", "required", "--max-new-tokens", "3", "--json")
    got = json.loads(out)
    assert rc == 0 and got["stop_reason"] == "length" and "tool_calls" not in got
    assert got["note"] == "the reply reached --max-new-tokens in the middle of a tool call, so no tool was called"
    assert err == f"note: {got['note']}\n"


def test_the_cut_call_note_starts_its_own_line(monkeypatch, tmp_path):
    import io
    import sys

    from core.cli.main import main
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]))
    both = io.StringIO()  # stdout and stderr as a terminal interleaves them
    monkeypatch.setattr(sys, "stdout", both)
    monkeypatch.setattr(sys, "stderr", both)
    rc = main(["generate", str(ROOT / "assets" / "models" / "llamadesk-demo"), "--chat", "--prompt", "x",
               "--tools", str(tools), "--tool-choice", "required", "--max-new-tokens", "2"])
    assert rc == 0 and "\nnote: the reply reached --max-new-tokens" in both.getvalue()
