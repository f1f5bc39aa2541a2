"""Meta checkpoint folders: params.json + consolidated.NN.pth shards + tokenizer.model."""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch

from core.prompt.chat_format import chat_format_for
from core import limits
from core.model.args import checked_args
from core.errors import CheckpointError, TokenizerError, one_line
from core.tokenizer import load_tokenizer
from core.checkpoints.common import (LoadedModel, ProgressFn, build_model, expected_shapes, model_info, quant_kind, resolve_device,
                     resolve_dtype)

# Meta's checkpoints carry precomputed RoPE frequencies (Llama 2); the model derives them.
IGNORED = ("rope.freqs",)


def is_meta_folder(path: Path) -> bool:
    return path.is_dir() and (path / "params.json").is_file() and any(path.glob("consolidated.*.pth"))


def shard_files(path: Path) -> list[Path]:
    def index(p: Path) -> int:
        m = re.fullmatch(r"consolidated\.(\d+)\.pth", p.name)
        return int(m.group(1)) if m else -1
    files = sorted((p for p in path.glob("consolidated.*.pth") if index(p) >= 0), key=index)
    if not files:
        raise CheckpointError("no consolidated.NN.pth weight file", file=str(path))
    return files


def read_params(path: Path) -> dict:
    f = path / "params.json"
    params = limits.read_json(f)
    if not isinstance(params, dict):
        raise CheckpointError("params.json is not a JSON object", file=str(f))
    return params


def safe_torch_load(file: Path) -> dict[str, torch.Tensor]:
    """torch.load with weights_only and mmap: nothing pickled runs, nothing is copied."""
    limits.check_regular(file)  # a FIFO or device would block or never end
    try:
        with limits.native_path(file) as native:
            sd = torch.load(native, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unsupported content"
        raise CheckpointError(f"refused to load: the file holds more than plain tensors ({first})",
                              file=str(file)) from None
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise CheckpointError(f"cannot read the weights (truncated or not a PyTorch file?): "
                              f"{one_line(e)}", file=str(file)) from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError("the file is not a dictionary of tensors", file=str(file))
    return sd


def find_tokenizer(path: Path) -> Path:
    """tokenizer.model in the folder, or beside it (Meta's Llama 2 download layout)."""
    for cand in (path / "tokenizer.model", path.parent / "tokenizer.model"):
        if cand.exists() and not cand.is_dir():  # a FIFO or device is refused by name when read
            return cand
    raise CheckpointError("no tokenizer.model in the folder or beside it", file=str(path))


def merge_shards(shards: list[dict[str, torch.Tensor]], shapes: dict[str, tuple[int, ...]], files: list[Path]):
    """Yield (name, loader) with model-parallel pieces concatenated along their split dim."""
    names = list(shards[0].keys())
    for i, sd in enumerate(shards[1:], 1):
        if set(sd) != set(names):
            diff = sorted(set(sd) ^ set(names))[0]
            raise CheckpointError("shards do not hold the same tensors", file=str(files[i]), tensor=diff)
    for name in names:
        pieces = [sd[name] for sd in shards]
        want = shapes.get(name)

        def load(pieces=pieces, want=want, name=name):
            if len(pieces) == 1 or want is None or tuple(pieces[0].shape) == want:
                return pieces[0]
            for d in range(pieces[0].dim()):
                if pieces[0].shape[d] * len(pieces) == want[d]:
                    return torch.cat(pieces, dim=d)
            raise CheckpointError(f"shards of shape {tuple(pieces[0].shape)} do not combine into {want}",
                                  file=str(files[0]), tensor=name)
        yield name, load


def load_meta(path: str | Path, *, device="auto", dtype="auto", max_seq_len: int | None = None,
              progress: ProgressFn | None = None) -> LoadedModel:
    """Load a Meta-format folder.

    Args:
        path: folder with params.json and consolidated.NN.pth.
        max_seq_len: the context to use (default: the model's; params.json rarely says).
    """
    path = Path(path)
    dev = resolve_device(device)
    params = read_params(path)
    files = shard_files(path)
    try:
        tok = load_tokenizer(find_tokenizer(path))
    except TokenizerError as e:
        raise CheckpointError(str(e)) from None
    if progress:
        progress(0.0, "reading weights")
    shards = [safe_torch_load(f) for f in files]
    pfile = str(path / "params.json")
    vocab = params.get("vocab_size", -1)
    if isinstance(vocab, bool) or not isinstance(vocab, (int, float)) or vocab <= 0:
        emb = shards[0].get("tok_embeddings.weight")
        if emb is None or emb.dim() != 2:
            vocab = tok.vocab_size
        elif len(shards) > 1 and emb.shape[1] * len(shards) == params.get("dim"):
            vocab = emb.shape[0]  # split along the embedding dim (Llama 2)
        else:
            vocab = emb.shape[0] * len(shards)  # split along the vocabulary (Llama 3)
    theta = params.get("rope_theta", 1e4)
    ctx = params.get("max_seq_len") or (131072 if params.get("use_scaled_rope") else
                                        8192 if isinstance(theta, (int, float)) and theta >= 5e5 else 4096)
    tied = params.get("tie_word_embeddings", False)
    args = checked_args({**params, "vocab_size": vocab, "max_seq_len": max_seq_len or ctx,
                                "tie_word_embeddings": tied if tied not in (False, 0) else "output.weight" not in shards[0]},
                               file=pfile)
    dt = resolve_dtype(dtype, dev, args)
    if tok.vocab_size > args.vocab_size:
        raise CheckpointError(f"the tokenizer has {tok.vocab_size} tokens but the embedding only "
                              f"{args.vocab_size}", file=str(find_tokenizer(path)))
    limits.check_model(args, dt, dev, source=str(path))
    shapes = expected_shapes(args)
    model = build_model(args, merge_shards(shards, shapes, files), device=dev, dtype=dt,
                        source=str(files[0]), progress=progress, ignore=IGNORED, mapped_sources=True,
                        quantize=quant_kind(dtype))
    fmt = chat_format_for(tok)
    stop = set(tok.stop_ids) | fmt.stop_ids()
    info = model_info("meta", path, args, model, tok, fmt,
                      tensor_types=sorted({str(t.dtype).removeprefix("torch.") for t in shards[0].values()}),
                      dequantized=False, files=[f.name for f in files],
                      chat_template_source=None)  # Meta folders carry no template: chosen from the tokenizer
    return LoadedModel(model, tok, fmt, args, stop, info)


def save_meta(loaded: LoadedModel, dst: str | Path, *, tokenizer_file: str | Path | None = None) -> Path:
    """Write a Meta-format folder (params.json, consolidated.00.pth, tokenizer.model)."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    args = loaded.args
    params = args.to_params()
    (dst / "params.json").write_text(json.dumps(params, indent=2) + "\n")
    sd = {k: v.contiguous() for k, v in loaded.model.state_dict().items()}
    if args.tie_word_embeddings:
        sd.pop("output.weight", None)
    torch.save(sd, dst / "consolidated.00.pth")
    if tokenizer_file is not None:
        (dst / "tokenizer.model").write_bytes(Path(tokenizer_file).read_bytes())
    return dst
