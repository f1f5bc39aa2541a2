"""Built-in tools: the calculator walks an allow-list (no eval), the clock uses the user's
zone, read_file stays inside the allowed folders, fetch_url speaks http(s) only and says
when there is no network."""
from __future__ import annotations

import datetime as dt
import http.server
import json
import math
import os
import socket
import threading

import pytest

from core.tools import builtin, guarded_io
from core.tools.builtin import BUILTIN_TOOLS, BuiltinTools, CalcError, calculate
from core.tools.spec import ToolCall, ToolError


@pytest.mark.parametrize("expr, value", [
    ("2+3*4", 14), ("(17*23)^2", 152881), ("2**10", 1024), ("7//2", 3), ("-7 % 3", 2), ("10/4", 2.5),
    ("sqrt(2)*sqrt(2)", pytest.approx(2.0)), ("sin(pi/2)", pytest.approx(1.0)), ("log(e)", pytest.approx(1.0)),
    ("factorial(10)", 3628800), ("max(1, 5, 3)", 5), ("round(2.567, 2)", 2.57), ("3 × 4 ÷ 2", 6),
    ("2^0.5", pytest.approx(math.sqrt(2))), ("hypot(3, 4)", 5.0),
])
def test_the_calculator_computes(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr, words", [
    ("__import__('os').system('echo hi')", "does not know"), ("open('/etc/passwd')", "does not know 'open'"),
    ("(1).__class__", "does not know"), ("'a' * 3", "does not know"), ("[1, 2]", "does not know"),
    ("x + 1", "does not know 'x'"), ("lambda: 1", "does not know"), ("9**9**9", "too large"),
    ("2^100000", "too large"), ("factorial(100000)", "factorial takes"), ("1/0", "division by zero"),
    ("sqrt(-1)", "undefined"), ("(-8)^(1/3)", "no real value"), ("exp(1000)", "too large"),
    ("1 +", "not an arithmetic expression"), ("", "give an expression"), ("1+" * 600 + "1", "over 1000"),
    ("(" * 400 + "1" + ")" * 400, "not an arithmetic expression|too long"),
])
def test_the_calculator_refuses_what_is_not_bounded_maths(expr, words):
    with pytest.raises(CalcError, match=words):
        calculate(expr)


def run(tools: BuiltinTools, name: str, **args):
    return tools.call(ToolCall(name, args), cancel=threading.Event(), timeout=5)


def test_every_tool_is_off_by_default_and_unknown_names_are_refused():
    assert BuiltinTools().tools() == []
    assert run(BuiltinTools(), "calculator", expression="1+1").is_error
    with pytest.raises(ToolError, match="no built-in tool named 'shell'"):
        BuiltinTools(["shell"])
    tools = BuiltinTools(["calculator", "current_time"])
    assert [t.name for t in tools.tools()] == ["calculator", "current_time"]
    assert all(t.source == "builtin" for t in BUILTIN_TOOLS.values())
    result = run(tools, "calculator", expression="6*7")
    assert (result.content, result.is_error) == ("42", False)
    assert "does not know" in run(tools, "calculator", expression="os.getcwd()").content


def test_the_clock_says_the_time_in_the_users_zone():
    tools = BuiltinTools(["current_time"], timezone="Asia/Kolkata")
    before = dt.datetime.now(dt.timezone.utc)
    got = json.loads(run(tools, "current_time").content)
    when = dt.datetime.fromisoformat(got["datetime"])
    assert when.utcoffset() == dt.timedelta(hours=5, minutes=30) and got["timezone"] == "Asia/Kolkata"
    assert abs((when - before).total_seconds()) < 5
    other = json.loads(run(tools, "current_time", timezone="UTC").content)
    assert dt.datetime.fromisoformat(other["datetime"]).utcoffset() == dt.timedelta(0)
    assert "unknown time zone" in run(tools, "current_time", timezone="Mars/Olympus").content
    with pytest.raises(ToolError, match="unknown time zone"):
        BuiltinTools(["current_time"], timezone="Nowhere/City")


@pytest.fixture
def folders(tmp_path):
    allowed, secret = tmp_path / "allowed", tmp_path / "secret"
    allowed.mkdir(), secret.mkdir()
    (allowed / "notes.txt").write_text("the notes")
    (secret / "key.txt").write_text("the secret")
    (allowed / "link.txt").symlink_to(secret / "key.txt")
    (allowed / "blob.bin").write_bytes(b"\x00\x01binary")
    (allowed / "large.txt").write_text("z" * 5000)
    os.mkfifo(allowed / "pipe")  # reading it would block forever
    return allowed, secret


def test_read_file_reads_inside_the_allowed_folders_only(folders):
    allowed, secret = folders
    tools = BuiltinTools(["read_file"], folders=[allowed], max_file_bytes=1000)
    assert run(tools, "read_file", path=str(allowed / "notes.txt")).content == "the notes"
    assert run(tools, "read_file", path="notes.txt").content == "the notes"  # relative to the first folder
    for path, words in [(secret / "key.txt", "outside the allowed folders"),
                        (allowed / "link.txt", "outside the allowed folders"),  # the symlink is resolved
                        (allowed / ".." / "secret" / "key.txt", "outside the allowed folders"),
                        (allowed / "blob.bin", "not a text file"), (allowed / "missing.txt", "no file"),
                        (allowed, "refused to read a folder"), (allowed / "pipe", "refused to read a pipe")]:
        result = run(tools, "read_file", path=str(path))
        assert result.is_error and words in result.content, (path, result.content)
        assert "the secret" not in result.content
    large = run(tools, "read_file", path="large.txt")
    assert large.content.startswith("z" * 1000) and "cut: the file is 5,000 bytes" in large.content
    off = BuiltinTools(["read_file"])
    assert off.tools() == [] and "no folder is allowed" in off.notes[0]


class _Pages(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/redirect-"):
            where = {"/redirect-file": "file:///etc/passwd", "/redirect-ftp": "ftp://example.com/x",
                     "/redirect-inside": f"http://inside.test:{self.server.server_address[1]}/page"}[self.path]
            self.send_response(302), self.send_header("Location", where), self.end_headers()
            return
        body, ctype = {"/page": (b"<html><script>evil()</script><p>Hello <b>web</b></p></html>", "text/html"),
                       "/big": (b"a" * 5000, "text/plain"),
                       "/image": (b"\x89PNG", "image/png")}.get(self.path, (b"nope", "text/plain"))
        self.send_response(200 if self.path != "/missing" else 404)
        self.send_header("Content-Type", ctype), self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def site():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_fetch_url_returns_page_text_bounded(site):
    tools = BuiltinTools(["fetch_url"], network=True, allow_private=True, max_fetch_bytes=1000)
    page = run(tools, "fetch_url", url=f"{site}/page")
    assert not page.is_error and "Hello" in page.content and "web" in page.content and "evil" not in page.content
    big = run(tools, "fetch_url", url=f"{site}/big")
    assert big.content.startswith("a" * 1000) and "cut: the page is over 1,000 bytes" in big.content
    for path, words in [("/missing", "HTTP 404"), ("/image", "image/png, not text"),
                        ("/redirect-file", "is not allowed"), ("/redirect-ftp", "non-http address")]:
        result = run(tools, "fetch_url", url=site + path)
        assert result.is_error and words in result.content, (path, result.content)


def test_fetch_url_refuses_other_schemes_local_addresses_and_says_when_offline(site):
    tools = BuiltinTools(["fetch_url"], network=True)
    for url, words in [("file:///etc/passwd", "http:// and https:// addresses only"),
                       ("ftp://example.com/x", "http:// and https:// addresses only"),
                       (f"{site}/page", "does not reach this machine or private networks")]:
        result = run(tools, "fetch_url", url=url)
        assert result.is_error and words in result.content
    offline = BuiltinTools(["fetch_url", "calculator"], network=False)
    assert [t.name for t in offline.tools()] == ["calculator"]
    assert offline.notes == ["fetch_url is off: this machine has no network"]


def test_read_file_reads_nothing_that_became_a_link_after_the_check(folders, monkeypatch):
    """Time of check, time of use: a folder inside the allowed one is swapped for a link to a
    secret one between resolving the path and opening it. The check saw a real folder (here:
    realpath is made to answer as it did before the swap); the open must not follow the link."""
    allowed, secret = folders
    tools = BuiltinTools(["read_file"], folders=[allowed])
    (allowed / "sub").symlink_to(secret, target_is_directory=True)  # the swap
    monkeypatch.setattr(builtin.os.path, "realpath", os.path.abspath)  # the check, from before it
    result = run(tools, "read_file", path=str(allowed / "sub" / "key.txt"))
    assert result.is_error and "changed while it was opened" in result.content, result.content
    assert "the secret" not in result.content
    (allowed / "sub").unlink()
    (allowed / "sub").mkdir()
    (allowed / "sub" / "deep.txt").write_text("deep notes")
    assert run(tools, "read_file", path=str(allowed / "sub" / "deep.txt")).content == "deep notes"
    (allowed / "sub" / "key.txt").symlink_to(secret / "key.txt")  # the file itself swapped
    result = run(tools, "read_file", path=str(allowed / "sub" / "key.txt"))
    assert result.is_error and "the secret" not in result.content


def test_fetch_url_connects_to_the_address_it_checked(site, monkeypatch):
    """DNS rebinding: a name that answers a public address to the check and a private one
    to the connection. Here 127.0.0.1 counts as public and 127.0.0.2 as private; the name
    answers 127.0.0.1 once, then 127.0.0.2: the page is fetched from 127.0.0.1, and a
    redirect to a private name is refused."""
    port = int(site.rsplit(":", 1)[1])
    answers = {"rebind.test": ["127.0.0.1", "127.0.0.2"], "inside.test": ["127.0.0.2"], "public.test": ["127.0.0.1"]}
    asked, connected = [], []
    real_connect, real_getaddrinfo = socket.create_connection, socket.getaddrinfo

    def getaddrinfo(host, p, *args, **kwargs):
        if host not in answers:  # create_connection's own look-up of the address it is given
            return real_getaddrinfo(host, p, *args, **kwargs)
        asked.append(host)
        ips = answers[host]
        ip = ips.pop(0) if len(ips) > 1 else ips[0]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, p))]

    def create_connection(address, *args, **kwargs):
        connected.append(address)
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(guarded_io.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(guarded_io.socket, "create_connection", create_connection)
    monkeypatch.setattr(guarded_io, "is_private", lambda ip: ip != "127.0.0.1")
    tools = BuiltinTools(["fetch_url"], network=True)
    page = run(tools, "fetch_url", url=f"http://rebind.test:{port}/page")
    assert not page.is_error and "Hello" in page.content, page.content
    assert asked == ["rebind.test"] and connected == [("127.0.0.1", port)]
    again = run(tools, "fetch_url", url=f"http://rebind.test:{port}/page")  # now it answers 127.0.0.2
    assert again.is_error and "does not reach this machine or private networks (rebind.test)" in again.content
    inside = run(tools, "fetch_url", url=f"http://public.test:{port}/redirect-inside")
    assert inside.is_error and "does not reach this machine or private networks (inside.test)" in inside.content
    assert connected == [("127.0.0.1", port)] * 2  # the redirect's target was never connected to
