"""Hugging Face folders: config.json + safetensors, mapped onto Meta's names and layout."""
from __future__ import annotations

from typing import Any

import torch

from ..model import ModelArgs


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


def args_from_config(cfg: dict[str, Any], **overrides: Any) -> ModelArgs:
    """ModelArgs from a LlamaForCausalLM config.json dict."""
    # transformers ≥ 5 writes `rope_parameters` (theta included); older files `rope_scaling`.
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or None
    rope = None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "llama3":
            rope = {k: float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                   "original_max_position_embeddings")}
        elif kind not in (None, "default"):
            raise ValueError(f"rope_scaling type '{kind}' is not supported (only llama3)")
    theta = cfg.get("rope_theta")
    if theta is None:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    n_heads = cfg["num_attention_heads"]
    kw = dict(
        dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"], n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads, vocab_size=cfg["vocab_size"],
        hidden_dim=cfg["intermediate_size"], head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
        norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=float(theta), rope_scaling=rope,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_seq_len=cfg.get("max_position_embeddings", 4096),
    )
    kw.update(overrides)
    return ModelArgs(**kw)


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
    for k, v in _TOP_MAP.items():
        if v == meta:
            return k
    _, idx, tail = meta.split(".", 2)
    for k, v in _LAYER_MAP.items():
        if v == tail:
            return f"model.layers.{idx}.{k}"
    raise KeyError(meta)


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
