"""Weight-only quantized linear layers that keep only packed bytes in memory.

Two layouts, both multiplied by PyTorch's own weight-only kernels:

- :class:`Int4Linear`: 4-bit values in groups of 32 along the input dimension, each
  group with a bfloat16 scale and zero: ``w = (q - 8) * scale + zero``. GGUF Q4_0, Q4_1
  and Q4_K are this layout already; Q8_0, Q5_0, Q5_1 and Q5_K become two 4-bit planes
  (high and low nibble of ``q + 128``) whose products are summed by one kernel call over
  ``[x, x]``; Q6_K too, after a rounding step (below); ``--dtype int4`` quantizes float
  weights into it (min/max per group).
- :class:`Int8Linear`: int8 per output channel (``--dtype int8``).

What rounds: the kernels take scales (and zeros) in bfloat16, the activations' dtype, so
a GGUF fp16 scale loses its 3 lowest mantissa bits (relative error <= 2**-8; Q4_0 and
Q8_0 and Q5_0 are otherwise exact). Q4_1/Q4_K zeros (``m + 8d``, ``8*d*sc - dmin*m``)
and K-quant scales (``d*sc``, up to 19 significant bits) round to bfloat16 too; the
two-plane types split their zero over both planes, so Q5_1/Q5_K zeros keep ~16 bits. Q6_K has a scale per 16 weights and the kernels one per 32: each pair of
16-weight sub-blocks shares the scale ``d*sc/4`` of the one with the larger ``|sc|``, whose
values ``4*(q-32)`` stay exact; the other's ``4*(q-32)*sc'/sc`` rounds to an integer
(error <= ``d*|sc|/8``, an eighth of the larger sub-block's step, or ``d*|sc|/4`` for
the one value, q = 0, that clamps when the two scales are equal and opposite; path
'int4x2-requantized').
Outputs are bfloat16 sums, cast back to the model's dtype. Everything else (Q2_K, Q3_K,
IQ*, ...) is dequantized at load as before; :func:`path_of` names the path a tensor took.

Decode (a few rows) runs the packed kernel; a matmul of many rows dequantizes the weight
to bfloat16 and runs a dense bfloat16 matmul, which on CPU beats the int4 kernel from
~DENSE_ROWS rows on. A long prompt is prefilled layer by layer inside
:func:`dense_weights` (``Engine``), so each weight is dequantized once per prompt however
many chunks the prompt is cut into for cancel.

CPU and CUDA pack 4-bit weights differently (``_convert_weight_to_int4pack_for_cpu`` vs
``_convert_weight_to_int4pack``); a layer is packed for one device and cannot move.
The CUDA branch follows PyTorch's documented signatures and is unmeasured here.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from core.model.f16 import Float16Embedding, Float16Linear

GROUP = 32
#: Rows from which a matmul dequantizes to bfloat16 and runs dense (CPU), and from which
#: the Engine prefills layer by layer: the int4 kernel costs ~0.4 ms per row of a 5632x2048
#: weight (0.8 ms with two planes), dequantizing it 25-60 ms once and the dense bf16 matmul
#: ~0.07 ms per row: dense wins from 75-130 rows (bench/bench_quant.py --crossover).
DENSE_ROWS = 96
#: The same for Int8Linear (its dequantize is one multiply)
INT8_DENSE_ROWS = 32
CUDA_INNER_K_TILES = 8
#: Rows packed at a time (a multiple of 64 and of 8: both kernels' row blocks).
CHUNK_ROWS = 1024
#: Weights dequantized at a time: 64-row blocks up to this many (float32 scratch of 2 MB)
DEQUANT_CHUNK = 1 << 19
#: GGUF types that stay packed (the rest are dequantized at load).
PACKED_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K")
#: ... of which these hold values wider than 4 bits: two 4-bit planes
TWO_PLANES = ("Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K")
#: dtype names that quantize float weights at load.
QUANT_DTYPES = ("int8", "int4")


def path_of(kind: str) -> str:
    """Which path a GGUF tensor type takes: 'int4-packed', 'int4x2-packed',
    'int4x2-requantized' (Q6_K: rounded, see the module docstring), 'float' or 'dequantized'."""
    if kind in PACKED_TYPES:
        return "int4-packed" if kind not in TWO_PLANES else "int4x2-requantized" if kind == "Q6_K" else "int4x2-packed"
    return "float" if kind in ("F32", "F16", "BF16") else "dequantized"


def packed_nbytes(kind: str, shape: tuple[int, int], device: torch.device | str) -> int:
    """Bytes an [N, K] weight of GGUF ``kind`` (one of PACKED_TYPES) holds once packed as an
    Int4Linear: 4-bit values plus a bfloat16 scale and zero per group of 32, rows padded
    to the CPU kernel's 64-row blocks; Q8_0 takes two planes. (Not the file's bytes: Q4_K's
    4.5 bits a weight become 5, Q8_0's 8.5 become 10.)"""
    n, k = shape
    planes = 2 if kind in TWO_PLANES else 1
    rows = n + (-n % 64 if torch.device(device).type == "cpu" else 0)
    return rows * planes * (k // 2 + k // GROUP * 4)


# --------------------------------------------------------------------------- layers


class Int4Linear(nn.Module):
    """y = x @ W.T with W held as 4-bit groups (see the module docstring).

    Args:
        packed: the kernel's packed weight ([N, planes*K/2] uint8 on CPU).
        scale_zeros: [planes*K/32, N', 2] bfloat16 (scale, zero) per group; N' >= N when
            rows were padded to the CPU kernel's 64-row blocks (padding rows are zero).
        in_features: K; the kernel sees ``planes * K`` inputs.
        out_features: N.
        planes: 2 when W is the sum of a high and a low 4-bit plane (Q8_0).
        source: what the weight came from ('Q4_0', 'int4', ...), for ``info``.
    """

    def __init__(self, packed: torch.Tensor, scale_zeros: torch.Tensor, in_features: int,
                 out_features: int, planes: int = 1, source: str = "int4"):
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scale_zeros", scale_zeros)
        self.in_features, self.out_features = in_features, out_features
        self.planes, self.source = planes, source
        self.dense: torch.Tensor | None = None  # set within dense_weights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        xb = x.reshape(rows, self.in_features).to(torch.bfloat16)
        if self.dense is not None:
            y = F.linear(xb, self.dense)
        elif rows >= DENSE_ROWS and xb.device.type == "cpu":
            y = F.linear(xb, self.dequantize(torch.bfloat16))
        else:
            if self.planes > 1:
                xb = xb.repeat(1, self.planes)
            y = _int4_mm(xb, self.packed, self.scale_zeros)[:, :self.out_features]
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [N, K] as ``dtype`` (computed in float32, then cast; exact, see tests)."""
        n, k = self.out_features, self.in_features * self.planes
        if self.packed.device.type != "cpu":  # the CUDA layout is opaque: multiply the identity (unmeasured)
            eye = torch.eye(k, device=self.packed.device, dtype=torch.bfloat16)
            w = _int4_mm(eye, self.packed, self.scale_zeros)[:, :n].t().float()
            if self.planes > 1:
                w = w.view(n, self.planes, self.in_features).sum(1)
            return w.to(dtype)
        out = torch.empty(n, self.in_features, dtype=dtype)
        # A few 64-row blocks at a time, so the float32 temporaries (~2 MB) stay in cache:
        # ~5x faster than unpacking the whole weight at once (see bench/bench_quant.py).
        step = 64 * max(1, DEQUANT_CHUNK // (64 * k))
        buf = torch.empty(step, k)  # reused: a fresh large tensor per step costs page faults
        for r0 in range(0, n, step):
            w = _dequantize_rows(self.packed, self.scale_zeros, r0, min(step, n - r0), k, buf)
            if self.planes > 1:
                w = w.view(-1, self.planes, self.in_features).sum(1)
            out[r0:r0 + step] = w
        return out

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, source={self.source}"


class Int8Linear(nn.Module):
    """y = x @ W.T with W held as int8 per output channel with bfloat16 scales."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, source: str = "int8"):
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.out_features, self.in_features = qweight.shape
        self.source = source
        self.dense: torch.Tensor | None = None  # set within dense_weights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        xb = x.reshape(rows, self.in_features).to(torch.bfloat16)
        if self.dense is not None:
            y = F.linear(xb, self.dense)
        elif rows >= INT8_DENSE_ROWS and xb.device.type == "cpu":
            # _weight_int8pack_mm runs ~2 ms per row of an 8192x2048 weight on CPU
            y = F.linear(xb, self.dequantize(torch.bfloat16))
        else:
            y = torch._weight_int8pack_mm(xb, self.qweight, self.scales)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.float() * self.scales.float().unsqueeze(1)).to(dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, source={self.source}"


class GGUFEmbedding(nn.Module):
    """A token embedding left as the file's quantized blocks (on the memory map, so only
    rows that are looked up are ever read); rows are decoded exactly as ``gguf`` does.

    ``weight`` is a zero-size stand-in that carries the device and compute dtype, which is
    all the engine and KV cache ask of an embedding's weight.
    """

    def __init__(self, raw: torch.Tensor, kind: str, dim: int, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("raw", raw, persistent=False)  # uint8 [vocab, bytes per row]
        self.register_buffer("weight", torch.empty(0, dtype=dtype, device=raw.device), persistent=False)
        self.kind, self.num_embeddings, self.embedding_dim = kind, raw.shape[0], dim

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        flat = tokens.reshape(-1)
        g = decode_blocks(self.raw[flat], self.kind, flat.numel(), self.embedding_dim)
        rows = g.q.view(flat.numel(), -1, g.size).float() * g.scale.unsqueeze(-1) + g.zero.unsqueeze(-1)
        return rows.view(*tokens.shape, self.embedding_dim).to(self.weight.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, source={self.kind}"


QuantLinear = (Int4Linear, Int8Linear, Float16Linear)
Packed = (Int4Linear, Int8Linear, GGUFEmbedding, Float16Linear, Float16Embedding)


def packed_on_cpu(module: nn.Module) -> list[nn.Module]:
    """The packed linear layers of ``module`` that live on the CPU."""
    return [m for m in module.modules() if isinstance(m, QuantLinear) and m.dense is None
            and next(m.buffers()).device.type == "cpu"]


@contextmanager
def dense_weights(module: nn.Module, cancel=None):
    """Within the block, the CPU-packed linears of ``module`` multiply a bfloat16 copy of
    their weight (float32 for float16 weights: exact), dequantized on entry and freed on
    exit. A prefill that runs a long prompt through one layer in several chunks
    (``Engine``) so pays the dequantize once per layer,
    where each chunk alone would be too short to repay it; memory grows by one layer's
    weights in bfloat16 meanwhile. A set ``cancel`` (threading.Event) stops the unpacking
    between weights (a 1B layer's seven take ~0.1-0.4 s): the caller checks it next."""
    layers = packed_on_cpu(module)
    try:
        for m in layers:
            if cancel is not None and cancel.is_set():
                break
            m.dense = m.dequantize(getattr(m, "dense_dtype", torch.bfloat16))
        yield
    finally:
        for m in layers:
            m.dense = None


def packed_shape(m: nn.Module) -> tuple[int, int]:
    """The [rows, cols] of the weight a packed module stands for."""
    if isinstance(m, (GGUFEmbedding, Float16Embedding)):
        return m.num_embeddings, m.embedding_dim
    return m.out_features, m.in_features


def _int4_mm(xb: torch.Tensor, packed: torch.Tensor, scale_zeros: torch.Tensor) -> torch.Tensor:
    if packed.device.type == "cpu":
        return torch._weight_int4pack_mm_for_cpu(xb, packed, GROUP, scale_zeros)
    return torch._weight_int4pack_mm(xb, packed, GROUP, scale_zeros)


def _dequantize_rows(packed: torch.Tensor, scale_zeros: torch.Tensor, r0: int, rows: int,
                     k: int, buf: torch.Tensor) -> torch.Tensor:
    """Rows [r0, r0+rows) of a CPU-packed weight as float32 [rows, k]: ``(q - 8) * scale +
    zero``, the same float32 operations in the same order as on :func:`_unpack_cpu`'s
    output, so bit for bit the same values. r0 is a multiple of 64 (the layout's blocks);
    ``buf`` is float32 scratch of at least ``rows`` (rounded up to 64) x k."""
    b0, b1 = r0 // 64, -(-(r0 + rows) // 64)
    v = packed.view(-1, k, 32)[b0:b1].transpose(1, 2).contiguous()  # [blocks, 32, K]: byte j = rows j, j+32
    q = buf.view(-1)[:(b1 - b0) * 64 * k].view(b1 - b0, 64, k)
    q[:, :32] = v & 15
    q[:, 32:] = v >> 4
    q = q.view(-1, k)[:rows].sub_(8).view(rows, k // GROUP, GROUP)
    sz = scale_zeros[:, r0:r0 + rows].float().permute(2, 1, 0).unsqueeze(-1).contiguous()  # [2, rows, K/32, 1]
    q.mul_(sz[0]).add_(sz[1])
    return q.view(rows, k)


def _unpack_cpu(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Inverse of ``_convert_weight_to_int4pack_for_cpu`` (uint8 [N, K]).

    Its layout (read off the kernel, checked by tests): blocks of 64 output rows; for
    each input column 32 bytes, byte j holding row j (low nibble) and row j+32 (high).
    """
    v = packed.view(n // 64, k, 32)
    u = torch.stack([v & 15, v >> 4], 2)  # [N/64, K, 2, 32]
    return u.view(n // 64, k, 64).transpose(1, 2).reshape(n, k)


def _pack_rows(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed, scale_zeros) of a block of rows; padded to the CPU kernel's 64-row blocks."""
    pad = -q.shape[0] % 64 if device.type == "cpu" else 0
    if pad:
        q, scale, zero = (F.pad(t, (0, 0, 0, pad)) for t in (q, scale, zero))
    sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(device=device, dtype=torch.bfloat16)
    if device.type == "cpu":
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


@dataclass
class Groups:
    """GGUF blocks decoded to groups of ``size`` weights: value = q * scale + zero (float32 math)."""
    q: torch.Tensor  # int16 [N, K]
    scale: torch.Tensor  # float32 [N, K/size]
    zero: torch.Tensor  # float32 [N, K/size]
    size: int = GROUP  # 16 for Q6_K, else 32


_BLOCK_BYTES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144),
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
    block, nbytes = _BLOCK_BYTES[kind]
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


def _requantize_q6_k(g: Groups) -> Groups:
    """Q6_K's 16-weight groups as 32-weight ones (see the module docstring: rounds)."""
    n = g.q.shape[0]
    s = g.scale.view(n, -1, 2)  # d*sc of each pair of sub-blocks
    big = torch.where(s[..., 0].abs() >= s[..., 1].abs(), s[..., 0], s[..., 1])  # [N, K/32]
    ratio = torch.where(big.unsqueeze(-1) == 0, torch.zeros_like(s), s / big.unsqueeze(-1))  # 1 for big, |.| <= 1
    v = torch.round(4 * g.q.view(n, -1, 2, 16).float() * ratio.unsqueeze(-1)).clamp_(-128, 127)
    return Groups(v.to(torch.int16).view(n, -1), big / 4, torch.zeros_like(big))


def pack_gguf(raw: torch.Tensor, kind: str, n: int, k: int, device: torch.device) -> Int4Linear:
    """An Int4Linear holding a GGUF tensor [N, K] of one of PACKED_TYPES.

    Decoded and packed CHUNK_ROWS rows at a time, so the temporaries (int32 values,
    float32 scales) stay a few MB instead of several times the tensor.
    """
    if k % _BLOCK_BYTES[kind][0]:
        raise ValueError(f"{k} columns are not a multiple of {kind}'s block size {_BLOCK_BYTES[kind][0]}")
    if raw.numel() % max(n, 1):
        raise ValueError(f"holds {raw.numel()} bytes, not a whole number per row for {n} rows")
    rows = raw.reshape(n, -1)
    planes = 2 if kind in TWO_PLANES else 1

    def parts():
        for i in range(0, n, CHUNK_ROWS):
            chunk = rows[i:i + CHUNK_ROWS]
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


def swap_linear(model: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the Linear owning parameter ``name`` ('layers.0.attention.wq.weight')."""
    parent, _, attr = name.removesuffix(".weight").rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)


def describe(model: nn.Module) -> dict[str, int]:
    """How many linear layers take each path: {'Q4_0 int4-packed': 14, 'float': 3, ...};
    an embedding kept as GGUF blocks counts as 'Q4_0 embedding-blocks'."""
    out: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, GGUFEmbedding):
            key = f"{m.kind} embedding-blocks"
        elif isinstance(m, Float16Linear):
            key = f"{m.source} float16-kept"
        elif isinstance(m, QuantLinear):
            key = f"{m.source} {'int8-packed' if isinstance(m, Int8Linear) else path_of(m.source) if m.source in PACKED_TYPES else 'int4-packed'}"
        elif type(m).__name__ == "Linear":
            key = "float"
        else:
            continue
        out[key] = out.get(key, 0) + 1
    return out
