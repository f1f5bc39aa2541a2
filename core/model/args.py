"""What a checkpoint says a Llama is: :class:`ModelArgs`, and how its numbers are checked.

Torch-free: header readers (GGUF, config.json, params.json) and the library's scan build
ModelArgs from a file's numbers without importing torch; :func:`checked_args` range-checks
every number before any of them sizes a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from core import limits
from core.errors import CheckpointError, LlamaDeskError


# Llama 3.1 params.json only says `use_scaled_rope: true`; these constants are Meta's.
META_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    vocab_size: int = -1
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    hidden_dim: int | None = None  # explicit FFN width (HF and GGUF state it); derived if None
    head_dim: int | None = None  # derived as dim // n_heads if None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    use_scaled_rope: bool = False
    rope_scaling: dict[str, float] | None = None  # llama3-style constants; Meta's if None
    tie_word_embeddings: bool = False
    max_seq_len: int = 4096  # the model's trained context length
    dropout: float = 0.0  # training only; inactive in eval mode

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_heads
        if self.hidden_dim is None:
            hidden = int(2 * (4 * self.dim) / 3)
            if self.ffn_dim_multiplier is not None:
                hidden = int(self.ffn_dim_multiplier * hidden)
            self.hidden_dim = self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)
        if self.use_scaled_rope and self.rope_scaling is None:
            self.rope_scaling = dict(META_ROPE_SCALING)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")

    @classmethod
    def from_params(cls, params: dict[str, Any], **overrides: Any) -> "ModelArgs":
        """Build from a Meta ``params.json`` dict, ignoring keys this model does not use."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in params.items() if k in known}
        kw.update(overrides)
        return cls(**kw)

    def to_params(self) -> dict[str, Any]:
        """A ``params.json``-style dict that :meth:`from_params` reads back."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dropout"}
        return out


def checked_args(kw: Mapping[str, Any], *, file: str, names: Mapping[str, str] | None = None):
    """A :class:`~core.model.transformer.ModelArgs` from ``kw`` with every value range-checked first.

    Args:
        kw: ModelArgs fields (Meta names) and their raw values from the file.
        file: the file named in errors.
        names: Meta field -> the key the file uses, so errors name what the user can find.
    """
    names = names or {}
    key = lambda k: names.get(k, k)  # noqa: E731
    known = {f.name for f in fields(ModelArgs)}
    out: dict[str, Any] = {}
    for k, v in kw.items():
        if k not in known:
            continue
        if v is None and k in ("n_kv_heads", "head_dim", "hidden_dim", "ffn_dim_multiplier", "rope_scaling"):
            out[k] = None
        elif k in limits.INT_RANGES:
            out[k] = limits.check_int(v, key(k), *limits.INT_RANGES[k], file=file)
        elif k in limits.FLOAT_RANGES:
            lo, hi, inc = limits.FLOAT_RANGES[k]
            out[k] = limits.check_float(v, key(k), lo, hi, lo_inclusive=inc, file=file)
        elif k in ("use_scaled_rope", "tie_word_embeddings"):
            if not isinstance(v, (bool, int)) or isinstance(v, int) and v not in (0, 1):
                raise CheckpointError(f"field '{key(k)}' must be true or false, got {limits.brief(v)}", file=file)
            out[k] = bool(v)
        elif k == "rope_scaling":
            out[k] = _checked_scaling(v, key(k), file)
        elif k == "dropout":
            out[k] = limits.check_float(v, key(k), 0.0, 1.0, file=file)
    if out.get("n_kv_heads") is not None and out.get("n_heads") and out["n_heads"] % out["n_kv_heads"]:
        raise CheckpointError(f"field '{key('n_heads')}' ({out['n_heads']}) is not a multiple of "
                              f"'{key('n_kv_heads')}' ({out['n_kv_heads']})", file=file)
    if out.get("head_dim") is None and out.get("dim") and out.get("n_heads"):
        if out["dim"] % out["n_heads"]:
            raise CheckpointError(f"field '{key('dim')}' ({out['dim']}) is not a multiple of "
                                  f"'{key('n_heads')}' ({out['n_heads']})", file=file)
        out["head_dim"] = out["dim"] // out["n_heads"]
    if out.get("head_dim") is not None and out["head_dim"] % 2:
        raise CheckpointError(f"field '{key('head_dim')}' = {out['head_dim']} must be even (rotary pairs)", file=file)
    try:
        args = ModelArgs(**out)
    except LlamaDeskError:
        raise
    except (TypeError, ValueError, ArithmeticError) as e:
        raise CheckpointError(f"does not describe a Llama model: {e}", file=file) from None
    hd = args.hidden_dim
    if not (isinstance(hd, int) and 1 <= hd <= limits.INT_RANGES["hidden_dim"][1]):
        raise CheckpointError(f"the feed-forward width works out to {hd}, out of range", file=file)
    if args.n_heads * args.head_dim > 1 << 18:
        raise CheckpointError(f"{args.n_heads} heads of {args.head_dim} dims is out of range", file=file)
    return args


def _checked_scaling(v: Any, key: str, file: str) -> dict[str, float] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise CheckpointError(f"field '{key}' must be an object, got {limits.brief(v)}", file=file)
    out = {}
    for k in ("factor", "low_freq_factor", "high_freq_factor"):
        out[k] = limits.check_float(v.get(k), f"{key}.{k}", 0.0, 1e6, lo_inclusive=False, file=file)
    out["original_max_position_embeddings"] = float(limits.check_int(
        v.get("original_max_position_embeddings"), f"{key}.original_max_position_embeddings",
        1, limits.INT_RANGES["max_seq_len"][1], file=file))
    if out["high_freq_factor"] <= out["low_freq_factor"]:
        raise CheckpointError(f"field '{key}': high_freq_factor must exceed low_freq_factor", file=file)
    return out
