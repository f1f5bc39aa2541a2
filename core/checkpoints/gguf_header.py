"""A GGUF file's header alone: metadata and tensor list from its first bytes.

For listing and sizing models (the library's scan, the Hub's memory estimate), where the
loader's full reader would be too much: it maps the whole file and builds every array
(a Llama 3 vocabulary is 400k strings). Here string arrays are skipped, keeping their
length, so a header reads in milliseconds from a local file or a range request.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from core.errors import CheckpointError

Tensor = tuple[str, str, tuple[int, ...], int]  # name, type name, numpy-order shape, bytes

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
SHORT_ARRAY = 4096  # numeric arrays up to this long are kept; longer ones only counted


class NeedMore(Exception):
    """The bytes end before the header does: read more of the file."""


class _Cursor:
    """Reads little-endian GGUF values from ``buf`` at ``off``, raising NeedMore past its end."""

    def __init__(self, buf: memoryview, source: str):
        self.buf, self.off, self.source = buf, 0, source

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.off + size > len(self.buf):
            raise NeedMore
        v = struct.unpack_from(fmt, self.buf, self.off)[0]
        self.off += size
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if n > 1 << 26:
            raise CheckpointError("damaged header: a string of impossible length", file=self.source)
        if self.off + n > len(self.buf):
            raise NeedMore
        s = bytes(self.buf[self.off:self.off + n]).decode("utf-8", "replace")
        self.off += n
        return s

    def value(self, t: int, depth: int = 0):
        if t in _SCALARS:
            return self.take(_SCALARS[t])
        if t == 8:
            return self.string()
        if t == 9 and depth < 2:
            return self.array(depth)
        raise CheckpointError(f"damaged header: unknown value type {t}", file=self.source)

    def array(self, depth: int):
        """A short numeric array as a list; a long one, or strings, as its length."""
        it, n = self.take("<I"), self.take("<Q")
        if n > 1 << 32:
            raise CheckpointError("damaged header: an array of impossible length", file=self.source)
        if it == 8:
            for _ in range(n):
                ln = self.take("<Q")  # (not "off += take(...)": that adds to off as it was before take)
                self.off += ln
                if self.off > len(self.buf):
                    raise NeedMore
            return n
        if it in _SCALARS:
            size = struct.calcsize(_SCALARS[it])
            if self.off + n * size > len(self.buf):
                raise NeedMore
            items = list(struct.unpack_from(f"<{n}{_SCALARS[it][1]}", self.buf, self.off)) if n <= SHORT_ARRAY else n
            self.off += n * size
            return items
        return [self.value(it, depth + 1) for _ in range(n)]

    def tensor(self) -> tuple[str, str, tuple[int, ...], int, int]:
        """One tensor's entry: (name, type name, numpy-order shape, bytes, data offset)."""
        name = self.string()
        nd = self.take("<I")
        if not 1 <= nd <= 4:
            raise CheckpointError(f"damaged header: {nd} dimensions", file=self.source, tensor=name)
        dims = [self.take("<Q") for _ in range(nd)]
        raw = self.take("<I")
        offset = self.take("<Q")
        try:
            kind = GGMLQuantizationType(raw)
            block, size = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise CheckpointError(f"unknown tensor type {raw}", file=self.source, tensor=name) from None
        n = 1
        for d in dims:
            n *= d
        if n > 1 << 40:
            raise CheckpointError("damaged header: impossible shape", file=self.source, tensor=name)
        return name, kind.name, tuple(reversed(dims)), n * size // block, offset


def parse_header(data: bytes, *, source: str = "GGUF file") -> tuple[dict[str, Any], list[Tensor], int]:
    """(metadata, tensors, header bytes) from the start of a GGUF file (v2/v3, little-endian).

    Long arrays (the vocabulary) are given as their length. Raises NeedMore when ``data``
    ends inside the header, CheckpointError when it is not a GGUF header.
    """
    cur = _Cursor(memoryview(data), source)
    if len(data) < 4:
        raise NeedMore
    if bytes(data[:4]) != b"GGUF":
        raise CheckpointError("not a GGUF file (no GGUF magic)", file=source)
    cur.off = 4
    version = cur.take("<I")
    if version not in (2, 3):
        raise CheckpointError(f"GGUF version {version} is not supported (2 or 3)", file=source)
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    if n_tensors > 1 << 20 or n_kv > 1 << 20:
        raise CheckpointError("damaged header: impossible tensor or key counts", file=source)
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.take("<I"))
    tensors = [cur.tensor() for _ in range(n_tensors)]
    align = meta.get("general.alignment", 32)
    align = align if isinstance(align, int) and 0 < align <= 1 << 16 else 32
    data_start = -(-cur.off // align) * align
    return meta, [(t[0], t[1], t[2], t[3]) for t in tensors], data_start + max(
        (t[4] + t[3] for t in tensors), default=0)


def read_header(path: str | Path, *, first: int = 1 << 20) -> tuple[dict[str, Any], list[Tensor]]:
    """The header of a local GGUF file, reading only as much of it as the header takes;
    CheckpointError when the file is shorter than its tensors say (truncated)."""
    p = Path(path)
    size = p.stat().st_size
    n = first
    with open(p, "rb") as f:
        while True:
            f.seek(0)
            data = f.read(min(n, size))
            try:
                meta, tensors, end = parse_header(data, source=str(p))
                break
            except NeedMore:
                if len(data) >= size:
                    raise CheckpointError("the file ends inside its header: damaged or not fully downloaded",
                                          file=str(p)) from None
                n *= 4
    if end > size:
        raise CheckpointError(f"the file ends before its tensors do ({size} of {end} bytes): truncated", file=str(p))
    return meta, tensors


class _Shape:
    def __init__(self, ne: list[int]):
        self.shape = ne


class HeaderMetadata:
    """What ``gguf.args_from_gguf`` asks of its metadata, over a parsed header."""

    def __init__(self, values: dict[str, Any], path: str):
        self.values, self.path = values, path

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def require(self, key: str) -> Any:
        v = self.values.get(key)
        if v is None:
            raise CheckpointError(f"metadata key '{key}' is missing", file=str(self.path))
        return v


def header_args(meta: dict[str, Any], tensors: list[Tensor], source: str):
    """ModelArgs from a parsed header, by the loader's own rules (``args_from_gguf``)."""
    from core.checkpoints.gguf import args_from_gguf  # why: the loader and torch, only when a header is sized
    shapes = {name: _Shape(list(reversed(shape))) for name, _, shape, _ in tensors}
    return args_from_gguf(HeaderMetadata(meta, source), shapes, None)
