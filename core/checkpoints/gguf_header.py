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

from core import limits
from core.errors import CheckpointError
from core.model.args import ModelArgs, checked_args

Tensor = tuple[str, str, tuple[int, ...], int]  # name, type name, numpy-order shape, bytes

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
SHORT_ARRAY = 4096  # numeric arrays up to this long are kept; longer ones only counted
# Llama 3.1+ GGUFs carry the scaled-RoPE factors as a tensor; the loader turns them into constants.
ROPE_FREQS = "rope_freqs.weight"


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
    """What :func:`args_from_gguf` asks of its metadata, over a parsed header."""

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
    """ModelArgs from a parsed header, by the loader's own rules (:func:`args_from_gguf`)."""
    shapes = {name: _Shape(list(reversed(shape))) for name, _, shape, _ in tensors}
    return args_from_gguf(HeaderMetadata(meta, source), shapes, None)


# The GGUF key for each ModelArgs field, so range errors name what the user can find.
GGUF_KEYS = {
    "dim": "llama.embedding_length", "n_layers": "llama.block_count", "n_heads": "llama.attention.head_count",
    "n_kv_heads": "llama.attention.head_count_kv", "head_dim": "llama.attention.key_length",
    "vocab_size": "llama.vocab_size", "hidden_dim": "llama.feed_forward_length",
    "norm_eps": "llama.attention.layer_norm_rms_epsilon", "rope_theta": "llama.rope.freq_base",
    "max_seq_len": "llama.context_length",
}


def args_from_gguf(md, tensors: dict[str, Any], max_seq_len: int | None) -> ModelArgs:
    """ModelArgs from GGUF llama metadata (the loader's ``Metadata`` or a :class:`HeaderMetadata`)
    and tensor shapes where metadata is silent, every value range-checked before it sizes anything."""
    arch = md.get("general.architecture")
    if arch != "llama":
        raise CheckpointError(f"architecture '{limits.brief(arch)}' is not supported (only 'llama')", file=str(md.path))
    p = "llama."
    src = str(md.path)
    dim = limits.check_int(md.require(p + "embedding_length"), p + "embedding_length", *limits.INT_RANGES["dim"], file=src)
    n_heads = limits.check_int(md.require(p + "attention.head_count"), p + "attention.head_count",
                               *limits.INT_RANGES["n_heads"], file=src)
    head_dim = md.get(p + "attention.key_length", dim // n_heads if dim % n_heads == 0 else None)
    rot = md.get(p + "rope.dimension_count")
    if rot is not None and head_dim is not None and rot != head_dim:
        raise CheckpointError(f"partial rotary embeddings ({limits.brief(rot)} of {limits.brief(head_dim)} dims) "
                              "are not supported", file=src)
    emb = tensors.get("token_embd.weight")
    vocab = md.get(p + "vocab_size")
    if vocab is None:
        if emb is None:
            raise CheckpointError("missing tensor", file=src, tensor="token_embd.weight")
        vocab = int(emb.shape[1]) if len(emb.shape) == 2 else 0  # ne order: [dim, vocab]
    hidden = md.get(p + "feed_forward_length")
    if hidden is None:
        gate = tensors.get("blk.0.ffn_gate.weight")
        if gate is None or len(gate.shape) != 2:
            raise CheckpointError("metadata key 'llama.feed_forward_length' is missing", file=src)
        hidden = int(gate.shape[1])
    kind = md.get(p + "rope.scaling.type")
    if kind not in (None, "none"):
        if kind != "llama3":
            raise CheckpointError(f"rope scaling type '{limits.brief(kind)}' is not supported "
                                  "(only llama3 via rope_freqs)", file=src)
    ctx = md.get(p + "context_length", 4096)
    kw = dict(
        dim=dim, n_layers=md.require(p + "block_count"), n_heads=n_heads,
        n_kv_heads=md.get(p + "attention.head_count_kv", n_heads), vocab_size=vocab, hidden_dim=hidden,
        head_dim=head_dim, norm_eps=_f32(md.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_f32(md.get(p + "rope.freq_base", 10000.0)), rope_scaling=None,
        tie_word_embeddings="output.weight" not in tensors, max_seq_len=max_seq_len or ctx,
    )
    return checked_args(kw, file=src, names=GGUF_KEYS)


def _f32(v: Any) -> Any:
    """A float32 metadata value as the decimal it was written from (9.9999997e-06 -> 1e-05);
    anything that is not a number is passed on for the range check to name."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    return float(f"{float(v):.7g}")
