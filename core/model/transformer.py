"""The LLaMA transformer (Llama 2, 3, 3.1, 3.2) in plain PyTorch.

Weights use Meta's names and Meta's interleaved RoPE layout, so a Meta checkpoint loads
with no renaming; other formats are mapped onto these names at load time. Attention runs
through ``scaled_dot_product_attention`` against a :class:`~core.model.kv_cache.KVCache` that
lives outside the model, so one model serves any batch size or context length.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from core.model import fused
from core.model.args import ModelArgs
from core.model.f16 import Float16Linear
from core.model.kernels import ops as kernel_ops
from core.model.kv_cache import KVCache

SMALL_BATCH = 16  # rows up to which Linear multiplies weight-first (see Linear.forward)
# Batch-invariant decode pads a step to at least this many rows: CPU BLAS runs one row as a
# matrix-vector product and 2-3 rows with other blocking, whose sums round differently from
# the GEMM kernel that every count from 4 up shares (measured with MKL, float32 and bfloat16).
INVARIANT_ROWS = 4

def rope_frequencies(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2], with Llama 3.1 scaling when configured."""
    hd = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    sc = args.rope_scaling
    if sc:
        factor = float(sc["factor"])
        low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old_ctx = float(sc["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(is_mid, mid, scaled)
    return inv.float()


def rope_table(args: ModelArgs, length: int, device: torch.device | None = None) -> torch.Tensor:
    """cos/sin for positions [0, length): [length, head_dim // 2, 2] float32."""
    inv = rope_frequencies(args).to(device)
    t = torch.arange(length, device=device, dtype=torch.float32)
    ang = torch.outer(t, inv)
    return torch.stack([ang.cos(), ang.sin()], dim=-1)


def rotation_table(table: torch.Tensor) -> torch.Tensor:
    """rope_table's cos/sin [L, D/2, 2] as the two factors apply_rope multiplies by, each
    interleaved to the head's width: [L, 2, 1, D] = (cos, cos, ...), (-sin, sin, ...) (the
    1: one factor for every head)."""
    cos, sin = table[..., 0], table[..., 1]
    pairs = [torch.stack([cos, cos], -1).flatten(-2), torch.stack([-sin, sin], -1).flatten(-2)]
    return torch.stack(pairs, 1).unsqueeze(2)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x [B, T, H, D] by rope [B or 1, T, 2, 1, D]
    (rotation_table's rows): x0·cos - x1·sin, x0·sin + x1·cos, as x·C + swap(x)·S. The
    same two products and one sum per element as the pairwise form, so bit for bit its
    result (a - b is a + (-b) exactly), in 4 tensor ops instead of 12: a decode step of a
    small model is bound by their count."""
    xf = x if x.dtype == torch.float32 else x.float()
    swapped = xf.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x1, x0, x3, x2, ...)
    out = xf * rope[:, :, 0] + swapped * rope[:, :, 1]
    return out if x.dtype == torch.float32 else out.type_as(x)


class Linear(nn.Module):
    """A bias-free linear layer that does not initialise its weight.

    Building on the meta device must not run init kernels: the first one imports
    PyTorch's meta registrations, seconds of GIL-holding work while the UI waits.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.invariant = False  # decode-shaped inputs take one kernel path (Transformer.batch_invariant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.invariant and x.dim() == 3 and x.shape[1] == 1:
            # A decode step [B, 1, D]: every row count runs the same GEMM, so a row's
            # numbers do not depend on how many other requests share its step.
            return _padded_linear(x, self.weight, rows)
        if 1 < rows <= SMALL_BATCH and x.device.type == "cpu" and self.weight.numel() >= 1 << 18:
            # A few rows at once (comparison lanes decoding together): CPU BLAS runs
            # x @ W.T at a third of the speed of W @ x.T for 2-8 rows (measured with MKL:
            # 12.8 vs 4.4 ms for 4 rows of an 8192x2048 weight), so take the fast side.
            # Small weights sit in cache, where the extra transposes cost more than they save.
            x2 = x.reshape(rows, x.shape[-1])
            return (self.weight @ x2.t()).t().reshape(*x.shape[:-1], self.weight.shape[0])
        return F.linear(x, self.weight)


def _padded_linear(x: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
    if rows >= INVARIANT_ROWS:  # linear folds [B, 1, D] into the same [B, D] product
        return F.linear(x, weight)
    x2 = x.reshape(rows, x.shape[-1])
    x2 = torch.cat([x2, x2.new_zeros(INVARIANT_ROWS - rows, x2.shape[1])])
    return F.linear(x2, weight)[:rows].reshape(*x.shape[:-1], weight.shape[0])


def padded_rows(x: torch.Tensor, *layers: nn.Module) -> torch.Tensor:
    """x [B, 1, D] with zero rows up to INVARIANT_ROWS when ``layers`` are invariant
    Linears that would each pad it (a decode step of 1-3 rows), else x itself: padded once
    for the feed-forward's three products instead of once per product (a few torch calls
    each; attention's are left alone: forward hooks on them, attribution's, see B rows)."""
    B, T, _ = x.shape
    if T != 1 or B >= INVARIANT_ROWS or not all(type(m) is Linear and m.invariant for m in layers):
        return x
    return torch.cat([x, x.new_zeros(INVARIANT_ROWS - B, 1, x.shape[2])])


class Embedding(nn.Module):
    """A token embedding that does not initialise its weight (see Linear)."""

    def __init__(self, num: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 as Meta does: bf16 sums of squares lose too much.
        xf = x if x.dtype == torch.float32 else x.float()  # (each no-op call costs a dispatch)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf if x.dtype == torch.float32 else xf.type_as(x)) * self.weight


_GQA: bool | None = None


def _sdpa_has_gqa() -> bool:
    """Whether this torch's scaled_dot_product_attention takes ``enable_gqa`` (2.5+)."""
    global _GQA
    if _GQA is None:
        try:
            x = torch.zeros(1, 2, 1, 4)
            F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
            _GQA = True
        except (TypeError, RuntimeError):
            _GQA = False
    return _GQA


class RowKeys(tuple):
    """The 'mask' of a batch-invariant decode step: how many keys each row attends over
    (its own, never another row's), and the compiled kernel that runs every row in one call
    (None: one scaled_dot_product_attention per row)."""
    kernel = None


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = Linear(args.dim, args.n_heads * args.head_dim)
        self.wk = Linear(args.dim, args.n_kv_heads * args.head_dim)
        self.wv = Linear(args.dim, args.n_kv_heads * args.head_dim)
        self.wo = Linear(args.n_heads * args.head_dim, args.dim)
        self.dropout = args.dropout

    def forward(self, x, rope, mask, cache: KVCache | None, start_pos):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if cache is not None:
            k, v = cache.update(self.layer_id, start_pos, k, v)  # [B, Hkv, L, D]
        gqa = {}
        if isinstance(mask, RowKeys) and mask.kernel is not None and q.device.type == "cpu":
            # batch-invariant decode in one call: each row over its own keys (csrc/attn.c)
            return self.wo(kernel_ops.attn_decode(q, k, v, mask, mask.kernel))
        if self.n_kv_heads != self.n_heads:
            if _sdpa_has_gqa():  # query heads share K/V heads without copying them
                gqa = {"enable_gqa": True}
            else:
                rep = self.n_heads // self.n_kv_heads
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
        drop = self.dropout if self.training else 0.0
        if isinstance(mask, tuple):  # batch-invariant decode: each row alone over its own keys
            out = torch.cat([F.scaled_dot_product_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], **gqa)
                             for b, n in enumerate(mask)])
        elif isinstance(mask, str):  # "causal": keys are exactly the T queries
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop, **gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, **gqa)
        out = out.transpose(1, 2).reshape(B, T, -1)  # [B, T, H*D]
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = Linear(args.dim, args.hidden_dim)
        self.w2 = Linear(args.hidden_dim, args.dim)
        self.w3 = Linear(args.dim, args.hidden_dim)
        self.invariant = False  # set by Transformer.batch_invariant

    def forward(self, x):
        B = x.shape[0]
        xp = padded_rows(x, self.w1, self.w2, self.w3)
        a, b = self.w1(xp), self.w3(xp)
        if not (self.invariant and x.shape[1] == 1 and x.is_cpu) or torch.compiler.is_compiling():
            # (a compiled step is not batch-invariant: docs/SERVING.md; CUDA's silu runs one
            # function in its vector and tail paths)
            h = F.silu(a) * b
        elif (lib := kernel_ops.kernels()) is not None:
            # torch's silu computes a buffer's last elements on another path than the rest, so
            # the last row of a step whose width is not a multiple of 32 would round apart from
            # the same row alone: the kernel computes every element alike (csrc/act.c)
            h = kernel_ops.silu_mul(a, b, lib)
        else:  # no kernel: each row in a buffer of its own, as it runs alone
            h = torch.cat([F.silu(a[i:i + 1]) * b[i:i + 1] for i in range(B)])
        out = self.w2(h)  # padding rows stay apart: a GEMM's rows are independent
        return out if out.shape[0] == B else out[:B]


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.attention = Attention(args, layer_id)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.dropout = args.dropout

    def forward(self, x, rope, mask, cache, start_pos):
        h = self.attention(self.attention_norm(x), rope, mask, cache, start_pos)
        if self.training:  # (a no-op call per residual otherwise, counted in every decode step)
            h = x + F.dropout(h, self.dropout, True)
            return h + F.dropout(self.feed_forward(self.ffn_norm(h)), self.dropout, True)
        h = x + h
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = Linear(args.dim, args.vocab_size)
        if args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self._rope: torch.Tensor | None = None  # grown on demand, on the weights' device
        # a forward over a KV cache runs in one C call when the model is small (core.model.fused)
        self.fused = True
        self.invariant = False
        self.batch_invariant(True)
        if self.tok_embeddings.weight.device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Random weights for training from scratch (loaders overwrite them)."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("wo.weight", "w2.weight")):
                # Residual-branch outputs start small so deep stacks begin near identity.
                p.normal_(0.0, std / math.sqrt(2 * self.args.n_layers))
            else:
                p.normal_(0.0, std)

    def batch_invariant(self, on: bool = True) -> None:
        """Whether a decode step gives each row the numbers it would get alone (the default):
        every row count runs the same GEMM (rows padded to INVARIANT_ROWS) and attention
        runs per row over exactly that row's keys (on the CPU all rows in one call of the
        compiled kernel, csrc/attn.c; else one scaled_dot_product_attention per row). A KVCache step only: a static cache step
        (CUDA graphs) attends over the whole capacity with a mask and is not invariant."""
        self.invariant = bool(on)
        for m in self.modules():
            if isinstance(m, (Linear, Float16Linear, FeedForward)):
                m.invariant = self.invariant

    def _per_row(self, cache) -> bool:
        """Whether decode attention runs row by row: invariant, on an eager KVCache step. A
        compiled step would specialise on every row's length (a recompile per step)."""
        return self.invariant and isinstance(cache, KVCache) and not torch.compiler.is_compiling()

    def _row_keys(self, lengths) -> RowKeys:
        keys = RowKeys(lengths)
        if self.tok_embeddings.weight.device.type == "cpu":
            keys.kernel = kernel_ops.kernels()  # built once per process (None: no compiler)
        return keys

    def rope(self, end: int) -> torch.Tensor:
        """The rotation table covering positions [0, end) ([L, 2, 1, D], :func:`rotation_table`),
        cached on the model's device."""
        dev = self.tok_embeddings.weight.device
        if self._rope is None or self._rope.shape[0] < end or self._rope.device != dev:
            length = max(end, 256, 0 if self._rope is None else 2 * self._rope.shape[0])
            self._rope = rotation_table(rope_table(self.args, length, dev))
        return self._rope

    def positions(self, h: torch.Tensor, start_pos: int | torch.Tensor, cache):
        """(rope, mask, start_pos) for hidden states h [B, T, D] at start_pos, as the layers
        take them (see :meth:`forward`); a prefill that runs layer by layer calls it per chunk."""
        B, T = h.shape[:2]
        dev = h.device
        if isinstance(start_pos, torch.Tensor):
            if cache is None:
                raise ValueError("per-row start positions need a KV cache")
            pos = start_pos.to(dev).view(B, 1) + torch.arange(T, device=dev)  # [B, T]
            end = cache.span(pos)  # a static cache answers its capacity: no host sync
            rope = self.rope(end)[pos]  # [B, T, 2, 1, D]
            if T == 1 and self._per_row(cache):
                return rope, self._row_keys(int(p) + 1 for p in pos.view(B).tolist()), pos
            # Each row sees only keys at or before its own position, so a row never reads
            # slots that a longer row wrote past its own end.
            mask = torch.arange(end, device=dev).view(1, 1, 1, end) <= pos.view(B, 1, T, 1)
            start_pos = pos  # the cache scatters row by row
        else:
            end = start_pos + T
            rope = self.rope(end)[start_pos:end].unsqueeze(0)  # [1, T, 2, 1, D]
            if T == 1:
                mask = self._row_keys((end,) * B) if self._per_row(cache) else None
            elif cache is None or start_pos == 0:
                mask = "causal"
            else:  # a chunk after a cached prefix: causal within, all of the prefix
                q = torch.arange(start_pos, end, device=dev).view(T, 1)
                mask = torch.arange(end, device=dev).view(1, end) <= q  # [T, L]
        return rope, mask, start_pos

    def forward(
        self,
        tokens: torch.Tensor,
        start_pos: int | torch.Tensor = 0,
        cache: KVCache | None = None,
        *,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Run tokens [B, T] that sit at positions start_pos.. of each row.

        Args:
            tokens: token ids [B, T]; T > 1 prefills in one pass, T == 1 decodes.
            start_pos: the position of tokens[:, 0]: an int shared by all rows, or a
                LongTensor [B] when rows sit at different positions (batched prompts).
            cache: where keys/values of earlier positions live and these are written
                (a KVCache, one of its rows, or its StaticRows for a fixed-shape step);
                None attends only among the T tokens (training, full forward).
            last_only: return logits for the last position only ([B, 1, V]).

        Returns:
            float32 logits [B, T, V].
        """
        if cache is not None and not self.training:
            logits = fused.forward(self, tokens, start_pos, cache, last_only, PLAIN_MODULES)
            if logits is not None:
                return logits
        h = self.tok_embeddings(tokens)
        rope, mask, start_pos = self.positions(h, start_pos, cache)
        for layer in self.layers:
            h = layer(h, rope, mask, cache, start_pos)
        if last_only:
            h = h[:, -1:, :]
        return self.output(self.norm(h)).float()

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Mean next-token cross-entropy of tokens [B, T] against targets [B, T]."""
        logits = self(tokens)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index)

    def num_parameters(self) -> int:
        """Parameter count, tied weights counted once."""
        return sum(p.numel() for p in self.parameters())


#: the modules of a Transformer that core.model.fused runs in C (any other, e.g. a packed or
#: LoRA layer, keeps the model on the torch path)
PLAIN_MODULES = (Embedding, RMSNorm, Linear, Attention, FeedForward, TransformerBlock, nn.ModuleList)
