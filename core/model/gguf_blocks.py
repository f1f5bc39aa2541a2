"""GGUF quantized blocks decoded into groups of integers with a float32 scale and zero.

The same arithmetic as ``gguf.quants``, so ``q * scale + zero`` reproduces gguf's
dequantization bit for bit (tests). Used by the packer (:mod:`core.model.pack`) and by
:class:`core.model.quant.GGUFEmbedding`, which decodes looked-up rows on the fly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Groups:
    """GGUF blocks decoded to groups of ``size`` weights: value = q * scale + zero (float32 math)."""
    q: torch.Tensor  # int16 [N, K]
    scale: torch.Tensor  # float32 [N, K/size]
    zero: torch.Tensor  # float32 [N, K/size]
    size: int = 32  # 16 for Q6_K, else 32 (the kernels' group)


BLOCK_BYTES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144),
               "Q5_0": (32, 22), "Q5_1": (32, 24), "Q5_K": (256, 176), "Q6_K": (256, 210)}


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 from the last dim's 2 bytes, as float32."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: low nibbles first, then high (GGUF's 32-weight order)."""
    return torch.cat([qs & 15, qs >> 4], -1).to(torch.int16)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """4 bytes (a little-endian uint32) -> its 32 bits, bit i for weight i."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh.unsqueeze(-1) >> shifts) & 1).flatten(-2).to(torch.int16)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (int32)."""
    s = s.to(torch.int32)
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    return sc, mn


def decode_blocks(raw: torch.Tensor, kind: str, n: int, k: int) -> Groups:
    """Decode raw GGUF blocks (uint8 [N, K/block*bytes]) of one tensor into groups.

    Same arithmetic as ``gguf.quants`` (float32), so ``q * scale + zero`` reproduces
    gguf's dequantization; raises ValueError on a size that does not fit.
    """
    block, nbytes = BLOCK_BYTES[kind]
    if k % block:
        raise ValueError(f"{k} columns are not a multiple of {kind}'s block size {block}")
    if raw.numel() != n * (k // block) * nbytes:
        raise ValueError(f"holds {raw.numel()} bytes, {kind} [{n}, {k}] needs {n * (k // block) * nbytes}")
    b = raw.reshape(n, k // block, nbytes)
    if kind == "Q8_0":
        d = _f16(b[..., :2])
        q = b[..., 2:].contiguous().view(torch.int8).to(torch.int16)
        return Groups(q.reshape(n, k), d, torch.zeros_like(d))
    if kind == "Q4_0":
        d = _f16(b[..., :2])
        return Groups(_nibbles(b[..., 2:]).reshape(n, k), d, -8 * d)
    if kind == "Q4_1":
        d, m = _f16(b[..., :2]), _f16(b[..., 2:4])
        return Groups(_nibbles(b[..., 4:]).reshape(n, k), d, m)
    if kind in ("Q5_0", "Q5_1"):  # 32 weights: fp16 d (and m), 32 high bits, 16 bytes of nibbles
        d = _f16(b[..., :2])
        at = 2 if kind == "Q5_0" else 4
        q = _nibbles(b[..., at + 4:]) | (_bits32(b[..., at:at + 4]) << 4)
        if kind == "Q5_0":  # d * (q - 16): signed values and no zero, exact like Q8_0
            return Groups((q - 16).reshape(n, k), d, torch.zeros_like(d))
        return Groups(q.reshape(n, k), d, _f16(b[..., 2:4]))
    if kind == "Q6_K":  # 256 weights: 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales, fp16 d
        ql = b[..., :128].reshape(n, -1, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8).view(2, 1)
        qh = b[..., 128:192].reshape(n, -1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)
        q = ((ql & 15).reshape(n, -1, 256).to(torch.int16) | ((qh & 3).reshape(n, -1, 256).to(torch.int16) << 4)) - 32
        sc = b[..., 192:208].contiguous().view(torch.int8).float()
        d = _f16(b[..., 208:210]).unsqueeze(-1)
        scale = (d * sc).reshape(n, -1)
        return Groups(q.reshape(n, k), scale, torch.zeros_like(scale), size=16)
    # Q4_K/Q5_K: 256 weights = 8 groups of 32 with 6-bit scales/mins under fp16 d, dmin
    d, dmin = _f16(b[..., 0:2]).unsqueeze(-1), _f16(b[..., 2:4]).unsqueeze(-1)
    sc, mn = _k_scales(b[..., 4:16])
    if kind == "Q4_K":
        qs = b[..., 16:].reshape(n, k // block, 4, 32)
        q = torch.stack([qs & 15, qs >> 4], 3).reshape(n, k).to(torch.int16)  # 64 per chunk: low 32, high 32
    else:  # Q5_K: 32 bytes of high bits (bit j of byte i: weight 32j + i), then the nibbles as Q4_K
        qs = b[..., 48:].reshape(n, k // block, 4, 32)
        low = torch.stack([qs & 15, qs >> 4], 3).reshape(n, k // block, 256).to(torch.int16)
        shifts = torch.arange(8, dtype=torch.uint8).view(8, 1)
        high = ((b[..., 16:48].unsqueeze(-2) >> shifts) & 1).reshape(n, k // block, 256).to(torch.int16)
        q = (low | (high << 4)).reshape(n, k)
    return Groups(q, (d * sc).reshape(n, -1), (-(dmin * mn)).reshape(n, -1))
