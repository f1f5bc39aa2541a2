"""``python -m core tools list|call``: a user checks an MCP configuration from the terminal."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.cli.tools import main as tools_main
from tests.core.cli.helpers import run_cli
from tests.helpers import ROOT
from tests.core.tools.mcp_servers import running_http_server
from tests.helpers import free_port


@pytest.fixture(scope="module")
def http_url():
    # over HTTP in this process: no server process to start per command (stdio is tested in tests/core/tools)
    url, stop = running_http_server(free_port(), token="t0ken")
    yield url
    stop()


@pytest.fixture
def config(tmp_path, http_url):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "local": {"url": http_url, "headers": {"Authorization": "Bearer t0ken"}},
        "ghost": {"command": "no-such-mcp-server-xyz"},
        "off": {"command": "whatever", "disabled": True}}}))
    return path


def test_list_starts_each_enabled_server_and_says_which_failed(capsys, config):
    rc, out, err = run_cli(capsys, "tools", "list", "--mcp", config, "--builtin", "calculator", "--prompts", "--json")
    got = json.loads(out)
    by_source = {p["source"]: p for p in got["providers"]}
    assert set(by_source) == {"mcp:local", "mcp:ghost", "builtin"}  # the disabled server is not started
    assert by_source["mcp:local"]["status"] == "ready" and "add" in by_source["mcp:local"]["tools"]
    assert by_source["mcp:local"]["prompts"][0]["name"] == "review"
    assert by_source["mcp:ghost"]["error"].startswith("MCP server 'ghost' did not start: no program")
    add = next(t for t in got["tools"] if t["function"]["name"] == "add")
    assert add["source"] == "mcp:local" and add["function"]["parameters"]["required"] == ["a", "b"]
    assert rc == 1 and err.strip().splitlines() == [f"error: {by_source['mcp:ghost']['error']}"]


def test_call_runs_one_tool_of_one_server(capsys, config):
    rc, out, err = run_cli(capsys, "tools", "call", "add", '{"a": 2, "b": 40}', "--mcp", config, "--mcp-server", "local",
                           "--json")
    assert rc == 0 and json.loads(out)["content"] == "42" and json.loads(out)["provider"] == "mcp:local"


def test_builtin_tools_without_a_config(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMADESK_CONFIG_DIR", str(tmp_path))
    assert run_cli(capsys, "tools", "call", "calculator", '{"expression": "2^64"}', "--builtin", "calculator") == (
        0, "18446744073709551616\n", "")
    rc, out, err = run_cli(capsys, "tools", "call", "calculator", '{"expression": "open(1)"}', "--builtin", "calculator")
    assert rc == 1 and err.startswith("error: the calculator does not know 'open'")


@pytest.mark.parametrize("argv, words", [
    (["call", "calculator", "{bad", "--builtin", "calculator"], "ARGS_JSON is not valid JSON"),
    (["call", "calculator", "[1]", "--builtin", "calculator"], "ARGS_JSON must be a JSON object"),
    (["call", "invented", "--builtin", "calculator"], "no tool named 'invented' (the tools: calculator)"),
    (["list", "--builtin", "shell"], "invalid choice: 'shell'"),
    (["list", "--mcp", "{missing}"], "--mcp: no file"),
    (["list", "--mcp", "{config}", "--mcp-server", "nope"], "--mcp-server nope: {config} has no such server"),
    (["list", "--mcp", "{broken}"], "not valid JSON"),
    (["list", "--mcp", "{badfield}"], "server 's': 'args' must be a list"),
])
def test_bad_input_exits_2_with_one_line(capsys, config, tmp_path, argv, words):
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "badfield.json").write_text('{"mcpServers": {"s": {"command": "x", "args": "y"}}}')
    names = {"config": config, "missing": tmp_path / "missing.json", "broken": tmp_path / "broken.json",
             "badfield": tmp_path / "badfield.json"}
    argv = ["tools", *[str(names[a[1:-1]]) if a[1:-1] in names else a for a in argv]]
    rc, out, err = run_cli(capsys, *argv)
    assert (rc, out) == (2, "") and len(err.splitlines()) == 1 and words.replace("{config}", str(config)) in err
    assert (tools_main(argv), *capsys.readouterr()) == (rc, out, err)  # python -m core tools' own start


# the child reports what it imported once the command ran (runpy: as python -m core runs it)
_PROBE = ("import runpy, sys\nsys.argv = ['core', *sys.argv[1:]]\ntry:\n    runpy.run_module('core', run_name='__main__')\n"
          "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules, 'mcp' in sys.modules, file=sys.stderr)\n")


def test_a_builtin_call_starts_without_torch_or_the_mcp_sdk(tmp_path):
    # a second, not 0.5: it measures a fresh interpreter's start (torch and the SDK took 7 s and 3 s here)
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"never": {"command": "no-such-mcp-server-xyz"}}}))
    env = {**os.environ, "LLAMADESK_CONFIG_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _PROBE, "tools", "call", "calculator", '{"expression": "6*7"}',
                           "--builtin", "calculator"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert (done.stdout, done.stderr) == ("42\n", "0 False False\n")  # the configured server was never started


def test_the_tool_options_fit_beside_generate_compare_and_serve():
    """generate --mcp takes the same options (toolbox_from_args): none may clash with theirs
    (--server is the remote backend's URL there, hence --mcp-server)."""
    import argparse

    from core.cli.main import build_parser
    from core.cli.tool_opts import add_tool_opts
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("compare", "serve"):  # generate has them (its tool rounds)
        add_tool_opts(sub.choices[name])
    args = sub.choices["generate"].parse_args(["m", "--prompt", "hi", "--server", "http://h", "--mcp-server", "files", "--builtin",
                                               "calculator"])
    assert (args.server, args.mcp_server, args.builtin) == ("http://h", ["files"], ["calculator"])
