"""GGUF files (llama.cpp's format): metadata -> ModelArgs, tensors packed or dequantized.

The file is memory-mapped by ``gguf.GGUFReader``. Linear weights of the types in
:data:`core.model.quant.PACKED_TYPES` go from the mapped blocks straight into packed int4
layers (no float copy); other tensors are dequantized one at a time into the compute
dtype. An explicit float dtype (``--dtype float32``) dequantizes everything, as before.
GGUF "llama" tensors are already in Meta's interleaved RoPE layout: no permutation.
"""
from __future__ import annotations

import functools
import logging
import math
import re
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from core import limits
from core.checkpoints.common import (LoadedModel, ProgressFn, build_model, expected_shapes, foreign_name,
                                     model_info, quant_kind, resolve_device, resolve_dtype)
from core.checkpoints.gguf_header import ROPE_FREQS, args_from_gguf
from core.checkpoints.gguf_reader import DAMAGED, Metadata, open_reader
from core.checkpoints.pack_cache import PackCache, for_load as pack_cache_for_load
from core.checkpoints.gguf_vocab import hf_byte_level_from_vocab, sentencepiece_from_vocab
from core.errors import CheckpointError, TokenizerError, one_line
from core.model import pack, quant
from core.model.f16 import Float16Embedding, Float16Linear
from core.model.kernels import build as kernel_build, ops as kernel_ops
from core.model.kernels.linear import KernelLinear
from core.model.memory import release_mapped_pages
from core.model.transformer import rope_frequencies
from core.model.args import ModelArgs
from core.prompt.chat_format import chat_format_for

# Types whose tensors are stored as plain floats; anything else is quantized blocks.
FLOAT_TYPES = ("F32", "F16", "BF16")

_LAYER_MAP = {
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_output.weight": "attention.wo.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
    "attn_norm.weight": "attention_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
}
_TOP_MAP = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "output.weight",
}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")


def meta_name(gguf_name: str) -> str | None:
    """The Meta tensor name for a GGUF llama tensor name, or None if it has none."""
    if gguf_name in _TOP_MAP:
        return _TOP_MAP[gguf_name]
    m = _BLK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_MAP:
        return f"layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}"
    return None


def gguf_name(meta: str) -> str:
    """The GGUF tensor name for a Meta name (inverse of meta_name)."""
    return foreign_name(meta, _TOP_MAP, _LAYER_MAP, "blk.")


log = logging.getLogger(__name__)


def scaling_from_rope_freqs(factors: np.ndarray, args: ModelArgs, orig_ctx: float | None,
                            source: str) -> dict[str, float] | None:
    """Llama 3 scaling constants that reproduce llama.cpp's rope_freqs factors.

    llama.cpp divides each base frequency by its factor. The llama3 rule gives factor 1 at
    high frequency, ``factor`` at low frequency, and between them a blend whose weight is
    linear in x = 1/wavelength, from 0 at x = low_freq_factor/ctx to 1 at
    high_freq_factor/ctx. Blended entries fix that line; with fewer than two, any line
    that keeps the scaled and unscaled entries on their sides gives the same frequencies.
    Meta's own constants win when they fit. The result is checked against the tensor.
    """
    f = np.asarray(factors, dtype=np.float64).reshape(-1)
    if f.shape[0] != args.head_dim // 2:
        raise CheckpointError(f"rope_freqs has {f.shape[0]} entries, expected {args.head_dim // 2}",
                              file=source, tensor=ROPE_FREQS)
    if not np.all(np.isfinite(f)) or f.min() <= 0:
        raise CheckpointError("rope_freqs holds non-positive or non-finite factors", file=source,
                              tensor=ROPE_FREQS)
    if np.allclose(f, 1.0, rtol=0, atol=1e-6):
        return None
    base = ModelArgs(**{**args.__dict__, "rope_scaling": None, "use_scaled_rope": False})
    inv = rope_frequencies(base).double().numpy()
    want = inv / f

    def fits(c: dict[str, float]) -> bool:
        got = rope_frequencies(ModelArgs(**{**base.__dict__, "rope_scaling": c})).double().numpy()
        return bool(np.allclose(got, want, rtol=1e-4, atol=0))

    factor = float(f.max())
    old = float(orig_ctx or 8192)
    meta = {"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": old}
    if fits(meta):
        return meta
    x = inv / (2 * math.pi)  # 1 / wavelength
    tol = 1e-5
    scaled, plain = f >= factor * (1 - tol), f <= 1 + tol
    mid = ~scaled & ~plain
    x_lo = x[scaled].max() if scaled.any() else 0.0
    x_hi = x[plain].min() if plain.any() else 2 * x.max()
    s = (1 / f - 1 / factor) / (1 - 1 / factor)  # blend weight of the unscaled frequency
    if mid.sum() >= 2:
        a, b = np.polyfit(x[mid], s[mid], 1)
    elif mid.sum() == 1:
        x1, s1 = float(x[mid][0]), float(s[mid][0])
        a = 2 * max(s1 / (x1 - x_lo), (1 - s1) / (x_hi - x1))
        b = s1 - a * x1
    else:
        a = 3 / (x_hi - x_lo)
        b = -a * (x_lo + (x_hi - x_lo) / 3)
    x0, x1 = -b / a, (1 - b) / a  # where the blend starts and ends
    cand = {"factor": factor, "low_freq_factor": float(old * x0), "high_freq_factor": float(old * x1),
            "original_max_position_embeddings": old}
    tidy = {k: float(f"{v:.6g}") for k, v in cand.items()}
    for c in (tidy, cand):
        if fits(c):
            return c
    raise CheckpointError("rope_freqs factors do not follow Llama 3 RoPE scaling", file=source,
                          tensor=ROPE_FREQS)


def tensor_loader(t, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """A loader that dequantizes one GGUF tensor into ``dtype`` in numpy (row-major) shape."""
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists dims fastest-first

    def load() -> torch.Tensor:
        kind = t.tensor_type
        data = t.data
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns on non-writable arrays
            if kind == Q.F32:
                out = torch.from_numpy(np.asarray(data).view(np.float32))
            elif kind == Q.F16:
                out = torch.from_numpy(np.asarray(data).view(np.float16))
            elif kind == Q.BF16:
                out = torch.from_numpy(np.asarray(data).view(np.int16)).view(torch.bfloat16)
            else:
                out = torch.from_numpy(dequantize(np.asarray(data), kind))
        if out.numel() != math.prod(shape):
            raise CheckpointError(f"holds {out.numel()} values, its header says {shape}")
        res = out.reshape(shape).to(dtype)
        arr = np.asarray(data)
        if res.data_ptr() != arr.ctypes.data:  # a converted copy: the mapped bytes are done with
            release_mapped_pages(arr.ctypes.data, arr.nbytes)
        return res

    return load


def packed_loader(t, device: torch.device, name: str = "", cache: PackCache | None = None,
                  tick: Callable[[], None] | None = None) -> Callable[[], torch.nn.Module]:
    """A loader that repacks one quantized GGUF linear weight into a :mod:`core.model.quant`
    layer, or maps it from the file's packed cache (Meta ``name`` is the cache's key);
    ``tick`` is called every few ms while it packs (the load's cancel check)."""
    n, k = (int(d) for d in reversed(t.shape.tolist()))

    def load() -> torch.nn.Module:
        if cache is not None:
            layer = cache.get(name, t.tensor_type.name, (n, k))
            if layer is not None:
                return layer
        arr = np.asarray(t.data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns on non-writable arrays
            raw = torch.from_numpy(arr.reshape(-1).view(np.uint8))
        try:
            layer = pack.pack_gguf(raw, t.tensor_type.name, n, k, device, tick)
        except ValueError as e:
            raise CheckpointError(f"{t.tensor_type.name} tensor cannot be read: {e}") from None
        release_mapped_pages(arr.ctypes.data, arr.nbytes)
        if cache is not None:
            cache.put(name, t.tensor_type.name, (n, k), layer)
        return layer

    return load


def blocks_of(t) -> torch.Tensor:
    """A quantized GGUF matrix's bytes, uint8 [rows, bytes per row]: a view of the memory map."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns on non-writable arrays
        return torch.from_numpy(np.asarray(t.data).reshape(int(t.shape[-1]), -1).view(np.uint8))


def kernel_loader(t, raw: torch.Tensor | None = None) -> Callable[[], torch.nn.Module]:
    """A loader that keeps one K-quant GGUF matrix as the file's blocks (a view of the
    memory map: no copy) in a :class:`KernelLinear`, multiplied by the compiled kernels
    (``raw``: those blocks, when the tied embedding holds the same tensor)."""
    n, k = (int(d) for d in reversed(t.shape.tolist()))

    def load() -> torch.nn.Module:
        raw_ = blocks_of(t) if raw is None else raw
        try:
            layer = KernelLinear(raw_, t.tensor_type.name, k, n)
        except ValueError as e:
            raise CheckpointError(f"{t.tensor_type.name} tensor cannot be read: {e}") from None
        if kernel_ops.first_bad_block(layer.kind, raw_) is not None:
            raise CheckpointError(f"{t.tensor_type.name} tensor cannot be read: holds NaN or infinite block "
                                  "scales: corrupt weights")
        return layer

    return load


def kernel_kinds(reader, device: torch.device, dtype, tick: Callable[[], None] | None = None) -> frozenset[str]:
    """The tensor types of this file that the compiled kernels multiply here (building them
    on first use; ``tick``: the load's cancel check while the compiler runs): CPU loads in
    the automatic dtype only, else none."""
    kinds = planned_kernel_kinds({t.tensor_type.name for t in reader.tensors if len(t.shape) == 2}, device, dtype)
    if not kinds or kernel_ops.kernels(tick) is None:
        return frozenset()
    return frozenset(k for k in kinds if kernel_ops.supports(k))


def planned_kernel_kinds(kinds: set[str], device: torch.device, dtype) -> frozenset[str]:
    """Of ``kinds``, those a load would hand to the kernels, without building them (the hub's
    memory estimate): all it can multiply, unless the kernels are off or cannot build here."""
    if device.type != "cpu" or dtype not in (None, "auto") or kernel_build.unavailable():
        return frozenset()
    return frozenset(kinds & set(KernelLinear.KINDS))


def embedding_loader(t, device: torch.device, dtype: torch.dtype,
                     shared: torch.Tensor | None = None) -> Callable[[], torch.nn.Module]:
    """A loader that keeps a quantized token embedding as its GGUF blocks (see GGUFEmbedding;
    ``shared``: those blocks, when the tied output layer holds the same tensor)."""
    n, k = (int(d) for d in reversed(t.shape.tolist()))

    def load() -> torch.nn.Module:
        raw = blocks_of(t) if shared is None else shared
        try:
            pack.decode_blocks(raw[:1], t.tensor_type.name, 1, k)  # sizes checked now, not at the first token
        except ValueError as e:
            raise CheckpointError(f"{t.tensor_type.name} tensor cannot be read: {e}") from None
        return quant.GGUFEmbedding(raw.to(device), t.tensor_type.name, k, dtype)

    return load


#: outputs per row the F16 output layer recomputes in float32 (see core.model.f16)
REFINE_LOGITS = 64


def float16_loader(t, dtype: torch.dtype, embedding: bool = False,
                   refine: int = 0) -> Callable[[], torch.nn.Module]:
    """A loader that keeps an F16 matrix as the file's bytes (a view of the memory map: no
    copy, no conversion) in a :class:`Float16Linear`, or a :class:`Float16Embedding` whose
    lookups come out in ``dtype``. Its pages are read once now (NaN/inf check, and so the
    first reply does not wait on the disk). On the torch path (no compiled kernels) a matrix
    of more than ``f16.SPLIT_K`` inputs is the exception: copied into column blocks (:func:`core.model.f16.k_parts`), its
    file pages then released."""
    n, k = (int(d) for d in reversed(t.shape.tolist()))

    def load() -> torch.nn.Module:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns on non-writable arrays
            half = torch.from_numpy(np.asarray(t.data).reshape(-1).view(np.float16))
        if half.numel() != n * k:
            raise CheckpointError(f"holds {half.numel()} values, its header says {(n, k)}")
        half = half.view(n, k)
        lo, hi = torch.aminmax(half)  # NaN propagates; 8 GB/s and no copy (a float64 sum copies)
        if not (math.isfinite(float(lo)) and math.isfinite(float(hi))):
            raise CheckpointError("holds NaN or infinite values: corrupt weights")
        if embedding:
            return Float16Embedding(half, dtype)
        m = Float16Linear(half, refine=refine, kernels=kernel_ops.kernels())
        if m.parts > 1:  # it copied the weight into column blocks: the file's pages are not read again
            release_mapped_pages(half.data_ptr(), 2 * half.numel())
        return m

    return load


def tokenizer_from_gguf(md: Metadata, source: str):
    """The tokenizer embedded in a GGUF file, with its chat template (or None)."""
    model = md.get("tokenizer.ggml.model")
    if model is None:
        raise CheckpointError("the file has no embedded tokenizer (tokenizer.ggml.model)", file=source)
    tokens = md.get("tokenizer.ggml.tokens")
    if not tokens:
        raise CheckpointError("the embedded tokenizer has no token list (tokenizer.ggml.tokens)", file=source)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError("tokenizer.ggml.tokens is not a list of strings", file=source)
    n = len(tokens)
    types = md.get("tokenizer.ggml.token_type") or [1] * n
    if not isinstance(types, list) or len(types) != n or not all(isinstance(t, int) for t in types):
        raise CheckpointError(f"tokenizer.ggml.token_type does not list one type for each of the {n} tokens",
                              file=source)
    bos = md.token_id("tokenizer.ggml.bos_token_id")
    eos = md.token_id("tokenizer.ggml.eos_token_id")
    for key, i in (("bos", bos), ("eos", eos)):
        if i is not None and not 0 <= i < n:
            raise CheckpointError(f"tokenizer.ggml.{key}_token_id {i} is outside the {n}-token vocabulary",
                                  file=source)
    try:
        if model == "llama":
            scores = md.get("tokenizer.ggml.scores") or [0.0] * n
            if not isinstance(scores, list) or len(scores) != n or \
                    not all(isinstance(x, (int, float)) and math.isfinite(x) for x in scores):
                raise CheckpointError(f"tokenizer.ggml.scores does not list one finite score for each of the "
                                      f"{n} tokens", file=source)
            tok = sentencepiece_from_vocab(
                tokens, scores, types, bos_id=bos, eos_id=eos,
                unk_id=md.token_id("tokenizer.ggml.unknown_token_id"),
                pad_id=md.token_id("tokenizer.ggml.padding_token_id"),
                add_dummy_prefix=bool(md.get("tokenizer.ggml.add_space_prefix", True)))
        elif model == "gpt2":
            merges = md.get("tokenizer.ggml.merges")
            if merges is None:
                raise CheckpointError("gpt2 tokenizer without tokenizer.ggml.merges", file=source)
            if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
                raise CheckpointError("tokenizer.ggml.merges is not a list of strings", file=source)
            tok = hf_byte_level_from_vocab(tokens, merges, types, bos_id=bos, eos_id=eos,
                                          pre=md.get("tokenizer.ggml.pre"))
        else:
            raise CheckpointError(f"embedded tokenizer '{model}' is not supported (llama or gpt2)", file=source)
    except TokenizerError as e:
        raise CheckpointError(f"embedded tokenizer: {e}", file=source) from None
    except (MemoryError, KeyboardInterrupt, CheckpointError):
        raise
    except BaseException as e:  # noqa: BLE001 — sentencepiece / tokenizers errors and Rust panics
        raise CheckpointError(f"embedded tokenizer cannot be built: {one_line(e)}", file=source) from None
    # llama.cpp records end-of-turn ids separately from EOS (Llama 3 Instruct: <|eot_id|>).
    extra = {i for i in (md.token_id("tokenizer.ggml.eot_token_id"), md.token_id("tokenizer.ggml.eom_token_id"))
             if i is not None and 0 <= i < n}
    tok.stop_ids = set(tok.stop_ids) | extra
    return tok, md.get("tokenizer.chat_template")


def holding(meta: str, kind: str, shape: tuple[int, ...], file_bytes: int, device: torch.device,
            dtype: torch.dtype, *, keep_packed: bool = True, tied: bool = False,
            keep_f16: bool | None = None, kernels: frozenset[str] = frozenset()) -> tuple[str, int]:
    """How :func:`load_gguf` holds one tensor, and the bytes it then takes in memory.

    The path is 'kernel' (a matrix of a type in ``kernels``, see :func:`kernel_kinds`: the
    file's blocks, multiplied in place), 'embedding-blocks' (a quantized token embedding
    stays as the file's blocks; tied, the output layer is a kernel on the same bytes or a
    packed copy), 'int4-packed' / 'int4x2-packed' / 'int4x2-requantized' (see :mod:`core.model.quant`), 'float', or
    'dequantized' (with the reason it could not stay packed). The hub's memory estimate
    uses the same rule, so what it promises is what a load takes.
    """
    why = pack.packable(kind, shape, device) if len(shape) == 2 else "not a matrix"
    if (keep_packed if keep_f16 is None else keep_f16) and kind == "F16" and len(shape) == 2 \
            and device.type == "cpu":
        return "float16-kept", file_bytes  # tied: the output layer multiplies the same bytes
    if kind in kernels and len(shape) == 2 and device.type == "cpu" and shape[1] % kernel_ops.MM[kind][1] == 0:
        # tied: the output layer multiplies the embedding's own bytes
        return "embedding-blocks" if meta == "tok_embeddings.weight" else "kernel", file_bytes
    if keep_packed and meta == "tok_embeddings.weight" and kind in quant.PACKED_TYPES and not tied:
        return "embedding-blocks", file_bytes  # only looked-up rows are ever read
    if keep_packed and meta == "tok_embeddings.weight" and tied and why is None:
        # tied: the blocks serve the lookups and a packed copy of them the output layer
        return "embedding-blocks", file_bytes + quant.packed_nbytes(kind, shape, device)
    if keep_packed and meta != "tok_embeddings.weight" and why is None:
        return quant.path_of(kind), quant.packed_nbytes(kind, shape, device)
    how = "float" if kind in FLOAT_TYPES else "dequantized" + (f" ({why})" if keep_packed and why else "")
    return how, math.prod(shape) * dtype.itemsize


#: Model Info's "why this data type" when F16 weights stay float16, or the kernels take the rest
F16_REASON = ("float32: F16 weights stay float16 (float32 sums), the rest runs in float32 to stay as close "
              "to the file as its own weights allow")
KERNELS_REASON = "float32: K-quant weights are multiplied in place by LlamaDesk's kernels, which take float32 rows"


def load_gguf(path: str | Path, *, device="auto", dtype="auto", max_seq_len: int | None = None,
              progress: ProgressFn | None = None) -> LoadedModel:
    """Load a GGUF file of architecture llama (F32/F16/BF16 and quantized types: packed or dequantized).

    Raises:
        CheckpointError naming the file (and tensor or metadata key) for anything that does
        not fit: another architecture, a truncated file, a missing or misshapen tensor, an
        unsupported quantization, a vocabulary larger than the embedding.
    """
    path = Path(path)
    source = str(path)
    dev = resolve_device(device)
    if progress:
        progress(0.0, "reading GGUF header")
    reader = open_reader(path)
    md = Metadata(reader, path)
    by_name = {t.name: t for t in reader.tensors}
    args = args_from_gguf(md, by_name, max_seq_len)
    # F16 matrices stay float16 on the CPU (core.model.f16), K-quants go to the kernels (float32
    # rows), and the model around them runs in float32: bfloat16 activations would only round.
    keep_f16 = dtype in (None, "auto") and dev.type == "cpu"
    f16 = keep_f16 and any(t.tensor_type == Q.F16 and len(t.shape) == 2 for t in reader.tensors)
    ticks = _Ticks(progress) if progress else None
    kernels = kernel_kinds(reader, dev, dtype, ticks.tick if ticks else None)
    dt = torch.float32 if f16 or kernels else resolve_dtype(dtype, dev, args)
    tok, template = tokenizer_from_gguf(md, source)
    if tok.vocab_size > args.vocab_size:
        raise CheckpointError(f"the tokenizer has {tok.vocab_size} tokens but the embedding only "
                              f"{args.vocab_size}", file=source, tensor="token_embd.weight")
    if ROPE_FREQS in by_name:
        factors = tensor_loader(by_name[ROPE_FREQS], torch.float64)()
        orig = md.get("llama.rope.scaling.original_context_length")
        args.rope_scaling = scaling_from_rope_freqs(factors.numpy(), args, orig, source)
    types = sorted({t.tensor_type.name for t in reader.tensors})
    # An explicit float dtype asks for float weights: dequantize as before.
    keep_packed = dtype in (None, "auto") or quant_kind(dtype) is not None
    cache = pack_cache_for_load(path, dev, keep_packed)
    items, paths, held = _tensor_plan(by_name, args, dev, dt, (keep_packed, keep_f16, kernels), source, cache,
                                      ticks.tick if ticks else None)
    unsupported = _unsupported_types(reader)
    if unsupported:
        raise CheckpointError(f"tensor type {unsupported[1]} cannot be dequantized", file=source,
                              tensor=unsupported[0])
    limits.check_model(args, dt, dev, source=source, held=held)
    model = build_model(args, items, device=dev, dtype=dt, source=source, progress=ticks,
                        display={m: gguf_name(m) for m in expected_shapes(args)}, quantize=quant_kind(dtype))
    if cache is not None:
        cache.commit()
    fmt = chat_format_for(tok, template=template)
    stop = set(tok.stop_ids) | fmt.stop_ids()
    info = model_info("gguf", path, args, model, tok, fmt, tensor_types=types,
                      dequantized=any(p.startswith("dequantized") for v in paths.values() for p in v),
                      tensor_paths={k: sorted(v) for k, v in sorted(paths.items())},
                      chat_template_source="gguf" if template else None,
                      general_name=md.get("general.name"))
    if f16 or kernels:  # (core.checkpoints.load adds the kernels' own line to every CPU load's info)
        info["dtype_reason"] = F16_REASON if f16 else KERNELS_REASON
    return LoadedModel(model, tok, fmt, args, stop, info, chat_template=template)


def _tensor_plan(by_name: dict[str, Any], args: ModelArgs, dev: torch.device, dt: torch.dtype,
                 keep: tuple[bool, bool, frozenset[str]], source: str, cache: PackCache | None = None,
                 tick: Callable[[], None] | None = None) -> tuple[list, dict[str, set[str]], int]:
    """(Meta name -> loader pairs for build_model, how each tensor type is held, the bytes
    they will take) by :func:`holding`'s rule; ``keep``: (keep_packed, keep_f16, the types
    the kernels multiply); ``tick``: see :func:`packed_loader`."""
    items, paths, held = [], {}, 0
    layer_f16: dict[str, int] = {}  # block index -> bytes of its float16-kept matrices
    layer_dense: dict[str, int] = {}  # block index -> bytes its kernel layers take dequantized
    tied = args.tie_word_embeddings
    for name, t in by_name.items():
        if name == ROPE_FREQS:
            continue
        meta = meta_name(name)
        if meta is None:
            raise CheckpointError("unexpected tensor (not part of a llama model)", file=source, tensor=name)
        kind = t.tensor_type.name
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        how, nbytes = holding(meta, kind, shape, int(t.n_bytes), dev, dt, keep_packed=keep[0], tied=tied,
                              keep_f16=keep[1], kernels=keep[2])
        if how == "float16-kept":
            embedding = meta == "tok_embeddings.weight"
            load = float16_loader(t, dt, embedding, REFINE_LOGITS if meta == "output.weight" else 0)
            held += nbytes
            if embedding and tied:  # the output layer multiplies the same mapped bytes
                output = _named_errors(float16_loader(t, dt, refine=REFINE_LOGITS), name, source)
                output.packs_tied_output = True
                items.append(("output.weight", output))
        elif how == "kernel":
            load = kernel_loader(t)
            held += nbytes
            if m := _BLK.fullmatch(name):  # a layered prefill dequantizes it to bfloat16
                layer_dense[m.group(1)] = layer_dense.get(m.group(1), 0) + 2 * math.prod(shape)
        elif how == "embedding-blocks":
            shared = blocks_of(t) if tied and kind in keep[2] else None  # one tensor: counted once
            load = embedding_loader(t, dev, dt, shared)
            if tied:  # the output layer: the same blocks, multiplied in place (read in full) or packed
                held += nbytes if shared is not None else nbytes - int(t.n_bytes)
                output = _named_errors(kernel_loader(t, shared) if shared is not None else
                                       packed_loader(t, dev, "output.weight", cache, tick), name, source)
                output.packs_tied_output = True  # build_model takes it instead of tying
                items.append(("output.weight", output))
        elif how.startswith("int4"):  # int4-packed, int4x2-packed, int4x2-requantized
            load = packed_loader(t, dev, meta, cache, tick)
            held += nbytes
        else:
            held += nbytes
            load = tensor_loader(t, dt)
        paths.setdefault(kind, set()).add(how)
        items.append((meta, _named_errors(load, name, source)))
        if how == "float16-kept" and (m := _BLK.fullmatch(name)):
            layer_f16[m.group(1)] = layer_f16.get(m.group(1), 0) + nbytes
    # a prefill widens one layer's float16 matrices to float32 at a time (core.model.f16),
    # unless the compiled kernels multiply them as they are; it dequantizes one layer's
    # kernel matrices to bfloat16
    widen = 0 if layer_f16 and kernel_ops.supports("F16") else 2 * max(layer_f16.values(), default=0)
    return items, paths, held + max(widen, max(layer_dense.values(), default=0))


class _Ticks:
    """The load's progress callback, re-sent with its last fraction from inside a tensor's
    packing: the callback is where a load's cancel is honoured (it raises)."""

    def __init__(self, progress: ProgressFn):
        self.progress, self.last = progress, (0.0, "reading GGUF tensors")

    def __call__(self, fraction: float, stage: str) -> None:
        self.last = (fraction, stage)
        self.progress(fraction, stage)

    def tick(self) -> None:
        self.progress(*self.last)


def _named_errors(load: Callable[[], torch.Tensor], gguf_tensor: str, source: str):
    """Errors from one tensor name the GGUF tensor (what the user can find in the file)."""
    def wrapped() -> torch.Tensor:
        try:
            return load()
        except CheckpointError as e:
            raise CheckpointError(str(e).split(" — ")[0], file=source, tensor=gguf_tensor) from None
        except Exception as e:
            log.info("tensor %s of %s: %s: %s", gguf_tensor, source, type(e).__name__, e)
            raise CheckpointError(f"this tensor cannot be read: {DAMAGED}", file=source, tensor=gguf_tensor) from None
    return wrapped


@functools.lru_cache(maxsize=None)
def can_dequantize(kind: Q) -> bool:
    """Whether gguf's ``dequantize`` reads tensors of ``kind`` (tried on one zero block)."""
    _, type_size = GGML_QUANT_SIZES[kind]
    try:
        dequantize(np.zeros((1, type_size), np.uint8), kind)
    except NotImplementedError:
        return False
    return True


def _unsupported_types(reader) -> tuple[str, str] | None:
    for t in reader.tensors:
        if not can_dequantize(t.tensor_type):
            return t.name, t.tensor_type.name
    return None
