"""What every checkpoint format shares: devices, dtypes, and building a model safely."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from core.errors import CheckpointError, SettingsError
from core.model.transformer import Transformer
from core.model.args import ModelArgs
from core.model.memory import release_mapped_pages
from core.model.tuning import cpu_choice
from core.model.pack import packable, quantizer
from core.model.quant import QUANT_DTYPES, Packed, describe, packed_shape, swap_linear

ProgressFn = Callable[[float, str], None]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: What --dtype and the app's Model > Data Type menu offer: int8/int4 quantize linear
#: weights at load (weight-only; the rest computes in what 'auto' picks).
DTYPE_CHOICES = ("auto", *DTYPES, *QUANT_DTYPES)


@dataclass
class LoadedModel:
    """A model ready to run, with everything needed to talk to it."""
    model: Transformer
    tokenizer: Any  # core.tokenizer.Tokenizer
    chat_format: Any  # core.prompt.chat_format.ChatFormat
    args: ModelArgs
    stop_ids: set[int]
    info: dict[str, Any] = field(default_factory=dict)
    #: the chat template text the checkpoint carried (never evaluated; kept for convert)
    chat_template: str | None = None

    @property
    def name(self) -> str:
        return self.info.get("name", "model")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """'auto' picks cuda, then mps, then cpu; anything else must be available."""
    name = str(device or "auto")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SettingsError(f"unknown device '{name}' (use auto, cpu, cuda or mps)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SettingsError("device 'cuda' was asked for, but no CUDA GPU is available")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SettingsError("device 'mps' was asked for, but Apple's MPS is not available")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise SettingsError(f"unsupported device '{name}' (use auto, cpu, cuda or mps)")
    return dev


def total_memory_bytes() -> int | None:
    """Physical memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device,
                  args: ModelArgs | None = None) -> torch.dtype:
    """'auto': see :func:`auto_dtype`; otherwise the named dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype or "auto")
    if name == "auto" or name in QUANT_DTYPES:
        return auto_dtype(device, args)[0]
    if name not in DTYPES:
        raise SettingsError(f"unknown dtype '{name}' (use {', '.join(DTYPE_CHOICES)})")
    return DTYPES[name]


#: float32 weights up to this size compute in float32 on the CPU whatever the probe says:
#: they sit in the CPU's caches, so a product costs its call, not its memory traffic, and
#: a float32 call costs a fraction of a bfloat16 one (one thread, Zen 4 with AVX-512 BF16:
#: a decode step's seven products of a dim-64 layer 77 µs in float32 against 260 µs in
#: bfloat16, dim 128 41 against 172 µs; parity near dim 512, whose layer is 12 MB)
SMALL_FLOAT32_BYTES = 32 << 20
SMALL_REASON = "float32: a small model (its float32 weights fit in the CPU's caches, where float32 products are fastest)"


def auto_dtype(device: torch.device, args: ModelArgs | None = None) -> tuple[torch.dtype, str]:
    """The compute dtype 'auto' means here, and why.

    bfloat16 on CUDA (float16 without bf16 support), float16 on MPS. On CPU bfloat16 when
    float32 weights would take over half the machine's memory (an 8B model in float32 would
    not load on most laptops), float32 for a small model (``SMALL_FLOAT32_BYTES``), else
    whichever a measured probe of this CPU's kernels found faster (:mod:`core.model.tuning`;
    cached per machine).
    """
    if device.type == "cuda":
        bf = torch.cuda.is_bf16_supported()
        return (torch.bfloat16, "bfloat16: CUDA") if bf else (torch.float16, "float16: this GPU lacks bfloat16")
    if device.type == "mps":
        return torch.float16, "float16: MPS"
    total = total_memory_bytes()
    n = sum(math.prod(s) for s in expected_shapes(args).values()) if args is not None else None
    if n is not None and total and 4 * n > total // 2:
        return torch.bfloat16, "bfloat16: float32 weights would take over half of this machine's memory"
    if n is not None and 4 * n <= SMALL_FLOAT32_BYTES:
        return torch.float32, SMALL_REASON
    choice = cpu_choice()
    return DTYPES[choice.dtype], choice.reason


def prefault(t: torch.Tensor) -> None:
    """Read one element of every page of a CPU tensor now (a memory-mapped weight is
    otherwise paged in from disk by the first forward pass: the first reply waits on the
    loader). Costs one strided read per 4 KiB; pages already resident cost nothing."""
    if t.device.type != "cpu" or t.numel() == 0 or not t.is_contiguous():
        return
    step = max(1, 4096 // t.element_size())
    t.detach().reshape(-1)[::step].sum()


def quant_kind(dtype: str | torch.dtype | None) -> str | None:
    """'int8' or 'int4' when ``dtype`` asks to quantize float weights at load, else None."""
    return dtype if isinstance(dtype, str) and dtype in QUANT_DTYPES else None


def foreign_name(meta: str, top_map: Mapping[str, str], layer_map: Mapping[str, str], layer_prefix: str) -> str:
    """Invert a format's name map: the format's name for a Meta tensor name.

    Args:
        top_map: format name -> Meta name, for tensors outside the layers.
        layer_map: format suffix -> Meta suffix, for tensors of one layer.
        layer_prefix: the format's layer prefix, e.g. "model.layers." or "blk.".
    """
    for k, v in top_map.items():
        if v == meta:
            return k
    _, idx, tail = meta.split(".", 2)
    for k, v in layer_map.items():
        if v == tail:
            return f"{layer_prefix}{idx}.{k}"
    raise KeyError(meta)


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint must provide, by Meta name, with its shape."""
    with torch.device("meta"):
        model = Transformer(args)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if args.tie_word_embeddings:
        shapes.pop("output.weight", None)
    return shapes


def build_model(args: ModelArgs, tensors: Mapping[str, Callable[[], torch.Tensor]] | Iterable,
                *, device: torch.device, dtype: torch.dtype, source: str,
                progress: ProgressFn | None = None, ignore: Iterable[str] = (),
                display: Mapping[str, str] | None = None,
                sources: Mapping[str, str] | None = None, mapped_sources: bool = False,
                quantize: str | None = None) -> Transformer:
    """Build on the meta device and assign each checked tensor in the target dtype.

    Args:
        tensors: Meta-named tensors, as a mapping name -> zero-argument loader (so one
            tensor at a time is materialised) or an iterable of (name, loader) pairs.
        source: the file or folder named in errors.
        ignore: tensor names the format carries that the model derives (e.g. rope.freqs).
        display: Meta name -> the name the file uses, so errors name what the user can find.
        mapped_sources: the loaders return views of a private file mapping (torch.load
            with mmap, safetensors): once converted, a source's pages are released.
        sources: Meta name -> the file holding it (sharded checkpoints); default ``source``.
        quantize: 'int8' or 'int4' turns each float linear weight into a packed layer as it
            loads (weights whose shape the kernels cannot take stay float). A loader may
            also return a packed layer itself (quantized GGUF tensors).

    Raises:
        CheckpointError naming the file and the tensor for an unknown, missing or
        misshapen tensor; no half-built model escapes.
    """
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    shapes = expected_shapes(args)
    shown = (lambda n: display.get(n, n)) if display else (lambda n: n)
    where = (lambda n: sources.get(n, source)) if sources else (lambda n: source)
    ignore = set(ignore)
    state: dict[str, torch.Tensor] = {}
    packed: dict[str, torch.nn.Module] = {}
    total = max(len(items), 1)
    for i, (name, load) in enumerate(items):
        if name in ignore:
            continue
        if args.tie_word_embeddings and name == "output.weight":
            # tied: the output layer is the embedding, unless a loader packed it from the
            # embedding's quantized blocks (see gguf.holding)
            if getattr(load, "packs_tied_output", False):
                packed[name] = _checked_packed(load(), (args.vocab_size, args.dim), where(name), shown(name))
            continue
        if name not in shapes:
            raise CheckpointError("unexpected tensor (not part of a Llama model)", file=where(name), tensor=shown(name))
        t = _read_tensor(load, where(name), shown(name))
        if isinstance(t, Packed):
            packed[name] = _checked_packed(t, shapes[name], where(name), shown(name))  # packed on the target device
        else:
            converted, is_packed = _converted(t, name, shapes[name], device=device, dtype=dtype, quantize=quantize,
                                              file=where(name), tensor=shown(name))
            (packed if is_packed else state)[name] = converted
            if mapped_sources and t.device.type == "cpu" and (is_packed or converted.data_ptr() != t.data_ptr()):
                release_mapped_pages(t.data_ptr(), t.untyped_storage().nbytes())
        if progress:
            progress((i + 1) / total, f"loading {name}")
    missing = [k for k in shapes if k not in state and k not in packed]
    if missing:
        raise CheckpointError(f"missing tensor ({len(missing)} missing in all)", file=source, tensor=shown(missing[0]))
    return _assembled(args, state, packed)


def _read_tensor(load: Callable[[], Any], file: str, tensor: str) -> Any:
    try:
        return load()
    except CheckpointError:
        raise
    except Exception as e:  # a corrupt or truncated file surfaces here
        raise CheckpointError(f"could not read tensor: {e}", file=file, tensor=tensor) from None


def _checked_packed(layer: torch.nn.Module, want: tuple[int, ...], file: str, tensor: str) -> torch.nn.Module:
    if packed_shape(layer) != want:
        raise CheckpointError(f"shape {packed_shape(layer)} does not fit the model's {want}", file=file, tensor=tensor)
    return layer


def _converted(t: torch.Tensor, name: str, want: tuple[int, ...], *, device: torch.device, dtype: torch.dtype,
               quantize: str | None, file: str, tensor: str) -> tuple[Any, bool]:
    """One loaded float tensor, checked and moved to ``device``: (a packed layer when
    ``quantize`` takes it, else the tensor in ``dtype``; whether it was packed)."""
    if tuple(t.shape) != want:
        raise CheckpointError(f"shape {tuple(t.shape)} does not fit the model's {want}", file=file, tensor=tensor)
    if t.is_floating_point() is False:
        raise CheckpointError(f"tensor has non-float dtype {t.dtype}", file=file, tensor=tensor)
    if quantize and t.dim() == 2 and name != "tok_embeddings.weight" \
            and packable(quantize, tuple(t.shape), device) is None:
        converted, is_packed = quantizer(quantize)(t.to(device), device), True
    else:
        converted, is_packed = t.to(device=device, dtype=dtype), False
        prefault(converted)
    _check_finite(t if is_packed else converted, file, tensor)
    return converted, is_packed


def _assembled(args: ModelArgs, state: dict[str, torch.Tensor], packed: dict[str, torch.nn.Module]) -> Transformer:
    """The model built on the meta device, its tensors assigned and its packed layers swapped in."""
    with torch.device("meta"):
        model = Transformer(args)
    for name, layer in packed.items():
        swap_linear(model, name, layer)
    model.load_state_dict(state, assign=True, strict=not args.tie_word_embeddings and not packed)
    if args.tie_word_embeddings and "output.weight" not in packed:
        model.output.weight = model.tok_embeddings.weight
    model.eval().requires_grad_(False)
    return model


def _check_finite(t: torch.Tensor, file: str, tensor: str) -> None:
    """Refuse NaN or infinite weights: they give silently wrong replies.

    One float64-accumulated sum per tensor: any NaN or ±inf makes it non-finite (+inf and
    -inf sum to NaN), no finite weights can overflow float64, and nothing of the tensor's
    size is allocated.
    """
    if t.numel() and not math.isfinite(float(t.sum(dtype=torch.float64))):
        bad = int((~torch.isfinite(t)).flatten().nonzero()[0])
        raise CheckpointError(f"holds NaN or infinite values (first at flat index {bad}): corrupt weights",
                              file=file, tensor=tensor)


def model_info(fmt: str, path: Path, args: ModelArgs, model: Transformer, tokenizer, chat_format,
               **extra: Any) -> dict[str, Any]:
    """The facts `info` and the GUI show about a loaded model."""
    w = model.tok_embeddings.weight
    # by address: a tied F16 output and embedding are two views of the same mapped bytes
    spans = {(t.data_ptr(), t.numel() * t.element_size()) for t in [*model.parameters(), *model.buffers()]}
    nbytes = sum(n for _, n in spans)
    packed = [m for m in model.modules() if isinstance(m, Packed)
              and not (args.tie_word_embeddings and m is model.output)]  # tied: one matrix, counted once
    info = {
        "format": fmt,
        "path": str(path),
        "name": path.stem if path.is_file() else path.name,
        "parameters": model.num_parameters() + sum(math.prod(packed_shape(m)) for m in packed),
        "context_length": args.max_seq_len,
        "vocab_size": args.vocab_size,
        "dim": args.dim,
        "n_layers": args.n_layers,
        "n_heads": args.n_heads,
        "n_kv_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "hidden_dim": args.hidden_dim,
        "norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": args.rope_scaling,
        "tie_word_embeddings": args.tie_word_embeddings,
        "dtype": str(w.dtype).removeprefix("torch."),
        "device": str(w.device),
        "memory_bytes": nbytes,
        "tokenizer": getattr(tokenizer, "kind", type(tokenizer).__name__),
        "chat_format": chat_format.name,
        "linear_paths": describe(model),
    }
    tv = getattr(tokenizer, "vocab_size", 0)
    if 0 < tv < args.vocab_size:
        # Rows past the tokenizer are never sampled (the engine masks them); say so here.
        info["tokenizer_vocab_size"] = tv
        info.setdefault("warnings", []).append(
            f"the embedding has {args.vocab_size} rows but the tokenizer only {tv} tokens: "
            f"the {args.vocab_size - tv} extra ids are never sampled")
    info.update(extra)
    return info
