"""Torch-facing wrappers of the compiled kernels (:mod:`.build`): they check dtype, shape
and contiguity, allocate the output and call C on the tensors' memory.

Every matrix product has one C signature (csrc/common.h):
``ld_mm_<type>(const uint8_t *w, int64 n, int64 k, const float *x, int64 m, float *y)``:
``w`` the GGUF tensor's raw blocks (n rows of k inputs), ``x`` m x k float32, ``y`` m x n
float32, ``y[i, j] = sum_k x[i, k] * W[j, k]``, threads over output rows only, so each
``y[i, j]`` is the same bits whatever ``m``, the other rows and the thread count.
"""
from __future__ import annotations

import ctypes
import math
import threading

import torch

from core.model.kernels import build

_P = ctypes.c_void_p
_I = ctypes.c_int64
#: GGUF type -> (C symbol, weights per block, bytes per block)
MM = {
    "Q4_K": ("ld_mm_q4_k", 256, 144),
    "Q5_K": ("ld_mm_q5_k", 256, 176),
    "Q6_K": ("ld_mm_q6_k", 256, 210),
    "Q8_0": ("ld_mm_q8_0", 32, 34),  # csrc/q8_f16.c
    "F16": ("ld_mm_f16", 1, 2),  # w: the float16 weight's bytes
}
#: GGUF type -> (byte offset, count) of the fp16 scales in each of its blocks
SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1), "Q8_0": (0, 1)}
#: GGUF type -> C symbol of its dequantization (float32 or bfloat16 out)
DEQUANT = {"Q4_K": "ld_dequant_q4_k", "Q5_K": "ld_dequant_q5_k", "Q6_K": "ld_dequant_q6_k",
           "Q8_0": "ld_dequant_q8_0"}
_lock = threading.Lock()


def kernels(tick=None) -> ctypes.CDLL | None:
    """This process's library with every known symbol's argtypes set (None: no kernels;
    ``tick``: see :func:`.build.build`)."""
    lib = build.library(tick)
    return typed(lib) if lib is not None else None


def typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    """``lib`` with the argtypes of every product it holds set (once)."""
    if not lib.__dict__.get("_ld_typed"):
        with _lock:
            for sym, _, _ in MM.values():
                if hasattr(lib, sym):
                    f = getattr(lib, sym)
                    f.argtypes, f.restype = [_P, _I, _I, _P, _I, _P], None
            if hasattr(lib, "ld_silu_mul"):
                lib.ld_silu_mul.argtypes, lib.ld_silu_mul.restype = [_P, _P, _P, _I], None
            if hasattr(lib, "ld_attn_decode"):
                f = lib.ld_attn_decode
                f.argtypes = [_P, _P, _P, ctypes.c_int, *[_I] * 7, _P, ctypes.c_float, _P]
                f.restype = ctypes.c_int
            if hasattr(lib, "ld_forward_f32"):  # csrc/layer.c: one struct of arguments
                lib.ld_forward_f32.argtypes, lib.ld_forward_f32.restype = [_P], ctypes.c_int
                lib.ld_forward_work_floats.argtypes, lib.ld_forward_work_floats.restype = [_P, _I], _I
                lib.ld_layer_f32.argtypes, lib.ld_layer_f32.restype = [_P, _I, _P, _I, _P, _P], ctypes.c_int
                lib.ld_mm_f32.argtypes, lib.ld_mm_f32.restype = [_P, _I, _I, _P, _I, _P], None
            for sym in DEQUANT.values():
                if hasattr(lib, sym):
                    f = getattr(lib, sym)
                    f.argtypes, f.restype = [_P, _I, _I, _P, ctypes.c_int32], None
            lib.ld_first_bad_scale.argtypes = [_P, _I, _I, _I, _I]
            lib.ld_first_bad_scale.restype = ctypes.c_int64
            lib.__dict__["_ld_typed"] = True
    return lib


def _library(lib: ctypes.CDLL | None, sym: str, what: str) -> ctypes.CDLL:
    """``lib`` (typed) or this process's library, holding ``sym``; RuntimeError saying why not."""
    lib = typed(lib) if lib is not None else kernels()
    if lib is None or not hasattr(lib, sym):
        raise RuntimeError(f"no compiled {what}: {build.reason()}")
    return lib


def supports(kind: str, lib: ctypes.CDLL | None = None) -> bool:
    """Whether a matrix product for GGUF type ``kind`` is compiled in."""
    lib = lib if lib is not None else kernels()
    return lib is not None and kind in MM and hasattr(lib, MM[kind][0])


def row_bytes(kind: str, k: int) -> int:
    """Bytes one row of ``k`` weights of ``kind`` takes (ValueError if k does not fit)."""
    _, block, size = MM[kind]
    if k <= 0 or k % block:
        raise ValueError(f"{k} columns are not a multiple of {kind}'s block size {block}")
    return k // block * size


def mm(kind: str, w: torch.Tensor, n: int, k: int, x: torch.Tensor,
       lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``x @ W.T`` for W the [n, k] GGUF ``kind`` tensor whose raw blocks are ``w`` (uint8,
    contiguous, on the CPU); ``x`` is [..., k] and comes back [..., n] float32. ``lib``: a
    library other than this process's (tests build a plain-C one)."""
    sym = MM[kind][0]
    lib = _library(lib, sym, "kernels")
    if w.dtype != torch.uint8 or w.device.type != "cpu" or not w.is_contiguous():
        raise ValueError("w must be contiguous uint8 on the CPU")
    if w.numel() != (need := n * row_bytes(kind, k)):
        raise ValueError(f"w holds {w.numel()} bytes, {kind} [{n}, {k}] needs {need}")
    if x.shape[-1] != k or x.device.type != "cpu":
        raise ValueError(f"x must be [..., {k}] on the CPU, got {tuple(x.shape)} on {x.device}")
    xf = x.reshape(-1, k).to(torch.float32).contiguous()
    m = xf.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    if m:
        getattr(lib, sym)(w.data_ptr(), n, k, xf.data_ptr(), m, y.data_ptr())
    return y.view(*x.shape[:-1], n)


#: cache dtypes ld_attn_decode reads (csrc/attn.c)
ATTN_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def attn_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
                lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Decode attention of every row in one call (csrc/attn.c): q [B, H, 1, D] against row
    b's first ``lengths[b]`` keys/values of k, v [B, Hkv, L, D] (views of a KV cache: D
    contiguous, the same strides), grouped-query as repeat_interleave lays it out, scale
    1/sqrt(D). Float32 inside; returns [B, 1, H * D] (the heads side by side, as the output
    projection takes them) in q's dtype. Each row's numbers are the same bits alone or
    batched, whatever the thread count. Called once per layer and decode step: its checks
    are kept to a few attribute reads (a small model's step is bound by such overhead)."""
    lib = _library(lib, "ld_attn_decode", "attention kernel")
    B, H, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    code = ATTN_DTYPES.get(k.dtype)
    if (T != 1 or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or H % Hkv or code is None
            or v.dtype != k.dtype or k.stride() != v.stride() or k.stride(3) != 1):
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}: "
                         "not one decode step over a KV cache's rows")
    if len(lengths) != B or (B and not 1 <= min(lengths) <= max(lengths) <= L):
        raise ValueError(f"lengths {lengths} do not fit {B} rows of {L} positions")
    if not (q.is_cpu and k.is_cpu and v.is_cpu):
        raise ValueError("the attention kernel runs on the CPU")
    qf = q if q.dtype == torch.float32 and q.is_contiguous() else q.to(torch.float32).contiguous()
    out = torch.empty(B, 1, H * D, dtype=torch.float32)
    sb, sh, sl, _ = k.stride()
    if B and lib.ld_attn_decode(qf.data_ptr(), k.data_ptr(), v.data_ptr(), code, B, H, Hkv, D, sb, sh, sl,
                                (ctypes.c_int64 * B)(*lengths), 1.0 / math.sqrt(D), out.data_ptr()):
        raise MemoryError("the attention kernel could not allocate its scratch")
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def dequantize(kind: str, w: torch.Tensor, n: int, k: int, dtype: torch.dtype = torch.float32,
               lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """The [n, k] weight whose GGUF ``kind`` blocks are ``w``, as float32 (gguf's values bit
    for bit) or bfloat16 (those rounded to nearest even); another ``dtype`` goes through
    float32."""
    lib = _library(lib, DEQUANT[kind], "kernels")
    if w.dtype != torch.uint8 or not w.is_contiguous() or w.numel() != n * row_bytes(kind, k):
        raise ValueError(f"w must be the {n * row_bytes(kind, k)} contiguous bytes of {kind} [{n}, {k}]")
    bf16 = dtype == torch.bfloat16
    out = torch.empty(n, k, dtype=torch.bfloat16 if bf16 else torch.float32)
    getattr(lib, DEQUANT[kind])(w.data_ptr(), n, k, out.data_ptr(), int(bf16))
    return out if out.dtype == dtype else out.to(dtype)


def first_bad_block(kind: str, w: torch.Tensor) -> int | None:
    """The first block of ``w`` (a ``kind`` tensor's raw bytes) whose scale is NaN or
    infinite, or None: a corrupt file is refused at load, not met as NaN logits."""
    lib = kernels()
    _, _, size = MM[kind]
    at, count = SCALES[kind]
    got = lib.ld_first_bad_scale(w.data_ptr(), w.numel() // size, size, at, count)
    return None if got < 0 else int(got)


def silu_mul(a: torch.Tensor, b: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """silu(a) * b in float32 (csrc/act.c), every element by the same operations wherever it
    sits, so a decode step's row gets the bits it gets alone (torch's silu rounds a buffer's
    last elements differently). a, b: the same shape, on the CPU; returns a's shape and dtype."""
    lib = _library(lib, "ld_silu_mul", "activation kernel")
    if a.shape != b.shape or not (a.is_cpu and b.is_cpu):
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must match, on the CPU")
    af = a if a.dtype == torch.float32 and a.is_contiguous() else a.to(torch.float32).contiguous()
    bf = b if b.dtype == torch.float32 and b.is_contiguous() else b.to(torch.float32).contiguous()
    out = torch.empty(a.shape, dtype=torch.float32)
    lib.ld_silu_mul(af.data_ptr(), bf.data_ptr(), out.data_ptr(), out.numel())
    return out if a.dtype == torch.float32 else out.to(a.dtype)
