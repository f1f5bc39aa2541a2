"""The user's MCP servers: ``mcp.json`` in the config folder, in the shape Claude Desktop, LM
Studio and Cursor use, so an existing configuration can be pasted as it is::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                  "env": {"DEBUG": "1"}},
        "search": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer …"}}}}

Our own optional keys per server: ``disabled`` (kept but not started), ``timeout`` (seconds
one call may take, default 60) and ``startTimeout`` (seconds to start and handshake, default
30; ``npx`` may download first). ``type`` is accepted as other apps write it (``stdio``,
``http``, ``streamable-http``); ``sse`` servers are refused by name. Keys we do not use are
kept on save, at the top level and per server, so the file stays usable by the app it came from.

Every field is checked on load and on save; an error is one line naming the file, the server
and the field. Writes are transactional: a temporary file beside the target, fsync, rename.
"""
from __future__ import annotations

import json
import math
import os
import re
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from core.limits import MAX_CONFIG_BYTES, parse_json, read_limited
from core.paths import config_dir
from core.tools.spec import ToolError

__all__ = ["McpConfigError", "ServerConfig", "McpConfig", "CONFIG_FILE", "default_path", "load", "parse",
           "save", "DEFAULT_TIMEOUT", "DEFAULT_START_TIMEOUT"]

CONFIG_FILE = "mcp.json"
DEFAULT_TIMEOUT = 60.0
DEFAULT_START_TIMEOUT = 30.0
MAX_TIMEOUT = 3600.0
MAX_SERVERS = 64
MAX_NAME = 64
MAX_ARGS = 256
MAX_TEXT = 8192  # one command, argument, env value, URL or header value
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")  # RFC 9110 token
_ENV_NAME = re.compile(r"^[^=\x00]{1,256}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_STDIO_KEYS = ("command", "args", "env", "cwd")
_HTTP_KEYS = ("url", "headers")
_OWN_KEYS = ("type", "disabled", "timeout", "startTimeout")
_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http",
          "streamable_http": "http"}


class McpConfigError(ToolError):
    """An MCP configuration that cannot be used; the message names the server and the field."""


@dataclass(frozen=True)
class ServerConfig:
    """One server: a command to start (stdio) or a URL (streamable HTTP)."""
    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    disabled: bool = False
    timeout: float = DEFAULT_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    extra: dict[str, Any] = field(default_factory=dict)  # keys other apps wrote; kept on save

    @property
    def kind(self) -> str:
        return "http" if self.url else "stdio"

    @property
    def target(self) -> str:
        """What the server is, in a few words: its command line or URL (headers not shown)."""
        return self.url if self.url else " ".join([self.command, *self.args])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        if self.url:
            out["url"] = self.url
            if self.headers:
                out["headers"] = dict(self.headers)
        else:
            out["command"] = self.command
            out["args"] = list(self.args)
            if self.env:
                out["env"] = dict(self.env)
            if self.cwd:
                out["cwd"] = self.cwd
        if self.disabled:
            out["disabled"] = True
        if self.timeout != DEFAULT_TIMEOUT:
            out["timeout"] = self.timeout
        if self.start_timeout != DEFAULT_START_TIMEOUT:
            out["startTimeout"] = self.start_timeout
        return out

    @classmethod
    def from_json(cls, name: object, obj: object, *, source: str = CONFIG_FILE) -> "ServerConfig":
        name = _check_name(name, source)
        where = f"{source}: server '{name}'"
        if not isinstance(obj, dict):
            raise McpConfigError(f"{where} must be an object with a command or a url")
        kind = _kind(obj, where)
        known = {*_OWN_KEYS, *(_STDIO_KEYS if kind == "stdio" else _HTTP_KEYS)}
        wrong = [k for k in (_HTTP_KEYS if kind == "stdio" else _STDIO_KEYS) if k in obj]
        if wrong:
            raise McpConfigError(f"{where}: '{wrong[0]}' does not go with "
                                 f"{'a command' if kind == 'stdio' else 'a url'}; give one or the other")
        extra = {k: v for k, v in obj.items() if k not in known}
        common = dict(disabled=_bool(obj.get("disabled", False), where, "disabled"),
                      timeout=_seconds(obj.get("timeout", DEFAULT_TIMEOUT), where, "timeout"),
                      start_timeout=_seconds(obj.get("startTimeout", DEFAULT_START_TIMEOUT), where, "startTimeout"),
                      extra=extra)
        if kind == "http":
            return cls(name, url=_url(obj.get("url"), where), headers=_headers(obj.get("headers", {}), where),
                       **common)
        return cls(name, command=_text(obj.get("command"), where, "command"),
                   args=_args(obj.get("args", []), where), env=_env(obj.get("env", {}), where),
                   cwd=_text(obj["cwd"], where, "cwd") if obj.get("cwd") not in (None, "") else "", **common)


@dataclass(frozen=True)
class McpConfig:
    """The whole file: the servers by name, in file order, and the keys we do not use."""
    servers: dict[str, ServerConfig] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def enabled(self) -> list[ServerConfig]:
        return [s for s in self.servers.values() if not s.disabled]

    def with_server(self, server: ServerConfig, *, old_name: str | None = None) -> "McpConfig":
        """A copy with ``server`` added, or replacing ``old_name`` (a rename keeps its place)."""
        if not isinstance(server, ServerConfig):
            raise McpConfigError("a server must be a ServerConfig")
        ServerConfig.from_json(server.name, server.to_json())  # the same checks a file gets
        old = old_name if old_name is not None else server.name
        if server.name != old and server.name in self.servers:
            raise McpConfigError(f"a server named '{server.name}' already exists")
        if old not in self.servers and len(self.servers) >= MAX_SERVERS:
            raise McpConfigError(f"at most {MAX_SERVERS} MCP servers")
        items = [(server.name, server) if n == old else (n, s) for n, s in self.servers.items()]
        if old not in self.servers:
            items.append((server.name, server))
        return replace(self, servers=dict(items))

    def without(self, name: str) -> "McpConfig":
        return replace(self, servers={n: s for n, s in self.servers.items() if n != name})

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "mcpServers": {n: s.to_json() for n, s in self.servers.items()}}


def default_path() -> Path:
    return config_dir() / CONFIG_FILE


def parse(data: str | bytes | dict, *, source: str = CONFIG_FILE) -> McpConfig:
    """A configuration from the file's text (or its parsed object). A bare
    ``{"name": {...}}`` without ``mcpServers`` is taken too (what some READMEs show)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    obj = parse_json(data, file=source, error=McpConfigError) if isinstance(data, bytes) else data
    if not isinstance(obj, dict):
        raise McpConfigError(f"{source}: must be a JSON object with \"mcpServers\"")
    if "mcpServers" in obj:
        servers, extra = obj["mcpServers"], {k: v for k, v in obj.items() if k != "mcpServers"}
    elif obj and all(isinstance(v, dict) and ("command" in v or "url" in v) for v in obj.values()):
        servers, extra = obj, {}
    else:
        raise McpConfigError(f"{source}: has no \"mcpServers\" object")
    if not isinstance(servers, dict):
        raise McpConfigError(f"{source}: \"mcpServers\" must be an object of servers by name")
    if len(servers) > MAX_SERVERS:
        raise McpConfigError(f"{source}: at most {MAX_SERVERS} servers, got {len(servers)}")
    return McpConfig({str(n): ServerConfig.from_json(n, s, source=source) for n, s in servers.items()}, extra)


def load(path: str | Path | None = None) -> McpConfig:
    """The configuration at ``path`` (default: ``mcp.json`` in the config folder); a file
    that does not exist yet is an empty configuration."""
    path = Path(path) if path is not None else default_path()
    if not path.exists() and not path.is_symlink():
        return McpConfig()
    return parse(read_limited(path, MAX_CONFIG_BYTES, error=McpConfigError), source=str(path))


_write_lock = threading.Lock()


def save(config: McpConfig, path: str | Path | None = None) -> Path:
    """Write ``config`` (checked again first) so that a crash leaves the old file or the new
    one, never half of one."""
    path = Path(path) if path is not None else default_path()
    text = json.dumps(config.to_json(), indent=2, ensure_ascii=False) + "\n"
    parse(text, source=str(path))  # what we write must load
    with _write_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise McpConfigError(f"cannot write {path}: {e.strerror or e}") from None
        _fsync_folder(path.parent)
    return path


def _fsync_folder(folder: Path) -> None:
    try:  # the rename itself survives a power cut only once the folder is synced (POSIX)
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # Windows and some file systems cannot sync a folder
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- field checks

def _check_name(name: object, source: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or _CONTROL.search(name):
        raise McpConfigError(f"{source}: a server name must be 1-{MAX_NAME} printable characters, "
                             f"got {str(name)[:40]!r}")
    return name


def _kind(obj: dict, where: str) -> str:
    declared = obj.get("type")
    if declared is not None:
        if declared == "sse":
            raise McpConfigError(f"{where}: 'sse' servers are not supported; use the server's "
                                 "streamable HTTP endpoint (often /mcp)")
        if declared not in _TYPES:
            raise McpConfigError(f"{where}: 'type' must be stdio or http, got {str(declared)[:40]!r}")
    if "url" in obj and "command" in obj:
        raise McpConfigError(f"{where}: give either a command or a url, not both")
    kind = "http" if "url" in obj else "stdio" if "command" in obj else None
    if kind is None:
        raise McpConfigError(f"{where}: needs a 'command' (a program to start) or a 'url'")
    if declared is not None and _TYPES[declared] != kind:
        raise McpConfigError(f"{where}: 'type' {declared} does not match its "
                             f"{'url' if kind == 'http' else 'command'}")
    return kind


def _text(value: object, where: str, key: str, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise McpConfigError(f"{where}: '{key}' must be text, got {type(value).__name__}")
    if (not empty and not value.strip()) or len(value) > MAX_TEXT or "\x00" in value:
        raise McpConfigError(f"{where}: '{key}' must be non-empty text under {MAX_TEXT:,} characters")
    return value


def _args(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_ARGS:
        raise McpConfigError(f"{where}: 'args' must be a list of at most {MAX_ARGS} texts")
    for i, a in enumerate(value):
        _text(a, where, f"args[{i}]", empty=True)
    return tuple(value)


def _string_map(value: object, where: str, key: str, name_ok) -> dict[str, str]:
    if not isinstance(value, dict):
        raise McpConfigError(f"{where}: '{key}' must be an object of texts")
    for k, v in value.items():
        if not name_ok(k):
            raise McpConfigError(f"{where}: '{key}' has an invalid name {str(k)[:40]!r}")
        if not isinstance(v, str):
            raise McpConfigError(f"{where}: '{key}.{k}' must be text, got {type(v).__name__}")
        _text(v, where, f"{key}.{k}", empty=True)
    return dict(value)


def _env(value: object, where: str) -> dict[str, str]:
    return _string_map(value, where, "env", lambda k: bool(_ENV_NAME.match(k)))


def _headers(value: object, where: str) -> dict[str, str]:
    out = _string_map(value, where, "headers", lambda k: bool(_HEADER_NAME.match(k)))
    for k, v in out.items():
        if "\r" in v or "\n" in v:
            raise McpConfigError(f"{where}: 'headers.{k}' must be one line")
    return out


def _url(value: object, where: str) -> str:
    text = _text(value, where, "url")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or _CONTROL.search(text) or " " in text:
        raise McpConfigError(f"{where}: 'url' must be an http:// or https:// address, got {text[:60]!r}")
    return text


def _bool(value: object, where: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise McpConfigError(f"{where}: '{key}' must be true or false")
    return value


def _seconds(value: object, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_TIMEOUT:
        raise McpConfigError(f"{where}: '{key}' must be seconds, more than 0 and at most {MAX_TIMEOUT:g}")
    return float(value)
