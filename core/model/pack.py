"""Packing weights into the layers of :mod:`core.model.quant`: GGUF blocks of
``PACKED_TYPES`` (decoded by :mod:`core.model.gguf_blocks`) and float weights quantized at
load (``--dtype int4/int8``). The layouts and what rounds are described in
:mod:`core.model.quant`'s docstring.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from core.model import pack_cpu
from core.model.gguf_blocks import BLOCK_BYTES, Groups, decode_blocks
from core.model.quant import GROUP, PACKED_TYPES, QUANT_DTYPES, TWO_PLANES, Int4Linear, Int8Linear

CUDA_INNER_K_TILES = 8
#: Rows packed at a time (a multiple of 64 and of 8: both kernels' row blocks).
CHUNK_ROWS = 1024


def _pack_rows(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed, scale_zeros) of a block of rows; padded to the CPU kernel's 64-row blocks."""
    pad = -q.shape[0] % 64 if device.type == "cpu" else 0
    if pad:
        q, scale, zero = (F.pad(t, (0, 0, 0, pad)) for t in (q, scale, zero))
    sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(device=device, dtype=torch.bfloat16)
    if device.type == "cpu" and pack_cpu.layout_matches():
        packed = pack_cpu.one_plane(q.to(torch.uint8)).view(q.shape[0], q.shape[1] // 2)
    elif device.type == "cpu":
        packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    else:  # CUDA wants two nibbles per byte, even column high (unmeasured here)
        qi = q.to(device=device, dtype=torch.int32)
        packed = torch._convert_weight_to_int4pack((qi[:, ::2] << 4 | qi[:, 1::2]).to(torch.uint8),
                                                   CUDA_INNER_K_TILES)
    return packed, sz


def _join(parts, k: int, n: int, planes: int, source: str) -> Int4Linear:
    """One Int4Linear from an iterable of row chunks' (packed, scale_zeros).

    Both kernels' layouts hold whole row blocks one after another, so chunks are copied
    into one preallocated tensor (no second full-size copy as torch.cat would make).
    """
    packed = sz = None
    row = 0
    for p, z in parts:
        if packed is None:
            total = n + (-n % 64 if p.device.type == "cpu" else 0)
            scale = p.shape[0] / z.shape[1]  # packed rows per weight row (CUDA packs 8 to a row)
            packed = p.new_empty((int(total * scale),) + tuple(p.shape[1:]))
            sz = z.new_empty((z.shape[0], total, 2))
        packed[int(row * scale):int((row + z.shape[1]) * scale)] = p
        sz[:, row:row + z.shape[1]] = z
        row += z.shape[1]
    return Int4Linear(packed, sz, k // planes, n, planes, source)


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, device: torch.device,
              planes: int = 1, source: str = "int4") -> Int4Linear:
    """An Int4Linear from 4-bit values q [N, planes*K] (0..15), and per-group float32
    scale, zero [N, planes*K/32] meaning ``w = (q - 8) * scale + zero``."""
    n, k = q.shape
    parts = (_pack_rows(q[i:i + CHUNK_ROWS], scale[i:i + CHUNK_ROWS], zero[i:i + CHUNK_ROWS], device)
             for i in range(0, n, CHUNK_ROWS))
    return _join(parts, k, n, planes, source)


def packable(kind: str, shape: tuple[int, int], device: torch.device) -> str | None:
    """Why a [N, K] weight of ``kind`` cannot stay packed on ``device``, or None if it can."""
    n, k = shape
    if kind not in PACKED_TYPES and kind not in QUANT_DTYPES:
        return f"{kind} has no packed kernel"
    if device.type not in ("cpu", "cuda"):
        return f"no packed kernels on {device.type}"
    if k % GROUP:
        return f"{k} inputs are not a multiple of the group size {GROUP}"
    if kind != "int8" and device.type == "cuda" and (n % 8 or k % (CUDA_INNER_K_TILES * 16)):
        return f"shape {shape} does not fit the CUDA int4 kernel"
    return None


# --------------------------------------------------------------------------- float -> packed


@torch.no_grad()
def quantize_int4(w: torch.Tensor, device: torch.device) -> Int4Linear:
    """Asymmetric 4-bit min/max quantization of a float weight [N, K] in groups of 32."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"{k} inputs are not a multiple of the group size {GROUP}")
    g = w.detach().float().reshape(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12).bfloat16().float()  # what the kernel will use
    lo = lo.bfloat16().float()
    q = torch.clamp(torch.round((g - lo.unsqueeze(-1)) / scale.unsqueeze(-1)), 0, 15)
    return pack_int4(q.view(n, k), scale, lo + 8 * scale, device, source="int4")


@torch.no_grad()
def quantize_int8(w: torch.Tensor, device: torch.device) -> Int8Linear:
    """Symmetric int8 quantization per output channel of a float weight [N, K]."""
    wf = w.detach().float()
    scale = (wf.abs().amax(1) / 127).clamp_min(1e-12).bfloat16().float()
    q = torch.clamp(torch.round(wf / scale.unsqueeze(1)), -127, 127).to(torch.int8)
    return Int8Linear(q.to(device), scale.to(device=device, dtype=torch.bfloat16), source="int8")


def quantizer(kind: str) -> Callable[[torch.Tensor, torch.device], nn.Module]:
    return {"int4": quantize_int4, "int8": quantize_int8}[kind]


# --------------------------------------------------------------------------- GGUF blocks -> packed


def _requantize_q6_k(g: Groups) -> Groups:
    """Q6_K's 16-weight groups as 32-weight ones (see the module docstring: rounds)."""
    n = g.q.shape[0]
    s = g.scale.view(n, -1, 2)  # d*sc of each pair of sub-blocks
    big = torch.where(s[..., 0].abs() >= s[..., 1].abs(), s[..., 0], s[..., 1])  # [N, K/32]
    ratio = torch.where(big.unsqueeze(-1) == 0, torch.zeros_like(s), s / big.unsqueeze(-1))  # 1 for big, |.| <= 1
    v = torch.round(4 * g.q.view(n, -1, 2, 16).float() * ratio.unsqueeze(-1)).clamp_(-128, 127)
    return Groups(v.to(torch.int16).view(n, -1), big / 4, torch.zeros_like(big))


def pack_gguf(raw: torch.Tensor, kind: str, n: int, k: int, device: torch.device,
              tick: Callable[[], None] | None = None) -> Int4Linear:
    """An Int4Linear holding a GGUF tensor [N, K] of one of PACKED_TYPES.

    On the CPU, Q4_K, Q6_K and Q8_0 (what common files hold) go from the file's bytes to
    the kernel's in byte operations (:mod:`core.model.pack_cpu`, the same values bit for
    bit); the other types are decoded and packed CHUNK_ROWS rows at a time, so the
    temporaries (int16 values, float32 scales) stay a few MB instead of several times the tensor.
    ``tick`` is called between steps (a load's cancel check).
    """
    if k % BLOCK_BYTES[kind][0]:
        raise ValueError(f"{k} columns are not a multiple of {kind}'s block size {BLOCK_BYTES[kind][0]}")
    if raw.numel() % max(n, 1):
        raise ValueError(f"holds {raw.numel()} bytes, not a whole number per row for {n} rows")
    rows = raw.reshape(n, -1)
    planes = 2 if kind in TWO_PLANES else 1
    if device.type == "cpu" and kind in pack_cpu.KINDS and pack_cpu.layout_matches():
        if raw.numel() != n * (k // BLOCK_BYTES[kind][0]) * BLOCK_BYTES[kind][1]:
            raise ValueError(f"holds {raw.numel()} bytes, {kind} [{n}, {k}] needs "
                             f"{n * (k // BLOCK_BYTES[kind][0]) * BLOCK_BYTES[kind][1]}")
        packed, sz = pack_cpu.pack(rows, kind, n, k, tick)
        return Int4Linear(packed, sz, k, n, planes, kind)

    def parts():
        for i in range(0, n, CHUNK_ROWS):
            chunk = rows[i:i + CHUNK_ROWS]
            if tick is not None and i:
                tick()
            g = decode_blocks(chunk, kind, chunk.shape[0], k)
            # The values are integers: only a block scale or offset can be NaN or infinite.
            if not (torch.isfinite(g.scale).all() and torch.isfinite(g.zero).all()):
                raise ValueError("holds NaN or infinite block scales: corrupt weights")
            if kind not in TWO_PLANES:
                # (q - 8) * scale + zero' == q * scale + zero  with zero' = zero + 8 * scale
                yield _pack_rows(g.q, g.scale, g.zero + 8 * g.scale, device)
                continue
            if kind == "Q6_K":
                g = _requantize_q6_k(g)
            elif kind in ("Q5_1", "Q5_K"):  # q in 0..31: centred, bf16(d)'s error stays centred
                g = Groups(g.q - 16, g.scale, g.zero + 16 * g.scale)
            u = g.q.to(torch.int32) + 128  # 0..255 = 16 * hi + lo
            d = g.scale.bfloat16().float()
            # d*q + z = 16d*(hi-8) + (8d + z)  +  d*(lo-8): two planes over [x, x]; the
            # offset is split over both planes' bf16 zeros (what the first leaves, the
            # second holds), so it keeps ~16 significant bits instead of 8.
            z = 8 * d + g.zero
            z_hi = z.bfloat16().float()
            yield _pack_rows(torch.cat([u >> 4, u & 15], 1), torch.cat([16 * d, d], 1),
                             torch.cat([z_hi, z - z_hi], 1), device)

    return _join(parts(), planes * k, n, planes, kind)
