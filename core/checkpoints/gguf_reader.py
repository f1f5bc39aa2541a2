"""Opening a GGUF file for loading: ``gguf``'s reader, made strict and fast.

The reader checks, before any tensor is touched, that every tensor lies inside the file,
is aligned and tiles the data section with the others (a tensor type changed in the header
would otherwise read its neighbours' bytes), and reads metadata arrays in bulk (gguf reads
them an element at a time: 20+ s of GIL-held Python for a Llama 3 vocabulary, which stalls
the UI). :class:`Metadata` gives typed access to the key/value fields with errors that
name the key. Header-only reading (no mapping, for listing and sizing) is
:mod:`core.checkpoints.gguf_header`.
"""
from __future__ import annotations

import logging
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderField
from gguf.constants import GGML_QUANT_SIZES

from core import limits
from core.errors import CheckpointError

log = logging.getLogger(__name__)

GGUF_VERSIONS = (2, 3)  # what gguf's reader handles (version 1 lacks 64-bit sizes)
DAMAGED = "the file is damaged (corrupt or not fully downloaded) and cannot be read as a GGUF model"
NONE_ID = 0xFFFFFFFF  # llama.cpp writes -1 (as uint32) for "no such token"


class TensorProblem(Exception):
    """A tensor the header describes wrongly; ``tensor`` names it."""

    def __init__(self, tensor: str, message: str):
        super().__init__(message)
        self.tensor = tensor


class Reader(GGUFReader):
    """GGUFReader that first checks each tensor's data lies inside the file, so a
    truncated file is reported against the first tensor it cuts off, and that reads
    metadata arrays in bulk into ``self.values``."""

    def _build_fields(self, offs, count):
        # Scalars and strings still go through gguf; big-endian files keep gguf's own path.
        if self.byte_order != "I":
            return super()._build_fields(offs, count)
        self.values = {}
        buf = memoryview(self.data)
        for _ in range(count):
            start = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_type = self._get(offs, np.uint32)
            offs += 4
            name = str(bytes(kv_kdata), encoding="utf-8")
            head = [kv_klen, kv_kdata, raw_type]
            if GGUFValueType(int(raw_type[0])) == GGUFValueType.ARRAY:
                raw_itype, alen = self._get(offs, np.uint32), self._get(offs + 4, np.uint64)
                itype, n = GGUFValueType(int(raw_itype[0])), int(alen[0])
                bulk = self._bulk_array(buf, offs + 12, itype, n)
                if bulk is not None:
                    self.values[name], offs = bulk
                    self._push_field(ReaderField(start, name, head + [raw_itype, alen], [],
                                                 [GGUFValueType.ARRAY, itype]), skip_sum=True)
                    continue
            # a scalar or string, or a nested array (rare): gguf's own reading
            size, parts, idxs, types = self._get_field_parts(offs, raw_type[0])
            self._push_field(ReaderField(start, name, head + parts, [i + 3 for i in idxs], types), skip_sum=True)
            offs += size
        return offs

    def _bulk_array(self, buf: memoryview, offs: int, itype, n: int) -> tuple[list, int] | None:
        """(items, offset after them) of an array of strings or scalars at ``offs``; None
        for nested arrays."""
        if itype == GGUFValueType.STRING:
            items = []
            for _ in range(n):
                (ln,) = struct.unpack_from("<Q", buf, offs)
                items.append(str(buf[offs + 8: offs + 8 + ln], encoding="utf-8", errors="replace"))
                offs += 8 + ln
            return items, offs
        if itype in self.gguf_scalar_to_np:
            dt = np.dtype(self.gguf_scalar_to_np[itype])
            items = np.frombuffer(buf, dtype=dt, count=n, offset=offs).tolist()
            if itype == GGUFValueType.BOOL:
                items = [bool(v) for v in items]
            return items, offs + n * dt.itemsize
        return None

    def _build_tensors(self, start_offs, fields):
        # Every tensor must be aligned, lie inside the file and tile the data section
        # with the others: a tensor whose type was changed in the header (F32 -> F16)
        # would otherwise read its neighbours' bytes, or half its own, silently.
        align = int(getattr(self, "alignment", 32)) or 32
        spans = []
        for field in fields:
            try:
                _, name_data, _, dims, raw_dtype, offset = field.parts
                name = bytes(name_data).decode("utf-8", "replace")
            except (TypeError, ValueError):  # another layout: leave the checks to gguf
                spans = None
                break
            spans.append(self._span(name, dims, int(raw_dtype[0]), int(offset[0]), int(start_offs), align))
        if spans:
            _check_tiling(sorted(spans), len(self.data) - int(start_offs), align)
        super()._build_tensors(start_offs, fields)

    def _span(self, name: str, dims, raw: int, off: int, start: int, align: int) -> tuple[int, int, str]:
        """(start, end, name) of one tensor's data, once its type, shape and place are checked."""
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw)]
        except (ValueError, KeyError):
            raise TensorProblem(name, f"unknown tensor type {raw}") from None
        shape = [int(d) for d in dims]
        if not 1 <= len(shape) <= 4 or any(d < 1 or d > 1 << 40 for d in shape):
            raise TensorProblem(name, f"impossible shape {shape}")
        if block > 1 and shape[0] % block:
            raise TensorProblem(name, f"rows of {shape[0]} weights are not a multiple of "
                                      f"{GGMLQuantizationType(raw).name}'s block size {block}")
        if off % align:
            raise TensorProblem(name, f"data offset {off} is not a multiple of the file's "
                                      f"alignment ({align}): corrupt header")
        nbytes = math.prod(shape) * type_size // block
        end = start + off + nbytes
        if end > len(self.data):
            raise TensorProblem(name, f"the file ends before this tensor's data does "
                                      f"({len(self.data)} of {end} bytes): truncated")
        return off, off + nbytes, name


def _check_tiling(spans: list[tuple[int, int, str]], data_bytes: int, align: int) -> None:
    """Tensors' data, in file order, neither overlap nor leave more than alignment padding."""
    prev_end, prev = 0, None
    for off, end, name in spans:
        if off < prev_end:
            raise TensorProblem(name, f"its data overlaps tensor '{prev}' (a tensor type or "
                                      "shape in the header does not match the data)")
        if off - prev_end >= align + (prev_end % align and align - prev_end % align):
            raise TensorProblem(prev or name, "unused bytes follow its data (a tensor type or "
                                              "shape in the header does not match the data)")
        prev_end, prev = end, name
    if data_bytes - prev_end >= 2 * align:
        raise TensorProblem(prev, "unused bytes follow its data at the end of the file (a tensor "
                                  "type or shape in the header does not match the data)")


def header_problem(head: bytes) -> str | None:
    """What is wrong with a GGUF file's first 8 bytes, in the user's words; None when fine."""
    if len(head) < 8 or head[:4] != b"GGUF":
        return DAMAGED
    versions = {int.from_bytes(head[4:8], "little"), int.from_bytes(head[4:8], "big")}  # either byte order
    if versions & set(GGUF_VERSIONS):
        return None
    v = min(versions)
    if v == 1:
        return "the file uses GGUF version 1, too old to read: convert the model again with a current llama.cpp"
    if max(GGUF_VERSIONS) < v < 100:  # a plausible future version
        return f"the file uses GGUF version {v}, newer than this app reads (versions 2 and 3)"
    return DAMAGED


def open_reader(path: Path):
    """GGUFReader on a copy-on-write map (tensors are writable, the file never is)."""
    limits.check_regular(path)
    try:
        with open(path, "rb") as f:
            problem = header_problem(f.read(8))
    except OSError as e:
        raise CheckpointError(f"cannot read the file: {e.strerror}", file=str(path)) from None
    if problem:
        raise CheckpointError(problem, file=str(path))
    try:
        return Reader(path, "c")
    except TensorProblem as e:
        raise CheckpointError(str(e), file=str(path), tensor=e.tensor) from None
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:  # corrupt metadata: numpy/struct/unicode errors of many kinds, none a user's words
        log.info("gguf could not read %s: %s: %s", path, type(e).__name__, e)
        raise CheckpointError(DAMAGED, file=str(path)) from None


class Metadata:
    """Typed access to a reader's key/value fields, with errors that name the key."""

    def __init__(self, reader, path: Path):
        self.fields = reader.fields
        self.values = getattr(reader, "values", {})  # arrays the Reader read in bulk
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.values:
            return self.values[key]
        f = self.fields.get(key)
        if f is None:
            return default
        try:
            v = f.contents()
        except Exception as e:
            log.info("metadata key %s of %s: %s", key, self.path, e)
            raise CheckpointError(f"metadata key '{key}' cannot be read: {DAMAGED}", file=str(self.path)) from None
        return v.item() if isinstance(v, np.generic) else v

    def require(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise CheckpointError(f"metadata key '{key}' is missing", file=str(self.path))
        return v

    def token_id(self, key: str) -> int | None:
        v = self.get(key)
        if v is None:
            return None
        v = limits.check_int(v, key, -1, NONE_ID, file=str(self.path))
        return None if v in (NONE_ID, -1) else v
