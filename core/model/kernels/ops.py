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
import threading

import torch

from core.model.kernels import build

_P = ctypes.c_void_p
_I = ctypes.c_int64
#: GGUF type -> (C symbol, weights per block, bytes per block)
MM = {
    "Q4_K": ("ld_mm_q4_k", 256, 144),
    "Q6_K": ("ld_mm_q6_k", 256, 210),
}
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
            lib.__dict__["_ld_typed"] = True
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
    lib = typed(lib) if lib is not None else kernels()
    if lib is None:
        raise RuntimeError(f"no compiled kernels: {build.reason()}")
    sym = MM[kind][0]
    if w.dtype != torch.uint8 or w.device.type != "cpu" or not w.is_contiguous():
        raise ValueError("w must be contiguous uint8 on the CPU")
    if w.numel() != n * row_bytes(kind, k):
        raise ValueError(f"w holds {w.numel()} bytes, {kind} [{n}, {k}] needs {n * row_bytes(kind, k)}")
    if x.shape[-1] != k or x.device.type != "cpu":
        raise ValueError(f"x must be [..., {k}] on the CPU, got {tuple(x.shape)} on {x.device}")
    xf = x.reshape(-1, k).to(torch.float32).contiguous()
    m = xf.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    if m:
        getattr(lib, sym)(w.data_ptr(), n, k, xf.data_ptr(), m, y.data_ptr())
    return y.view(*x.shape[:-1], n)
