"""Checkpoint formats. :func:`load` looks at what is on disk and picks the loader.

common (devices, dtypes, build_model) · meta / hf / gguf (the loaders) · gguf_reader (the
strict, bulk-reading GGUF reader) · gguf_header (header-only reading for listing and
sizing) · gguf_vocab (GGUF vocabularies as tokenizers) · gguf_write / convert (writers) ·
quality (perplexity and agreement against float32).
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch

from core.errors import CheckpointError
from core.checkpoints.common import QUANT_DTYPES, LoadedModel, ProgressFn, auto_dtype, resolve_device, resolve_dtype
from core.model import fused
from core.model.kernels import build as kernel_build
from core.model.kernels import ops as kernel_ops
from core.model.memory import release_freed_heap
from core.model.transformer import PLAIN_MODULES, Transformer

GGUF_MAGIC = b"GGUF"


def detect(path: str | Path) -> str:
    """'meta', 'hf' or 'gguf' for what is at path; CheckpointError listing what was looked for."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"no such file or folder: {p}")
    if p.is_file():
        try:
            with open(p, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise CheckpointError(f"cannot read {p}: {e.strerror}") from None
        if magic == GGUF_MAGIC:
            return "gguf"
        raise CheckpointError(f"{p.name} is not a GGUF file (no GGUF magic); open a .gguf file, "
                              "a Meta folder (params.json + consolidated.*.pth) or a Hugging Face "
                              "folder (config.json + *.safetensors)")
    names = {c.name for c in p.iterdir()}
    if "params.json" in names and any(n.startswith("consolidated.") and n.endswith(".pth") for n in names):
        return "meta"
    if "config.json" in names and (any(n.endswith(".safetensors") for n in names)
                                   or "model.safetensors.index.json" in names or "pytorch_model.bin" in names
                                   or "pytorch_model.bin.index.json" in names):
        return "hf"
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if len(ggufs) == 1:
        return "gguf"
    raise CheckpointError(
        f"{p} holds no model: looked for params.json + consolidated.*.pth (Meta), config.json + "
        "*.safetensors or pytorch_model.bin (Hugging Face), or one .gguf file")


def load(path: str | Path, *, device="auto", dtype="auto", max_seq_len: int | None = None,
         progress: ProgressFn | None = None) -> LoadedModel:
    """Load any supported checkpoint (Meta folder, Hugging Face folder, GGUF file).

    Args:
        device: 'auto', 'cpu', 'cuda' or 'mps'.
        dtype: 'auto', 'float32', 'bfloat16' or 'float16'.
        max_seq_len: limit the context (default: the model's own).
        progress: called with (fraction 0..1, stage text).
    """
    p = Path(path).expanduser()
    kind = detect(p)
    # why (these three): each format's loader and library (gguf, safetensors) are imported
    # on the thread that loads, the first time, not by everything that imports this package.
    if kind == "meta":
        from core.checkpoints.meta import load_meta as loader  # why: see above
    elif kind == "hf":
        from core.checkpoints.hf import load_hf as loader  # why: see above
    else:
        from core.checkpoints.gguf import load_gguf as loader  # why: see above
        if p.is_dir():
            p = next(iter(sorted(p.glob("*.gguf"))))
    loaded = loader(p, device=device, dtype=dtype, max_seq_len=max_seq_len, progress=progress)
    release_freed_heap()
    first = next(itertools.chain(loaded.model.parameters(), loaded.model.buffers()), None)
    if first is not None and first.device.type == "cpu":
        # The decode step's attention and SwiGLU run the compiled kernels on the CPU: build
        # them here, on the loading thread (cancellable through progress), not on the first
        # reply's decode step (seconds of compiling after an update).
        kernel_ops.kernels(tick=(lambda: progress(1.0, "compiling the CPU kernels")) if progress else None)
        # Model Info says which kernels run (their instruction set) or why there are none
        loaded.info.setdefault("kernels", kernel_build.describe())
        if isinstance(loaded.model, Transformer) and fused.applies(loaded.model, PLAIN_MODULES):
            loaded.info["kernels"] += " · the whole forward in one C call (a small float32 model)"
    if not isinstance(dtype, torch.dtype) and str(dtype or "auto") in ("auto", *QUANT_DTYPES):
        # info and the status bar's tooltip say what 'auto' chose and why.
        loaded.info.setdefault("dtype_reason", auto_dtype(resolve_device(device), loaded.args)[1])
    return loaded


__all__ = ["load", "detect", "LoadedModel", "ProgressFn", "resolve_device", "resolve_dtype", "CheckpointError"]
