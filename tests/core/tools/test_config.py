"""mcp.json: Claude Desktop's / LM Studio's shape loads as pasted, every field is checked
with one line naming the server and the field, and writes are all-or-nothing."""
from __future__ import annotations

import json
import os

import pytest

from core.tools import config as cfg
from core.tools.config import McpConfig, McpConfigError, ServerConfig

CLAUDE = {  # as Claude Desktop's documentation shows it, plus another app's key
    "globalShortcut": "Ctrl+Space",
    "mcpServers": {
        "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
        "github": {"command": "docker", "args": ["run", "-i", "ghcr.io/github/github-mcp-server"],
                   "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "x"}},
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer t"},
                   "timeout": 5, "disabled": True, "type": "http"},
    }}


def test_a_pasted_claude_desktop_config_loads_and_round_trips(tmp_path):
    conf = cfg.parse(json.dumps(CLAUDE))
    fs, gh, remote = conf.servers.values()
    assert fs.kind == "stdio" and fs.args[0] == "-y" and gh.env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "x"}
    assert remote.kind == "http" and remote.headers["Authorization"] == "Bearer t" and remote.timeout == 5.0
    assert [s.name for s in conf.enabled()] == ["filesystem", "github"]
    path = cfg.save(conf, tmp_path / "mcp.json")
    written = json.loads(path.read_text())
    assert written["globalShortcut"] == "Ctrl+Space"  # the other app's key is kept
    assert cfg.load(path) == conf


def test_the_default_file_is_in_the_config_folder_and_missing_means_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMADESK_CONFIG_DIR", str(tmp_path))
    assert cfg.default_path() == tmp_path / "mcp.json"
    assert cfg.load() == McpConfig()
    cfg.save(McpConfig().with_server(ServerConfig("s", command="python")))
    assert list(cfg.load().servers) == ["s"]


def test_a_bare_servers_object_is_taken_too():
    assert list(cfg.parse({"a": {"command": "x"}}).servers) == ["a"]


@pytest.mark.parametrize("server, words", [
    ({"args": ["x"]}, "server 'bad': needs a 'command'"),
    ({"command": "x", "url": "http://h"}, "server 'bad': give either a command or a url"),
    ({"command": ""}, "server 'bad': 'command' must be non-empty"),
    ({"command": "x", "args": "a b"}, "server 'bad': 'args' must be a list"),
    ({"command": "x", "args": ["ok", 3]}, r"server 'bad': 'args\[1\]' must be text"),
    ({"command": "x", "env": {"K": 1}}, "server 'bad': 'env.K' must be text"),
    ({"command": "x", "headers": {}}, "server 'bad': 'headers' does not go with a command"),
    ({"url": "ftp://h/mcp"}, "server 'bad': 'url' must be an http:// or https://"),
    ({"url": "http://h", "headers": {"Bad Name": "v"}}, "server 'bad': 'headers' has an invalid name"),
    ({"url": "http://h", "headers": {"X": "a\r\nEvil: 1"}}, "server 'bad': 'headers.X' must be one line"),
    ({"url": "http://h", "type": "sse"}, "server 'bad': 'sse' servers are not supported"),
    ({"command": "x", "type": "http"}, "server 'bad': 'type' http does not match"),
    ({"command": "x", "timeout": 0}, "server 'bad': 'timeout' must be seconds"),
    ({"command": "x", "timeout": True}, "server 'bad': 'timeout' must be seconds"),
    ({"command": "x", "startTimeout": float("inf")}, "server 'bad': 'startTimeout' must be seconds"),
    ({"command": "x", "disabled": "no"}, "server 'bad': 'disabled' must be true or false"),
    ("npx", "server 'bad' must be an object"),
])
def test_each_bad_field_is_one_line_naming_server_and_field(server, words):
    with pytest.raises(McpConfigError, match=words) as err:
        cfg.parse({"mcpServers": {"ok": {"command": "x"}, "bad": server}}, source="mcp.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("mcp.json: ")


@pytest.mark.parametrize("text, words", [
    ("{", "not valid JSON"), ("[]", "must be a JSON object"), ('{"x": 1}', "has no \"mcpServers\""),
    ('{"mcpServers": []}', "must be an object of servers"), ('{"mcpServers": {"": {"command": "x"}}}', "server name"),
])
def test_a_bad_file_says_what_is_wrong(text, words):
    with pytest.raises(McpConfigError, match=words):
        cfg.parse(text)


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = cfg.save(McpConfig().with_server(ServerConfig("old", command="x")), tmp_path / "mcp.json")
    before = path.read_bytes()

    def boom(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(McpConfigError, match="cannot write .*No space left"):
        cfg.save(McpConfig().with_server(ServerConfig("new", command="y")), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["mcp.json"]  # no temporary file left behind


def test_edits_keep_order_refuse_clashes_and_check_fields():
    conf = McpConfig().with_server(ServerConfig("a", command="x")).with_server(ServerConfig("b", url="http://h/mcp"))
    renamed = conf.with_server(ServerConfig("a2", command="z"), old_name="a")
    assert list(renamed.servers) == ["a2", "b"] and renamed.servers["a2"].command == "z"
    with pytest.raises(McpConfigError, match="already exists"):
        conf.with_server(ServerConfig("b", command="z"), old_name="a")
    with pytest.raises(McpConfigError, match="'url' must be an http"):
        conf.with_server(ServerConfig("c", url="file:///etc/passwd"))
    assert list(conf.without("a").servers) == ["b"]


def test_a_config_file_that_is_a_folder_is_refused_in_one_line(tmp_path):
    (tmp_path / "mcp.json").mkdir()
    with pytest.raises(McpConfigError, match="folder"):
        cfg.load(tmp_path / "mcp.json")
