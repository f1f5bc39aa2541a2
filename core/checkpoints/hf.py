"""Hugging Face folders: config.json + safetensors, mapped onto Meta's names and layout."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch

from safetensors import safe_open
from safetensors.torch import save_file

from core import limits
from core.checkpoints.common import (LoadedModel, ProgressFn, build_model, expected_shapes, foreign_name,
                                     model_info, quant_kind, resolve_device, resolve_dtype)
from core.checkpoints.meta import safe_torch_load
from core.errors import CheckpointError, TokenizerError, one_line
from core.model.args import ModelArgs, checked_args
from core.prompt.chat_format import chat_format_for
from core.tokenizer import HFTokenizer, load_tokenizer


def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF stores Q/K rows per head as [all even dims, all odd dims] (rotate-half);
    Meta interleaves them as (even, odd) pairs. Undo HF's permutation: [out, in] -> [out, in]."""
    out, inp = w.shape
    hd = out // n_heads
    return w.view(n_heads, 2, hd // 2, inp).transpose(1, 2).reshape(out, inp)


def permute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's interleaved Q/K rows -> HF's rotate-half order (the inverse of unpermute_rotary)."""
    out, inp = w.shape
    hd = out // n_heads
    return w.view(n_heads, hd // 2, 2, inp).transpose(1, 2).reshape(out, inp)


# config.json's key for each ModelArgs field, so range errors name what the user can find.
CONFIG_KEYS = {
    "dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads", "vocab_size": "vocab_size", "hidden_dim": "intermediate_size",
    "head_dim": "head_dim", "norm_eps": "rms_norm_eps", "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling", "tie_word_embeddings": "tie_word_embeddings",
    "max_seq_len": "max_position_embeddings",
}


def args_from_config(cfg: dict[str, Any], *, file: str = "config.json", **overrides: Any) -> ModelArgs:
    """ModelArgs from a LlamaForCausalLM config.json dict, every value range-checked.

    Raises:
        CheckpointError naming ``file`` and the config key that is missing or out of range.
    """
    # transformers ≥ 5 writes `rope_parameters` (theta included); older files `rope_scaling`.
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or None
    rope = None
    if scaling:
        if not isinstance(scaling, dict):
            raise CheckpointError("field 'rope_scaling' must be an object", file=file)
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "llama3":
            rope = {k: scaling.get(k) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings")}
        elif kind not in (None, "default"):
            raise CheckpointError(f"rope_scaling type '{limits.brief(kind)}' is not supported (only llama3)", file=file)
    theta = cfg.get("rope_theta")
    if theta is None:
        rp = cfg.get("rope_parameters")
        theta = rp.get("rope_theta", 10000.0) if isinstance(rp, dict) else 10000.0
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"):
        if key not in cfg:
            raise CheckpointError(f"field '{key}' is missing", file=file)
    kw = dict(
        dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"], n_heads=cfg["num_attention_heads"],
        n_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"], vocab_size=cfg["vocab_size"],
        hidden_dim=cfg["intermediate_size"], head_dim=cfg.get("head_dim"),
        norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=rope,
        tie_word_embeddings=cfg.get("tie_word_embeddings", False) or False,
        max_seq_len=cfg.get("max_position_embeddings", 4096),
    )
    kw.update(overrides)
    return checked_args(kw, file=file, names=CONFIG_KEYS)


_LAYER_MAP = {
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_TOP_MAP = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}


def meta_name(hf_name: str) -> str | None:
    """The Meta name for an HF tensor name, or None if it is not a model weight."""
    if hf_name in _TOP_MAP:
        return _TOP_MAP[hf_name]
    if hf_name.startswith("model.layers."):
        rest = hf_name[len("model.layers."):]
        idx, _, tail = rest.partition(".")
        if idx.isdigit() and tail in _LAYER_MAP:
            return f"layers.{idx}.{_LAYER_MAP[tail]}"
    return None


def hf_name(meta: str) -> str:
    """The HF tensor name for a Meta name (inverse of meta_name)."""
    return foreign_name(meta, _TOP_MAP, _LAYER_MAP, "model.layers.")


def to_meta_tensor(name: str, t: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    """Convert one HF tensor (already renamed to ``name``) to Meta's layout."""
    if name.endswith("attention.wq.weight"):
        return unpermute_rotary(t, args.n_heads)
    if name.endswith("attention.wk.weight"):
        return unpermute_rotary(t, args.n_kv_heads)
    return t


def to_hf_tensor(name: str, t: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    """Convert one Meta tensor to HF's layout (for writing HF folders)."""
    if name.endswith("attention.wq.weight"):
        return permute_rotary(t, args.n_heads)
    if name.endswith("attention.wk.weight"):
        return permute_rotary(t, args.n_kv_heads)
    return t


# --------------------------------------------------------------------------- loading

# Older transformers saved each layer's RoPE inverse frequencies; the model derives them.
_DERIVED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


def _read_json(file: Path, *, required: bool = False) -> dict[str, Any] | None:
    if not file.exists():
        if required:
            raise CheckpointError(f"{file.name} is missing", file=str(file))
        return None
    data = limits.read_json(file)
    if not isinstance(data, dict):
        raise CheckpointError(f"{file.name} is not a JSON object", file=str(file))
    return data


def weight_files(path: Path) -> tuple[str, dict[str, Path]]:
    """('safetensors' | 'bin', HF tensor name -> file) for an HF folder, without reading data."""
    for index_name, kind in ((SAFETENSORS_INDEX, "safetensors"), (BIN_INDEX, "bin")):
        index = _read_json(path / index_name)
        if index is None:
            continue
        wm = index.get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise CheckpointError("index has no weight_map", file=str(path / index_name))
        files = {}
        for name, fname in wm.items():
            f = path / str(fname)
            if Path(str(fname)).name != str(fname) or not f.is_file():
                raise CheckpointError(f"shard '{fname}' listed in the index is missing",
                                      file=str(path / index_name), tensor=name)
            files[name] = f
        return kind, files
    st = sorted(path.glob("*.safetensors"))
    if st:
        return "safetensors", {"": f for f in st}  # names come from each file's header
    if (path / "pytorch_model.bin").is_file():
        return "bin", {"": path / "pytorch_model.bin"}
    raise CheckpointError("no weights: looked for model.safetensors, *.safetensors shards with "
                          f"{SAFETENSORS_INDEX}, or pytorch_model.bin", file=str(path))


MAX_SAFETENSORS_HEADER = 100 * limits.MiB  # safetensors' own limit


def check_safetensors_header(file: Path) -> None:
    """Read only the header (8-byte length + JSON) and refuse what safetensors would
    accept silently: a tensor name stated twice (its JSON parser keeps the last one)."""
    with limits.opened_regular(file) as fd:
        size = os.fstat(fd).st_size
        head = os.read(fd, 8)
        if len(head) < 8:
            raise CheckpointError("not a safetensors file (shorter than its 8-byte header length)", file=str(file))
        n = int.from_bytes(head, "little")
        if n > min(MAX_SAFETENSORS_HEADER, size - 8):
            raise CheckpointError(f"the header claims {n} bytes, more than the file holds or "
                                  f"{limits.human(MAX_SAFETENSORS_HEADER)}: truncated or corrupt", file=str(file))
        data = os.pread(fd, n, 8)

    def pairs(items):
        seen = set()
        for k, _ in items:
            if k in seen:
                raise CheckpointError("tensor is stated twice in the header", file=str(file), tensor=k)
            seen.add(k)
        return dict(items)

    header = limits.parse_json(data, file=str(file), object_pairs_hook=pairs, depth=8)
    if not isinstance(header, dict):
        raise CheckpointError("the safetensors header is not a JSON object", file=str(file))


def _open_safetensors(file: Path):
    check_safetensors_header(file)
    try:
        with limits.native_path(file) as native:
            return safe_open(native, framework="pt", device="cpu")  # memory-mapped
    except (MemoryError, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 — Rust panics are BaseExceptions
        raise CheckpointError(f"not a readable safetensors file (truncated or corrupt?): "
                              f"{one_line(e)}", file=str(file)) from None


def hf_tensors(path: Path) -> tuple[list[tuple[str, Path, Callable[[], torch.Tensor]]], list[str]]:
    """Every tensor of an HF folder as (HF name, file, loader), plus the stored dtypes.

    Nothing is read here beyond headers: loaders fetch one tensor each from a memory map.
    """
    kind, files = weight_files(path)
    out: list[tuple[str, Path, Callable[[], torch.Tensor]]] = []
    dtypes: set[str] = set()
    seen: dict[str, Path] = {}
    for file in dict.fromkeys(files.values()):
        if kind == "safetensors":
            handle = _open_safetensors(file)
            names = list(handle.keys())
            for n in names:
                dtypes.add(_ST_DTYPES.get(handle.get_slice(n).get_dtype(), handle.get_slice(n).get_dtype()))

            def loader(n, handle=handle):
                return lambda: handle.get_tensor(n)
        else:
            sd = safe_torch_load(file)
            names = list(sd)
            dtypes.update(str(t.dtype).removeprefix("torch.") for t in sd.values())

            def loader(n, sd=sd):
                return lambda: sd[n]
        for n in names:
            if n in seen:
                raise CheckpointError(f"tensor is stored twice (also in {seen[n].name})", file=str(file), tensor=n)
            seen[n] = file
            out.append((n, file, loader(n)))
    return out, sorted(dtypes)


_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


def _token_text(v: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or an AddedToken dict."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def read_chat_template(path: Path, tcfg: dict[str, Any] | None) -> str | None:
    """The chat template text (never evaluated) from tokenizer_config.json or its side files."""
    t = (tcfg or {}).get("chat_template")
    if isinstance(t, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    if isinstance(t, str) and t:
        return t
    # transformers ≥ 4.43 may save the template beside tokenizer_config.json instead.
    jinja = path / "chat_template.jinja"
    if jinja.exists():
        try:
            return limits.read_limited(jinja, limits.MAX_CONFIG_BYTES).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"cannot read the chat template: {e}", file=str(jinja)) from None
    side = _read_json(path / "chat_template.json")
    if side and isinstance(side.get("chat_template"), str):
        return side["chat_template"]
    return None


def _eos_ids(*cfgs: dict[str, Any] | None) -> set[int]:
    for cfg in cfgs:
        v = (cfg or {}).get("eos_token_id")
        if v is None:
            continue
        ids = v if isinstance(v, list) else [v]
        return {int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool)}
    return set()


def hf_tokenizer(path: Path, tcfg: dict[str, Any] | None):
    """The folder's tokenizer: tokenizer.json first, then tokenizer.model."""
    tj, tm = path / "tokenizer.json", path / "tokenizer.model"
    try:
        if tj.is_file():
            cfg = tcfg or {}
            tok = HFTokenizer(tj, bos_token=_token_text(cfg.get("bos_token")),
                              eos_token=_token_text(cfg.get("eos_token")))
            return tok, tj
        if tm.is_file():
            return load_tokenizer(tm), tm
    except TokenizerError as e:
        raise CheckpointError(str(e), file=str(tj if tj.is_file() else tm)) from None
    raise CheckpointError("no tokenizer: looked for tokenizer.json and tokenizer.model", file=str(path))


def load_hf(path: str | Path, *, device="auto", dtype="auto", max_seq_len: int | None = None,
            progress: ProgressFn | None = None) -> LoadedModel:
    """Load a Hugging Face LlamaForCausalLM folder (safetensors, sharded or not, or a
    weights-only pytorch_model.bin), un-permuting Q/K to Meta's interleaved RoPE layout.

    Raises:
        CheckpointError naming the file (and tensor) for anything that does not fit.
    """
    path = Path(path)
    dev = resolve_device(device)
    cfg_file = path / "config.json"
    cfg = _read_json(cfg_file, required=True)
    mtype = cfg.get("model_type")
    if mtype not in (None, "llama"):
        raise CheckpointError(f"model type '{mtype}' is not supported (only llama)", file=str(cfg_file))
    args = args_from_config(cfg, file=str(cfg_file), **({"max_seq_len": max_seq_len} if max_seq_len else {}))
    dt = resolve_dtype(dtype, dev, args)
    tcfg = _read_json(path / "tokenizer_config.json")
    gcfg = _read_json(path / "generation_config.json")
    tok, tok_file = hf_tokenizer(path, tcfg)
    if tok.vocab_size > args.vocab_size:
        raise CheckpointError(f"the tokenizer has {tok.vocab_size} tokens but the embedding only "
                              f"{args.vocab_size}", file=str(tok_file), tensor="model.embed_tokens.weight")
    if progress:
        progress(0.0, "reading weights")
    tensors, stored = hf_tensors(path)
    limits.check_model(args, dt, dev, source=str(path))
    items, sources = [], {}
    display = {m: hf_name(m) for m in expected_shapes(args)}  # names missing tensors too
    for name, file, load in tensors:
        meta = meta_name(name)
        if meta is None:
            if _DERIVED.fullmatch(name):
                continue
            raise CheckpointError("unexpected tensor (not part of a Llama model)", file=str(file), tensor=name)
        sources[meta] = str(file)
        items.append((meta, lambda meta=meta, load=load: to_meta_tensor(meta, load(), args)))
    model = build_model(args, items, device=dev, dtype=dt, source=str(path), progress=progress,
                        display=display, sources=sources, mapped_sources=True, quantize=quant_kind(dtype))
    template = read_chat_template(path, tcfg)
    fmt = chat_format_for(tok, template=template)
    gen_stops = _eos_ids(gcfg, cfg)
    bad = sorted(i for i in gen_stops if not 0 <= i < args.vocab_size)
    if bad:
        raise CheckpointError(f"eos_token_id {bad[0]} is outside the {args.vocab_size}-token vocabulary",
                              file=str(path / ("generation_config.json" if gcfg else "config.json")))
    stop = set(tok.stop_ids) | fmt.stop_ids() | gen_stops
    source = "tokenizer_config" if template else ("tokenizer" if fmt.name != "raw" else None)
    info = model_info("hf", path, args, model, tok, fmt, tensor_types=stored, dequantized=False,
                      chat_template_source=source, files=sorted({Path(s).name for s in sources.values()}))
    return LoadedModel(model, tok, fmt, args, stop, info, chat_template=template)


# --------------------------------------------------------------------------- writing


def config_from_args(args: ModelArgs, *, bos_id: int | None = None, eos_id: int | list[int] | None = None,
                     dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """A LlamaForCausalLM config.json dict (the classic keys every transformers reads)."""
    scaling = None
    if args.rope_scaling:
        scaling = {"rope_type": "llama3", **{k: float(v) for k, v in args.rope_scaling.items()}}
        scaling["original_max_position_embeddings"] = int(scaling["original_max_position_embeddings"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": args.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def write_tokenizer(tok, dst: Path) -> list[str]:
    """Write the tokenizer as HF-style files; returns the names written.

    tokenizer.json when the tokenizer is a ``tokenizers`` one; SentencePiece models are
    written as tokenizer.model (their serialized proto), tiktoken ranks as a copy of the
    ranks file (Meta's tokenizer.model), which our loader reads back.
    """
    kind = getattr(tok, "kind", "")
    if kind == "hf":
        (dst / "tokenizer.json").write_text(tok.backend.to_str(), encoding="utf-8")
        return ["tokenizer.json"]
    if kind == "sentencepiece":
        (dst / "tokenizer.model").write_bytes(tok.processor.serialized_model_proto())
        return ["tokenizer.model"]
    if kind == "tiktoken":
        (dst / "tokenizer.model").write_bytes(Path(tok.source).read_bytes())
        return ["tokenizer.model"]
    raise CheckpointError(f"cannot write a tokenizer of kind '{kind}'")


def save_hf(loaded: LoadedModel, dst: str | Path, *, dtype: torch.dtype | None = None) -> Path:
    """Write a Hugging Face-style folder: config.json, model.safetensors (Q/K in HF's
    rotate-half layout), tokenizer files, tokenizer_config.json, generation_config.json."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    args, tok = loaded.args, loaded.tokenizer
    sd = loaded.model.state_dict()
    dtype = dtype or sd["tok_embeddings.weight"].dtype
    out = {}
    for name, t in sd.items():
        if args.tie_word_embeddings and name == "output.weight":
            continue
        out[hf_name(name)] = to_hf_tensor(name, t.detach(), args).to("cpu", dtype).contiguous()
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    stops = sorted(loaded.stop_ids)
    eos = tok.eos_id if tok.eos_id is not None else (stops[0] if stops else None)
    gen_eos: int | list[int] | None = stops if len(stops) > 1 else eos
    cfg = config_from_args(args, bos_id=tok.bos_id, eos_id=gen_eos, dtype=dtype)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {"bos_token_id": tok.bos_id, "eos_token_id": gen_eos}
    (dst / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    files = write_tokenizer(tok, dst)

    def piece(i):
        return None if i is None else tok.id_to_piece(i)

    tcfg: dict[str, Any] = {
        "bos_token": piece(tok.bos_id),
        "eos_token": piece(tok.eos_id),
        "add_bos_token": True,
        "model_max_length": args.max_seq_len,
        "clean_up_tokenization_spaces": False,
    }
    if "tokenizer.json" in files:
        tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    elif tok.kind == "sentencepiece":
        tcfg["tokenizer_class"] = "LlamaTokenizer"
        tcfg["legacy"] = False
        tcfg["unk_token"] = piece(tok.processor.unk_id())
    if loaded.chat_template:
        tcfg["chat_template"] = loaded.chat_template
    (dst / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False) + "\n")
    return dst
