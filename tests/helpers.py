"""Tiny random reference models (transformers' LlamaForCausalLM) and their Meta twins."""
from __future__ import annotations

import torch

from core.checkpoints.hf import args_from_config, meta_name, to_meta_tensor
from core.model import Transformer

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)


def tiny_hf(seed: int = 0, **overrides):
    """A random transformers LlamaForCausalLM in float32, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**{**BASE, **overrides})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    # Default init (std 0.02) gives near-uniform logits; widen so greedy choices are clear.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0, 0.15)
    return model


def meta_from_hf(hf_model) -> Transformer:
    """Our Transformer holding the HF model's weights (Q/K un-permuted)."""
    cfg = hf_model.config.to_dict()
    args = args_from_config(cfg)
    model = Transformer(args)
    sd = {}
    for k, v in hf_model.state_dict().items():
        name = meta_name(k)
        if name is None or (args.tie_word_embeddings and name == "output.weight"):
            continue
        sd[name] = to_meta_tensor(name, v.detach().clone(), args)
    model.load_state_dict(sd, strict=not args.tie_word_embeddings)
    if args.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    return model.eval()
