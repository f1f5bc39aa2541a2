"""The built-in tools' file and network access, with the check and the use made one act.

- A file inside an allowed folder is opened from that folder down, one path component at a
  time, none of them followed if it is a symlink (``openat`` + ``O_NOFOLLOW``): a folder or
  file swapped for a symlink between the check and the open makes the open fail instead of
  reading what the link points to. Where the platform has no ``dir_fd`` opens, the opened
  descriptor is compared with what the checked path names (device and inode).
- A URL's host is resolved once per connection; every address is checked, and the socket
  is connected to a checked address (the Host header and TLS's SNI keep the name), so a
  name that answers a public address to the check and a private one to the connection (DNS
  rebinding) reaches nothing it should not. Redirects go through the same connections, and
  environment proxies are not used (a proxy would resolve the name itself, unchecked).
"""
from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import stat
import urllib.request
from pathlib import Path
from typing import Callable

from core.tools.spec import ToolError

__all__ = ["open_inside", "pinned_opener", "is_private"]

_DIR = getattr(os, "O_DIRECTORY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BASE = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_WALKS = bool(_NOFOLLOW and _DIR) and os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd


def _kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a pipe (FIFO)" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")


def open_inside(folder: Path, real: Path, shown: str) -> int:
    """A read-only descriptor of the regular file ``real`` (a resolved path inside the
    resolved ``folder``), opened so that nothing it passes through can have become a symlink
    since ``real`` was resolved. ``shown``: the path as the model wrote it, for messages."""
    parts = real.relative_to(folder).parts
    if not parts:
        raise ToolError(f"read_file: refused to read a folder: {shown[:120]}")
    if not _WALKS:
        return _open_and_compare(real, shown)
    fd = os.open(folder, _BASE | _DIR)
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, _BASE | _DIR | _NOFOLLOW, dir_fd=fd)
            except OSError as e:
                raise _changed(shown, e) from None
            os.close(fd)
            fd = nxt
        try:  # before open: opening a FIFO or a device has effects
            mode = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode
        except OSError as e:
            raise _changed(shown, e) from None
        if not stat.S_ISREG(mode):
            raise ToolError(f"read_file: refused to read {_kind(mode)}: only regular files are opened")
        try:
            out = os.open(parts[-1], _BASE | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=fd)
        except OSError as e:
            raise _changed(shown, e) from None
    finally:
        os.close(fd)
    _check_regular(out)
    return out


def _changed(shown: str, e: OSError) -> ToolError:
    return ToolError(f"read_file: {shown[:120]} changed while it was opened (a folder or the file became a link, "
                     f"or went away): {e.strerror or e}")


def _check_regular(fd: int) -> None:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ToolError(f"read_file: refused to read {_kind(mode)}: only regular files are opened")


def _open_and_compare(real: Path, shown: str) -> int:
    before = os.stat(real)
    if not stat.S_ISREG(before.st_mode):
        raise ToolError(f"read_file: refused to read {_kind(before.st_mode)}: only regular files are opened")
    fd = os.open(real, _BASE)
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise ToolError(f"read_file: {shown[:120]} changed while it was opened")
    return fd


# ----------------------------------------------------------------------------- network

def is_private(ip: str) -> bool:
    """Whether an address is this machine's or a private network's."""
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_private or addr.is_loopback or addr.is_link_local or addr.is_reserved or addr.is_unspecified \
        or addr.is_multicast


def _resolver(allow_private: bool, private: Callable[[str], bool]):
    def connect(address, timeout, source_address=None):
        host, port = address
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)  # once: what is checked is what is used
        ips = list(dict.fromkeys(info[4][0] for info in infos))
        if not allow_private and any(private(ip) for ip in ips):
            raise ToolError(f"fetch_url does not reach this machine or private networks ({host})")
        error: OSError | None = None
        for ip in ips:
            try:
                return socket.create_connection((ip, port), timeout, source_address)
            except OSError as e:
                error = e
        raise error or OSError(f"no address for {host}")
    return connect


class _PinnedHTTP(http.client.HTTPConnection):
    connector = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = self.connector  # the one socket-making hook http.client offers


class _PinnedHTTPS(http.client.HTTPSConnection):
    connector = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = self.connector  # TLS then wraps it with the host name as SNI


def pinned_opener(redirects, *, allow_private: bool = False, private: Callable[[str], bool] | None = None):
    """A urllib opener whose every connection resolves its host once, refuses private
    addresses (unless ``allow_private``) and connects to the address it checked; no proxies.
    ``redirects``: the redirect handler class; ``private``: the address test (:func:`is_private`)."""
    connect = staticmethod(_resolver(allow_private, private or is_private))
    http_class = type("PinnedHTTP", (_PinnedHTTP,), {"connector": connect})
    https_class = type("PinnedHTTPS", (_PinnedHTTPS,), {"connector": connect})

    class Plain(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(http_class, req)

    class Secure(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(https_class, req, context=self._context)

    return urllib.request.build_opener(urllib.request.ProxyHandler({}), Plain, Secure, redirects)
