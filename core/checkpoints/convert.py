"""Convert any supported checkpoint into a Hugging Face-style (or Meta) folder or a GGUF file.

``python -m core convert SRC DST`` (core/cli/convert.py) loads SRC with the ordinary loader (so everything it
checks is checked) and writes DST; quantized GGUF tensors are read dequantized. With
``--to gguf --type Q4_0`` (or Q8_0, F16, ...) DST is a GGUF file with quantized matrices.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from core.checkpoints import load
from core.checkpoints.common import DTYPES, LoadedModel, ProgressFn
from core.checkpoints.gguf_write import GGUF_TYPES, save_gguf
from core.checkpoints.hf import save_hf
from core.checkpoints.meta import save_meta
from core.errors import CheckpointError

# Stored type names (torch, safetensors and GGUF spellings) -> the dtype to keep on output.
_KEEP = {"float16": torch.float16, "F16": torch.float16, "bfloat16": torch.bfloat16, "BF16": torch.bfloat16}


def output_dtype(loaded: LoadedModel, dtype: str = "auto") -> torch.dtype:
    """'auto' keeps a 16-bit source's precision; float32 otherwise (quantized, mixed, F32)."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise CheckpointError(f"unknown dtype '{dtype}' (use auto, float32, bfloat16 or float16)")
        return DTYPES[dtype]
    # Norm weights are often F32 beside 16-bit matrices; they do not decide the precision.
    kinds = {_KEEP.get(t) for t in loaded.info.get("tensor_types", []) if t not in ("F32", "float32")}
    return kinds.pop() if len(kinds) == 1 and None not in kinds else torch.float32


def convert(src: str | Path, dst: str | Path, *, fmt: str = "hf", dtype: str = "auto",
            progress: ProgressFn | None = None, overwrite: bool = False, qtype: str = "Q8_0") -> Path:
    """Write the checkpoint at ``src`` as a folder (or, for 'gguf', a file) at ``dst``.

    Args:
        fmt: 'hf' (config.json, model.safetensors, tokenizer files, tokenizer_config.json,
            generation_config.json), 'meta' (params.json, consolidated.00.pth, tokenizer.model)
            or 'gguf' (one file; matrices as ``qtype``, see core.checkpoints.gguf_write).
        dtype: 'auto' (keep a 16-bit source's dtype, else float32), 'float32', 'bfloat16', 'float16'.
        overwrite: allow writing into a non-empty ``dst``.

    The folder is written beside ``dst`` and moved into place at the end, so a failure
    never leaves a half-written model where a loader would find it.
    """
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if fmt not in ("hf", "meta", "gguf"):
        raise CheckpointError(f"unknown output format '{fmt}' (use hf, meta or gguf)")
    if fmt == "gguf":
        return _convert_gguf(src, dst, qtype, progress, overwrite)
    if dst.exists() and (not dst.is_dir() or (any(dst.iterdir()) and not overwrite)):
        raise CheckpointError(f"{dst} already exists and is not empty (pass --overwrite to replace it)")
    if dst.resolve() == src.resolve():
        raise CheckpointError("source and destination are the same")
    loaded = load(src, device="cpu", dtype="float32", progress=progress)
    out_dtype = output_dtype(loaded, dtype)
    if out_dtype != torch.float32:
        loaded.model.to(out_dtype)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        if fmt == "hf":
            save_hf(loaded, tmp)
        else:
            _save_meta_folder(loaded, tmp)
        _usual_permissions(tmp)
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if progress:
        progress(1.0, f"wrote {dst}")
    return dst


def _usual_permissions(folder: Path) -> None:
    """The modes a plain mkdir/open would have given (0755/0644 under umask 022): mkdtemp
    and temporary files are private (0700/0600), the converted model is not."""
    umask = os.umask(0o022)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for p in folder.rglob("*"):
        p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)


def _convert_gguf(src: Path, dst: Path, qtype: str, progress: ProgressFn | None, overwrite: bool) -> Path:
    if qtype not in GGUF_TYPES:
        raise CheckpointError(f"unknown GGUF tensor type '{qtype}' (use {', '.join(GGUF_TYPES)})")
    if dst.exists() and (dst.is_dir() or not overwrite):
        raise CheckpointError(f"{dst} already exists (pass --overwrite to replace a file)")
    if dst.resolve() == src.resolve():
        raise CheckpointError("source and destination are the same")
    loaded = load(src, device="cpu", dtype="float32", progress=progress)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        save_gguf(loaded, tmp, qtype)
        umask = os.umask(0o022)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp's file is private; a converted model is not
        tmp.replace(dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if progress:
        progress(1.0, f"wrote {dst}")
    return dst


def _save_meta_folder(loaded: LoadedModel, dst: Path) -> None:
    save_meta(loaded, dst)
    tok = loaded.tokenizer
    if tok.kind == "sentencepiece":
        (dst / "tokenizer.model").write_bytes(tok.processor.serialized_model_proto())
    elif tok.kind == "tiktoken":
        shutil.copyfile(tok.source, dst / "tokenizer.model")
    else:
        raise CheckpointError("a Meta folder holds a SentencePiece or tiktoken tokenizer.model; this "
                              "model's tokenizer is a tokenizer.json (convert to hf instead)")
