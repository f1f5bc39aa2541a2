"""A small dense float32 model's forward over a KV cache in one C call (issue 23).

On a model like stories260K (dim 64, 5 layers) a decode step is bound by the count of
torch calls, not arithmetic (~54 a layer at ~5-10 µs each). For such a model every forward
over a KV cache — decode steps, prefill chunks, speculative verification, any row count —
runs ``ld_forward_f32`` (csrc/layer.c): embedding, every block, final norm and output
product in one call. So all of a model's cached paths share one set of numbers, each row's
the same bits whatever shares its call and whatever the thread count (batch-invariant by
construction, with or without ``Transformer.batch_invariant``).

The rule (:func:`plan_for`): every module a plain one of core.model.transformer (no
KernelLinear, Float16Linear, packed or LoRA layer), float32 weights on the CPU, at most
:data:`MAX_PARAMS` parameters (measured: docs/PERFORMANCE.md, "A small model's forward in
C"), the kernels built, ``LLAMADESK_FUSED`` not ``0``; and per call (:func:`forward`): eval mode, not compiling, no forward
hooks (attribution's), no autograd wanted, a KVCache or one of its rows in float32.
Otherwise, and without a C compiler, the torch path runs as before.
"""
from __future__ import annotations

import ctypes
import math
import operator
import os
import threading
import weakref

import torch
from torch import nn

from core.model.kernels import ops as kernel_ops
from core.model.kv_cache import KVCache, RowView

#: parameters up to which the C forward runs (measured against the torch path: decode at
#: 1/4/16 rows and a 512-token prefill: 7.9M params won all four, 15M lost 4 rows; docs/PERFORMANCE.md)
MAX_PARAMS = 10_000_000
#: ``LLAMADESK_FUSED=0`` keeps every model on the torch path (to compare the two)
ENV = "LLAMADESK_FUSED"
_P, _I = ctypes.c_void_p, ctypes.c_int64


class ForwardArgs(ctypes.Structure):
    """csrc/layer.c's ld_forward_args, field for field."""
    _fields_ = [*[(n, _I) for n in ("n_layers", "dim", "n_heads", "n_kv", "head_dim", "hidden", "vocab")],
                ("w", _P), ("rope", _P), ("rope_len", _I), ("k", _P), ("v", _P),
                ("cache_rows", _I), ("capacity", _I), ("tokens", _P), ("b", _I), ("t", _I),
                ("start", _P), ("start_stride", _I), ("row0", _I), ("last_only", _I),
                ("work", _P), ("work_floats", _I), ("logits", _P),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float)]


_ERRORS = {-1: (MemoryError, "the C forward could not allocate its scratch"),
           -2: (IndexError, "a token id is outside the vocabulary"),
           -3: (IndexError, "a position is outside the KV cache"),
           -4: (IndexError, "a row is outside the KV cache")}


class Plan:
    """What one model's C forward needs, prepared once: the products' weights transposed
    ([in, out], the layout the kernel reads), their pointers, the call's argument block.
    :func:`forward` builds another when the model's weights change (:func:`signature`)."""

    def __init__(self, model, lib):
        a = model.args
        # (weakly: the model holds its plan, and a cycle would keep an unloaded model's
        # memory until the next full garbage collection)
        self.model, self.lib = weakref.ref(model), lib
        # every module's hook tables, looked at each call (a registered hook lands in one)
        self.hooks = [d for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks)]
        keep = [model.tok_embeddings.weight.detach()]
        for layer in model.layers:
            at, ff = layer.attention, layer.feed_forward
            keep.append(layer.attention_norm.weight.detach())
            keep += [m.weight.detach().t().contiguous() for m in (at.wq, at.wk, at.wv, at.wo)]
            keep.append(layer.ffn_norm.weight.detach())
            keep += [m.weight.detach().t().contiguous() for m in (ff.w1, ff.w3, ff.w2)]
        keep += [model.norm.weight.detach(), model.output.weight.detach().t().contiguous()]
        self.keep = keep
        self.pointers = (_P * len(keep))(*[t.data_ptr() for t in keep])
        hidden = model.layers[0].feed_forward.w1.weight.shape[0]
        self.args = ForwardArgs(a.n_layers, a.dim, a.n_heads, a.n_kv_heads, a.head_dim, hidden,
                                a.vocab_size, ctypes.addressof(self.pointers))
        self.args.eps, self.args.scale = model.norm.eps, 1.0 / math.sqrt(a.head_dim)
        self.ref = ctypes.byref(self.args)
        self.per_row = lib.ld_forward_work_floats(self.ref, 1)  # (linear in the rows)
        self.work = torch.empty(0)
        self.start = (_I * 1)()
        self.bound: tuple | None = None  # (cache, k[0], v[-1], pointer arrays) the args point at
        self.rope: torch.Tensor | None = None
        self.lock = threading.Lock()

    def hooked(self) -> bool:
        """Whether a forward hook would see a module's call (then the torch path runs)."""
        return _global_hooks() or any(self.hooks)

    def bind(self, kv: KVCache) -> None:
        """Point the call at ``kv``'s tensors (again after ``ensure`` reallocated them)."""
        shape = (kv.batch, kv.n_kv_heads, kv.capacity, kv.head_dim)
        for t in kv.k + kv.v:
            if t.shape != shape or not t.is_contiguous():
                raise ValueError(f"a KV cache tensor {tuple(t.shape)} is not a contiguous {shape}")
        ks, vs = (_P * kv.n_layers)(*[t.data_ptr() for t in kv.k]), (_P * kv.n_layers)(*[t.data_ptr() for t in kv.v])
        self.args.k, self.args.v = ctypes.addressof(ks), ctypes.addressof(vs)
        self.args.cache_rows, self.args.capacity = kv.batch, kv.capacity
        self.bound = (kv, kv.k[0], kv.v[-1], ks, vs)

    def run(self, tokens: torch.Tensor, start_pos, kv: KVCache, row0: int, last_only: bool) -> torch.Tensor:
        """Logits [B, T or 1, V] of tokens [B, T] at start_pos (int, or [B] per row) over
        cache rows row0.. of ``kv``, whose keys/values at those positions it writes. One
        call at a time (the argument block and the work buffer are the plan's)."""
        with self.lock:
            return self._run(tokens, start_pos, kv, row0, last_only)

    def _run(self, tokens, start_pos, kv: KVCache, row0: int, last_only: bool) -> torch.Tensor:
        b = self.bound
        if b is None or b[0] is not kv or b[1] is not kv.k[0] or b[2] is not kv.v[-1]:
            self.bind(kv)
        rope = self.model().rope(kv.capacity)
        if rope is not self.rope:
            self.rope = rope
            self.args.rope, self.args.rope_len = rope.data_ptr(), rope.shape[0]
        B, T = tokens.shape
        if tokens.dtype != torch.int64 or not tokens.is_contiguous():
            tokens = tokens.to(torch.int64).contiguous()
        args = self.args
        if isinstance(start_pos, torch.Tensor):
            start_pos = start_pos.to(torch.int64).contiguous()
            if start_pos.numel() != B or not start_pos.is_cpu:
                raise ValueError(f"{start_pos.numel()} start positions for {B} rows")
            args.start, args.start_stride = start_pos.data_ptr(), 1
        else:
            self.start[0] = start_pos
            args.start, args.start_stride = ctypes.addressof(self.start), 0
        need = B * T * self.per_row
        if self.work.numel() < need:
            self.work = torch.empty(need)
            args.work, args.work_floats = self.work.data_ptr(), need
        logits = torch.empty(B, 1 if last_only else T, args.vocab)
        args.tokens, args.b, args.t, args.row0, args.last_only = tokens.data_ptr(), B, T, row0, int(last_only)
        args.logits = logits.data_ptr()
        rc = self.lib.ld_forward_f32(self.ref)
        if rc:
            kind, what = _ERRORS.get(rc, (RuntimeError, f"the C forward failed ({rc})"))
            raise kind(what)
        return logits


class Slot:
    """Where a model keeps its Plan (``model._fused_plan``) and the weights' signature it was
    built for. A copy of the model (deepcopy, pickle) gets an empty one and builds its own."""
    __slots__ = ("plan", "sources", "signature")

    def __init__(self):
        self.plan: Plan | None = None
        self.sources: list[torch.Tensor] | None = None
        self.signature: tuple | None = None

    def __deepcopy__(self, memo) -> "Slot":
        return Slot()

    def __reduce__(self):
        return Slot, ()


_VERSION = operator.attrgetter("_version")


def signature(params: list[torch.Tensor]) -> tuple:
    """What changes when weights are written in place (each one's version) or the model is
    moved or cast (the first one's address): ~5 µs for a small model, every call."""
    return params[0].data_ptr(), *map(_VERSION, params)


def _global_hooks() -> bool:
    m = nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks)


def applies(model, plain: tuple[type, ...]) -> bool:
    """Whether ``model`` falls under the rule (see the module; kernels built). ``plain``:
    the module types of a plain Transformer (core.model.transformer's own)."""
    if os.environ.get(ENV, "").strip() == "0" or (lib := kernel_ops.kernels()) is None:
        return False
    if not hasattr(lib, "ld_forward_f32") or model.num_parameters() > MAX_PARAMS:
        return False
    a = model.args
    if a.n_heads % a.n_kv_heads or a.head_dim % 2 or not model.layers:
        return False
    if any(type(m) not in plain for m in model.modules() if m is not model):
        return False
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in model.parameters()):
        return False
    eps = {model.norm.eps} | {n.eps for layer in model.layers for n in (layer.attention_norm, layer.ffn_norm)}
    hidden = {layer.feed_forward.w1.weight.shape[0] for layer in model.layers}
    return len(eps) == 1 and len(hidden) == 1


def plan_for(model, plain: tuple[type, ...]) -> Plan | None:
    """A Plan when ``model`` falls under the rule, else None."""
    return Plan(model, kernel_ops.kernels()) if applies(model, plain) else None


def forward(model, tokens: torch.Tensor, start_pos, cache, last_only: bool,
            plain: tuple[type, ...]) -> torch.Tensor | None:
    """The C forward's logits, or None where this call takes the torch path."""
    if model.training or torch.compiler.is_compiling():
        return None
    if isinstance(cache, RowView):
        kv, row0 = cache.cache, cache.index
        if tokens.shape[0] != 1:
            return None
    elif type(cache) is KVCache:
        kv, row0 = cache, 0
    else:  # StaticRows (a fixed-shape step), or another cache
        return None
    if (kv.dtype != torch.float32 or kv.device.type != "cpu" or not tokens.is_cpu or tokens.dim() != 2
            or tokens.shape[1] == 0):  # (no tokens: the torch path says what is wrong)
        return None
    slot = model.__dict__.get("_fused_plan")
    if slot is None:
        slot = model.__dict__["_fused_plan"] = Slot()
    if slot.sources is None or signature(slot.sources) != slot.signature:  # weights replaced / written
        slot.sources = list(model.parameters())
        slot.plan, slot.signature = plan_for(model, plain), signature(slot.sources)
    plan = slot.plan
    if plan is None or not model.__dict__.get("fused", True) or plan.hooked():
        return None
    if torch.is_grad_enabled() and any(p.requires_grad for p in slot.sources):
        return None  # someone wants gradients through it: torch's autograd
    return plan.run(tokens, start_pos, kv, row0, last_only)
