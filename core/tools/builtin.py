"""Built-in tools, each off until the user enables it for a chat: a calculator, the current
date and time, reading a file inside folders the user allowed, and fetching a URL.

Nothing here runs code the model wrote: the calculator parses with :mod:`ast` and walks an
allow-list of number, operator and function nodes, with bounds on size and exponents; the
file reader resolves symlinks before checking the folder, then opens from the folder down
following no link, and reads text only, size-bounded; the fetcher speaks http/https only
(redirects included), with a timeout and a size bound, connects only to the addresses it
checked (none on this machine or its network unless allowed), and is off without a network
(:mod:`core.tools.guarded_io`).
"""
from __future__ import annotations

import ast
import datetime as dt
import errno
import json
import math
import operator
import os
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.errors import one_line
from core.tools.guarded_io import open_inside, pinned_opener
from core.tools.spec import MAX_RESULT_CHARS, Tool, ToolCall, ToolError, ToolResult

__all__ = ["BuiltinTools", "BUILTIN_TOOLS", "calculate", "has_network", "CalcError"]

MAX_EXPRESSION = 1000  # characters
MAX_NODES = 300
MAX_INT_BITS = 4096  # about 1233 digits: anything larger is not a calculator answer
MAX_FACTORIAL = 450
MAX_FILE_BYTES = 1 << 20
MAX_FETCH_BYTES = 2 << 20
USER_AGENT = "LlamaDesk (fetch tool)"


class CalcError(ToolError):
    """An expression the calculator does not take (not maths, too large, undefined)."""


# ----------------------------------------------------------------------------- calculator

def _pow(a, b):
    if isinstance(a, int) and isinstance(b, int) and b > 0 and a not in (0, 1, -1) \
            and b * max(a.bit_length(), 1) > MAX_INT_BITS:
        raise CalcError(f"{a}^{b} is too large")
    out = a ** b
    if isinstance(out, complex):
        raise CalcError("a negative number to a fractional power has no real value")
    return out


def _factorial(n):
    if not isinstance(n, int) and not (isinstance(n, float) and n.is_integer()):
        raise CalcError("factorial takes a whole number")
    if not 0 <= n <= MAX_FACTORIAL:
        raise CalcError(f"factorial takes 0 to {MAX_FACTORIAL}")
    return math.factorial(int(n))


_BINARY: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: _pow,
    ast.BitXor: _pow,  # '^' means power on a calculator, and models write it so
}
_UNARY: dict[type, Callable] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable] = {
    "sqrt": math.sqrt, "cbrt": lambda x: math.copysign(abs(x) ** (1 / 3), x), "exp": math.exp,
    "log": math.log, "ln": math.log, "log10": math.log10, "log2": math.log2,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "atan2": math.atan2, "sinh": math.sinh, "cosh": math.cosh, "tanh": math.tanh, "hypot": math.hypot,
    "degrees": math.degrees, "radians": math.radians, "abs": abs, "round": round, "floor": math.floor,
    "ceil": math.ceil, "min": min, "max": max, "factorial": _factorial, "gcd": math.gcd,
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def calculate(expression: str) -> int | float:
    """The value of an arithmetic ``expression`` (``2^10``, ``sqrt(2)*pi``, ``15% of``-free
    plain maths), or :class:`CalcError` saying why not."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalcError("give an expression, e.g. 2*(3+4)")
    if len(expression) > MAX_EXPRESSION:
        raise CalcError(f"the expression is over {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip().replace("×", "*").replace("÷", "/"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError(f"not an arithmetic expression: {expression[:80]!r}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError("the expression is too long")
    try:
        value = _eval(tree.body)
    except CalcError:
        raise
    except ZeroDivisionError:
        raise CalcError("division by zero") from None
    except OverflowError:
        raise CalcError("the result is too large") from None
    except (ValueError, TypeError) as e:
        raise CalcError(f"undefined: {one_line(e, 120)}") from None
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalcError("the result is too large")
    return value


def _eval(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        out = _BINARY[type(node.op)](_eval(node.left), _eval(node.right))
        if isinstance(out, int) and out.bit_length() > MAX_INT_BITS:
            raise CalcError("the result is too large")
        return out
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS \
            and not node.keywords and len(node.args) <= 8:
        return _FUNCTIONS[node.func.id](*(_eval(a) for a in node.args))
    what = node.id if isinstance(node, ast.Name) else type(node).__name__
    if isinstance(node, ast.Call):
        what = node.func.id if isinstance(node.func, ast.Name) else "calls of that kind"
    raise CalcError(f"the calculator does not know {what!r}; it takes numbers, + - * / // % ^, "
                    f"parentheses, pi, e and {', '.join(sorted(_FUNCTIONS))}")


def _show_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


# ----------------------------------------------------------------------------- network

def has_network() -> bool:
    """Whether this machine has a route off itself: connecting a UDP socket sends nothing,
    it only asks the kernel for a route (instant, no DNS)."""
    for family, addr in ((socket.AF_INET, ("192.0.2.1", 53)), (socket.AF_INET6, ("2001:db8::1", 53))):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(addr)
                return True
        except OSError:
            continue
    return False


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(newurl).scheme not in ("http", "https"):
            raise ToolError(f"the page redirected to a non-http address: {newurl[:80]}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


# ----------------------------------------------------------------------------- the provider

BUILTIN_TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("calculator", "Evaluate an arithmetic expression exactly, e.g. (17*23)^2 or sqrt(2)*pi.",
         {"type": "object", "properties": {"expression": {"type": "string", "description": "the expression"}},
          "required": ["expression"]}, "builtin"),
    Tool("current_time", "The current date and time, in the user's time zone unless another is named.",
         {"type": "object", "properties": {"timezone": {
             "type": "string", "description": "an IANA time zone such as Europe/Paris (optional)"}}}, "builtin"),
    Tool("read_file", "Read a text file from the folders the user allowed.",
         {"type": "object", "properties": {"path": {"type": "string", "description": "the file's path"}},
          "required": ["path"]}, "builtin"),
    Tool("fetch_url", "Fetch a web page (http or https) and return its text.",
         {"type": "object", "properties": {"url": {"type": "string", "description": "the address"}},
          "required": ["url"]}, "builtin"),
)}


class BuiltinTools:
    """The built-in tools named in ``enabled`` (none by default).

    ``folders``: where read_file may read (symlinks resolved on both sides); ``timezone``: the
    user's IANA zone (default: this machine's); ``network``: whether fetch_url may be offered
    (None: ask the machine); ``allow_private``: let fetch_url reach this machine and private
    networks (tests, a local docs server)."""

    name = source = "builtin"

    def __init__(self, enabled: Iterable[str] = (), *, folders: Iterable[str | Path] = (),
                 timezone: str | None = None, network: bool | None = None, allow_private: bool = False,
                 max_file_bytes: int = MAX_FILE_BYTES, max_fetch_bytes: int = MAX_FETCH_BYTES):
        self.enabled = tuple(enabled)
        unknown = [n for n in self.enabled if n not in BUILTIN_TOOLS]
        if unknown:
            raise ToolError(f"no built-in tool named {unknown[0]!r}; there are {', '.join(BUILTIN_TOOLS)}")
        self.folders = tuple(Path(os.path.realpath(f)) for f in folders)
        if timezone is not None:
            _zone(timezone)
        self.timezone = timezone
        self.network = network
        self.allow_private = allow_private
        self.max_file_bytes, self.max_fetch_bytes = max_file_bytes, max_fetch_bytes
        self.notes: list[str] = []  # why an enabled tool is not offered
        self._run = {"calculator": self._calculator, "current_time": self._current_time,
                     "read_file": self._read_file, "fetch_url": self._fetch_url}

    def tools(self) -> list[Tool]:
        self.notes = []
        out = []
        for name in self.enabled:
            if name == "fetch_url" and not (self.network if self.network is not None else has_network()):
                self.notes.append("fetch_url is off: this machine has no network")
                continue
            if name == "read_file" and not self.folders:
                self.notes.append("read_file is off: no folder is allowed yet")
                continue
            out.append(BUILTIN_TOOLS[name])
        return out

    def call(self, call: ToolCall, *, cancel: threading.Event | None = None, timeout: float = 30.0) -> ToolResult:
        if call.name not in self.enabled:
            return ToolResult.bounded(call, f"the built-in tool {call.name!r} is not enabled in this chat",
                                      is_error=True)
        if call.error:
            return ToolResult.bounded(call, f"the call's arguments are not valid JSON: {call.error}", is_error=True)
        try:
            text = self._run[call.name](call.arguments, cancel or threading.Event(), timeout)
        except ToolError as e:
            return ToolResult.bounded(call, str(e), is_error=True)
        except Exception as e:  # a tool fails as a result, never as an exception (see ToolProvider)
            return ToolResult.bounded(call, f"{call.name} failed: {one_line(e)}", is_error=True)
        return ToolResult.bounded(call, text)

    # each tool: arguments -> text, or ToolError
    def _calculator(self, args: dict, cancel, timeout) -> str:
        return _show_number(calculate(_arg(args, "expression")))

    def _current_time(self, args: dict, cancel, timeout) -> str:
        zone_name = args.get("timezone") or self.timezone
        now = dt.datetime.now(_zone(zone_name)) if zone_name else dt.datetime.now().astimezone()
        label = zone_name or now.tzname() or "local time"
        return json.dumps({"datetime": now.isoformat(timespec="seconds"), "weekday": now.strftime("%A"),
                           "timezone": label})

    def _read_file(self, args: dict, cancel, timeout) -> str:
        if not self.folders:
            raise ToolError("read_file: no folder is allowed; the user can allow one in the chat's tools")
        raw = _arg(args, "path")
        path = Path(raw).expanduser()
        if not path.is_absolute():
            path = self.folders[0] / path
        real = Path(os.path.realpath(path))
        inside = [f for f in self.folders if real == f or f in real.parents]
        if not inside:
            raise ToolError(f"read_file: {raw[:120]} is outside the allowed folders "
                            f"({', '.join(str(f) for f in self.folders)})")
        if not real.exists():
            raise ToolError(f"read_file: no file {raw[:120]}")
        # opened from the folder down, following no link: what was checked is what is read
        fd = open_inside(inside[0], real, raw)
        try:
            size = os.fstat(fd).st_size
            data = os.read(fd, min(size, self.max_file_bytes) + 1)
        finally:
            os.close(fd)
        if b"\x00" in data[:8192]:
            raise ToolError(f"read_file: {raw[:120]} is not a text file")
        text = data[:self.max_file_bytes].decode("utf-8", "replace")
        if size > self.max_file_bytes:
            text += f"\n[… cut: the file is {size:,} bytes, only the first {self.max_file_bytes:,} were read]"
        return text

    def _fetch_url(self, args: dict, cancel: threading.Event, timeout: float) -> str:
        url = _arg(args, "url")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ToolError(f"fetch_url takes http:// and https:// addresses only, got {url[:80]!r}")
        # each connection (redirects too) resolves once, checks the addresses, connects to one
        opener = pinned_opener(_HttpOnlyRedirects, allow_private=self.allow_private)
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        try:
            with opener.open(request, timeout=timeout) as resp:
                body, cut = _read_bounded(resp, self.max_fetch_bytes, cancel)
                ctype = resp.headers.get("Content-Type", "")
                charset = resp.headers.get_content_charset() or "utf-8"
        except urllib.error.HTTPError as e:
            raise ToolError(f"fetch_url: {url[:80]} answered HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, socket.gaierror) or getattr(reason, "errno", None) in (
                    errno.ENETUNREACH, errno.EHOSTUNREACH):
                raise ToolError(f"fetch_url: cannot reach {parts.hostname} (no network, or no such host)") from None
            raise ToolError(f"fetch_url: {url[:80]} failed: {one_line(reason)}") from None
        return _page_text(body, ctype, charset, cut, self.max_fetch_bytes)


def _read_bounded(resp, limit: int, cancel: threading.Event) -> tuple[bytes, bool]:
    chunks, got = [], 0
    while got <= limit:
        if cancel.is_set():
            raise ToolError("fetch_url: cancelled")
        chunk = resp.read(min(65536, limit + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)[:limit], got > limit


def _page_text(body: bytes, ctype: str, charset: str, cut: bool, limit: int) -> str:
    try:
        text = body.decode(charset, "replace")
    except LookupError:
        text = body.decode("utf-8", "replace")
    if "html" in ctype.lower():
        from bs4 import BeautifulSoup  # why: 0.1 s to import, only when a page is fetched
        soup = BeautifulSoup(text, "html.parser")
        for tag in soup(["script", "style", "noscript", "template"]):
            tag.decompose()
        text = "\n".join(line for line in (s.strip() for s in soup.get_text("\n").splitlines()) if line)
    elif not ctype.lower().startswith(("text/", "application/json", "application/xml")) and ctype:
        raise ToolError(f"fetch_url: the page is {ctype.split(';')[0]}, not text")
    if cut:
        text += f"\n[… cut: the page is over {limit:,} bytes]"
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[… cut: the text is {len(text):,} characters, over {MAX_RESULT_CHARS:,}]"
    return text


def _arg(args: dict, key: str) -> str:
    value = args.get(key) if isinstance(args, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"the argument {key!r} must be non-empty text")
    return value


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone {str(name)[:60]!r}; use an IANA name such as Europe/Paris") from None
