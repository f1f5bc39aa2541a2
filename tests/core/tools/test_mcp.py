"""MCP servers as providers, against real servers built with the SDK's server API: one over
stdio (a child process that also writes lines that are not JSON-RPC on stdout), one over
streamable HTTP in this process; and misbehaving ones (never answers, exits mid-call, 10 MB,
invalid JSON-RPC, tools removed meanwhile). Each fault is one clear line naming the server,
and the provider stays usable."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from core.tools.box import ToolBox
from core.tools.builtin import BuiltinTools
from core.tools.config import ServerConfig
from core.tools.mcp_client import McpError, McpHub, McpServer, prompt_text
from core.tools.mcp_stdio import MAX_MESSAGE_BYTES
from core.tools.spec import ToolCall
from tests.core.tools.mcp_servers import BIG, running_http_server
from tests.helpers import free_port

SCRIPT = str(Path(__file__).with_name("mcp_servers.py"))


def stdio(name: str, mode: str = "stdio", **kw) -> ServerConfig:
    return ServerConfig(name, command=sys.executable, args=(SCRIPT, mode), **kw)


@pytest.fixture(scope="module")
def hub():
    hub = McpHub()
    yield hub
    hub.close()


@pytest.fixture(scope="module")
def server(hub):
    s = McpServer(stdio("local", "noisy", env={"GREETING": "hi there"}, timeout=10), hub=hub)
    s.start()
    yield s
    s.close()


def call(provider, tool, timeout=10.0, cancel=None, **args):
    return provider.call(ToolCall(tool, args), timeout=timeout, cancel=cancel)


def test_tools_are_listed_with_their_schemas_under_valid_names(server):
    tools = {t.name: t for t in server.list_tools()}
    assert [t.name for t in server.cached_tools()] == list(tools)
    assert {"add", "text_echo", "env", "hang", "die", "big"} <= set(tools)  # 'text.echo' made valid
    assert tools["add"].parameters["required"] == ["a", "b"] and tools["add"].source == "mcp:local"
    assert tools["add"].description == "Add two whole numbers."
    assert (call(server, "add", a=2, b=40).content, call(server, "text_echo", text="é").content) == ("42", "é")
    assert call(server, "env", name="GREETING").content == "hi there"  # the configured env reaches it
    assert server.status == "ready" and any("wrote 2 lines on stdout that are not MCP messages" in n for n in server.notes)


def test_prompts_and_resources(server):
    (prompt,) = server.prompts()
    assert (prompt.name, [(a.name, a.required) for a in prompt.arguments]) == ("review", [("code", True), ("language", False)])
    messages = server.get_prompt("review", {"code": "x = 1"})
    assert messages == [{"role": "user", "content": "Review this python code:\nx = 1"}]
    assert prompt_text(messages) == "Review this python code:\nx = 1"
    assert prompt_text([*messages, {"role": "assistant", "content": "ok"}]).endswith("\n\nassistant: ok")
    assert {r.uri for r in server.resources()} == {"note://readme", "note://long", "note://logo"}
    readme = server.read_resource("note://readme")
    assert (readme.text, readme.mime_type, readme.truncated) == ("# Read me\nhello from the server", "text/markdown", False)
    long = server.read_resource("note://long", limit=1000)
    assert long.truncated and long.text.startswith("y" * 1000) and "cut: the resource is 300,000" in long.text
    with pytest.raises(McpError, match="MCP server 'local': note://logo is binary"):
        server.read_resource("note://logo")


def test_a_call_that_never_answers_times_out_and_the_server_stays_usable(server):
    start = time.monotonic()
    result = call(server, "hang", timeout=0.5)
    assert result.is_error and result.content == "MCP server 'local': tool 'hang' did not answer within 0.5 s"
    assert time.monotonic() - start < 3
    assert call(server, "add", a=1, b=1).content == "2"


def test_cancel_stops_a_running_call_here_and_on_the_server(server, tmp_path):
    cancel, marker = threading.Event(), tmp_path / "cancelled"
    threading.Timer(0.2, cancel.set).start()
    start = time.monotonic()
    result = call(server, "hang", timeout=30, cancel=cancel, marker=str(marker))
    assert result.is_error and "cancelled" in result.content and time.monotonic() - start < 5
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the server process says so in a file; nothing to wait on but the file
    assert marker.read_text() == "cancelled"  # the SDK told the server, which stopped the tool
    assert call(server, "add", a=1, b=2).content == "3"


def test_a_10_mb_result_is_cut_and_says_so(server):
    result = call(server, "big", timeout=20)
    assert not result.is_error and result.truncated
    assert result.content.startswith("x" * 1000) and f"cut: the result was {BIG:,} characters" in result.content


def test_an_answer_over_the_message_bound_is_refused_at_once_and_the_server_stays(server):
    server.stats.max_message = 1 << 20
    try:
        start = time.monotonic()
        result = call(server, "big", timeout=20)
        assert result.is_error and result.content == (
            "MCP server 'local': tool 'big' failed: the server's answer is over 1 MB and was not read")
        assert time.monotonic() - start < 10 and server.stats.oversized == 1
        assert call(server, "add", a=1, b=2).content == "3"
    finally:
        server.stats.max_message = MAX_MESSAGE_BYTES


def test_concurrent_calls_from_threads_each_get_their_answer(server):
    results = {}

    def one(i):
        results[i] = call(server, "add", a=i, b=1000).content
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    assert results == {i: str(i + 1000) for i in range(8)}


def test_a_tool_removed_meanwhile_is_said(server):
    assert "spare" in {t.name for t in server.list_tools()}
    assert call(server, "drop", name="spare").content == "removed spare"
    result = call(server, "spare")
    assert result.is_error and "MCP server 'local' no longer offers the tool 'spare'" in result.content
    assert call(server, "invented").content.startswith("MCP server 'local' has no tool 'invented' (its tools: add,")


def test_a_server_that_exits_mid_call_is_said_and_restarts_on_next_use(server):
    result = call(server, "die")
    assert result.is_error and result.content.startswith("MCP server 'local' closed the connection")
    assert server.status == "failed"
    assert call(server, "add", a=5, b=5, timeout=30).content == "10"  # started again
    assert server.status == "ready"


def test_invalid_json_rpc_and_garbage_mid_session_are_said_and_the_session_goes_on(hub):
    s = McpServer(stdio("rogue", "rogue"), hub=hub)
    try:
        assert [t.name for t in s.list_tools()] == ["invalid", "garble"]
        bad = call(s, "invalid")
        assert bad.is_error and bad.content.startswith("MCP server 'rogue' sent an answer that is not valid MCP "
                                                       "(tool 'invalid')")
        assert call(s, "garble").content == "fine"
        assert s.stats.garbage_lines == 1 and s.stats.last_garbage == "<<garbage mid-session>>"
        assert call(s, "garble").content == "fine" and s.status == "ready"
        with pytest.raises(McpError, match="^MCP server 'rogue': prompt 'x' failed: Method not found$"):
            s.get_prompt("x")
    finally:
        s.close()


@pytest.mark.parametrize("config, words", [
    (stdio("mute", "silent", start_timeout=0.5), "MCP server 'mute' did not start within 0.5 s"),
    (stdio("liar", "liar"), "MCP server 'liar' sent an answer that is not valid MCP"),
    (ServerConfig("ghost", command="no-such-mcp-server-xyz"), "MCP server 'ghost' did not start: no program"),
    (ServerConfig("nobody", url=f"http://127.0.0.1:{free_port()}/mcp", start_timeout=5),
     "MCP server 'nobody' cannot be reached at http://127.0.0.1"),
])
def test_a_server_that_cannot_start_is_one_line_and_never_hangs(hub, config, words):
    s = McpServer(config, hub=hub)
    start = time.monotonic()
    assert s.tools() == [] and s.status == "failed"
    assert s.error.startswith(words) and "\n" not in s.error
    result = s.call(ToolCall("anything"))
    assert result.is_error and result.content.startswith(words)
    assert time.monotonic() - start < config.start_timeout * 2 + 3


@pytest.fixture(scope="module")
def http_url():
    url, stop = running_http_server(free_port(), token="s3cret")
    yield url
    stop()


def test_a_streamable_http_server_with_headers(hub, http_url):
    s = McpServer(ServerConfig("remote", url=http_url, headers={"Authorization": "Bearer s3cret"}), hub=hub)
    try:
        assert "add" in {t.name for t in s.list_tools()}
        assert call(s, "add", a=20, b=22).content == "42"
        assert s.get_prompt("review", {"code": "y"})[0]["content"].endswith("y")
        assert call(s, "hang", timeout=0.5).content == "MCP server 'remote': tool 'hang' did not answer within 0.5 s"
        assert call(s, "add", a=1, b=1).content == "2"
        big = call(s, "big", timeout=30)
        assert big.truncated and f"cut: the result was {BIG:,} characters" in big.content
    finally:
        s.close()
    wrong = McpServer(ServerConfig("locked", url=http_url, headers={"Authorization": "Bearer nope"}), hub=hub)
    assert wrong.tools() == [] and wrong.error.startswith("MCP server 'locked' answered HTTP 401")


def test_a_toolbox_routes_to_mcp_and_builtin_tools(server):
    box = ToolBox([server, BuiltinTools(["calculator"])])
    names = [t.name for t in box.tools()]
    assert "add" in names and "calculator" in names
    assert box.call(ToolCall("add", {"a": 3, "b": 4})).content == "7"
    assert box.runs[-1].provider == "mcp:local"


def test_an_http_server_that_exits_mid_call_is_said_then_unreachable(hub):
    import socket
    import subprocess
    port = free_port()
    child = subprocess.Popen([sys.executable, SCRIPT, "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.02)  # the child's port opens when it is ready; nothing else to wait on
        s = McpServer(ServerConfig("web", url=f"http://127.0.0.1:{port}/mcp"), hub=hub)
        assert call(s, "add", a=1, b=2).content == "3"
        died = call(s, "die")
        assert died.is_error and died.content == "MCP server 'web' closed the connection (tool 'die')"
        child.wait(10)
        gone = call(s, "add", a=1, b=2, timeout=5)
        assert gone.is_error and gone.content.startswith(f"MCP server 'web' cannot be reached at http://127.0.0.1:{port}")
        s.close()
    finally:
        child.kill()
        child.wait(10)
