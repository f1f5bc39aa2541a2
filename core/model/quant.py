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
``_convert_weight_to_int4pack``); a layer is packed for one device and cannot move. The CPU
packer's byte order also follows the capability torch dispatches to at run time (AVX-512,
AVX2 or scalar: :data:`CPU_LAYOUTS`), so reading a weight back goes by the layout probed
once per process (:func:`cpu_layout`), never by one assumed.
The CUDA branch follows PyTorch's documented signatures and is unmeasured here.

Packing (GGUF blocks or float weights into these layers) lives in :mod:`core.model.pack`,
decoding GGUF blocks in :mod:`core.model.gguf_blocks`.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from core.model.f16 import Float16Embedding, Float16Linear
from core.model.gguf_blocks import decode_blocks
from core.model.kernels.linear import KernelLinear

GROUP = 32
#: Rows from which a matmul dequantizes to bfloat16 and runs dense (CPU), and from which
#: the Engine prefills layer by layer: the int4 kernel costs ~0.4 ms per row of a 5632x2048
#: weight (0.8 ms with two planes), dequantizing it 25-60 ms once and the dense bf16 matmul
#: ~0.07 ms per row: dense wins from 75-130 rows (bench/bench_quant.py --crossover).
DENSE_ROWS = 96
#: The same for Int8Linear (its dequantize is one multiply)
INT8_DENSE_ROWS = 32
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
            return _through_kernel(self, dtype)
        lay = cpu_layout()
        if lay is None:  # an unknown packer layout: read the weight back through the kernel
            return _through_kernel(self, dtype)
        out = torch.empty(n, self.in_features, dtype=dtype)
        # A few 64-row blocks at a time, so the float32 temporaries (~2 MB) stay in cache:
        # ~5x faster than unpacking the whole weight at once (see bench/bench_quant.py).
        step = 64 * max(1, DEQUANT_CHUNK // (64 * k))
        buf = torch.empty(step, k)  # reused: a fresh large tensor per step costs page faults
        for r0 in range(0, n, step):
            w = _dequantize_rows(self.packed, self.scale_zeros, r0, min(step, n - r0), k, buf, lay)
            if self.planes > 1:
                w = w.view(-1, self.planes, self.in_features).sum(1)
            out[r0:r0 + step] = w
        return out

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, source={self.source}"


def _through_kernel(layer: Int4Linear, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] read back by multiplying the identity (a layout this code cannot read:
    CUDA's, or an unknown CPU one); the sums round to bfloat16."""
    n, k = layer.out_features, layer.in_features * layer.planes
    eye = torch.eye(k, device=layer.packed.device, dtype=torch.bfloat16)
    w = _int4_mm(eye, layer.packed, layer.scale_zeros)[:, :n].t().float()
    if layer.planes > 1:
        w = w.view(n, layer.planes, layer.in_features).sum(1)
    return w.to(dtype)


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


QuantLinear = (Int4Linear, Int8Linear, Float16Linear, KernelLinear)
Packed = (Int4Linear, Int8Linear, GGUFEmbedding, Float16Linear, Float16Embedding, KernelLinear)


def packed_on_cpu(module: nn.Module, *, dense_only: bool = True) -> list[nn.Module]:
    """The packed linear layers of ``module`` that live on the CPU; ``dense_only``: those
    that prefill through a dense copy (:func:`dense_weights`), not those whose compiled
    kernel does it (a layered prefill still suits them: its chunks are a layer's share)."""
    return [m for m in module.modules() if isinstance(m, QuantLinear) and m.dense is None
            and next(m.buffers()).device.type == "cpu"
            and not (dense_only and getattr(m, "prefills_itself", False))]


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


@dataclass(frozen=True)
class CpuLayout:
    """Where torch's CPU int4 packer puts each row's nibbles (``weight_to_int4pack_kernel``):
    blocks of ``block`` output rows; for each input column ``block/2`` bytes, the rows
    ``lo`` of the block in their low nibbles and the rows ``hi`` in their high ones. The
    packer's choice follows the CPU capability torch dispatches to at run time."""
    name: str
    block: int
    lo: slice
    hi: slice


#: AVX-512: byte j holds rows j and j+32; AVX2: rows j and j+16 of 32-row blocks; the
#: scalar build: neighbouring rows 2j and 2j+1.
CPU_LAYOUTS = (CpuLayout("avx512", 64, slice(0, 32), slice(32, 64)),
               CpuLayout("avx2", 32, slice(0, 16), slice(16, 32)),
               CpuLayout("scalar", 32, slice(0, None, 2), slice(1, None, 2)))


@functools.cache
def cpu_layout() -> CpuLayout | None:
    """The layout this process's packer writes, probed once on a small random matrix
    (None: none of the known ones, and weights are read back through the kernel)."""
    q = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    for lay in CPU_LAYOUTS:
        if torch.equal(_unpack_as(lay, packed, 128, 64), q.to(torch.uint8)):
            return lay
    return None


def _dequantize_rows(packed: torch.Tensor, scale_zeros: torch.Tensor, r0: int, rows: int,
                     k: int, buf: torch.Tensor, lay: CpuLayout) -> torch.Tensor:
    """Rows [r0, r0+rows) of a CPU-packed weight as float32 [rows, k]: ``(q - 8) * scale +
    zero``, the same float32 operations in the same order as on :func:`_unpack_cpu`'s
    output, so bit for bit the same values. r0 is a multiple of 64 (so of every layout's
    blocks); ``buf`` is float32 scratch of at least ``rows`` (rounded up to 64) x k."""
    b = lay.block
    b0, b1 = r0 // b, -(-(r0 + rows) // b)
    v = packed.view(-1, k, b // 2)[b0:b1].transpose(1, 2).contiguous()  # [blocks, b/2, K]
    q = buf.view(-1)[:(b1 - b0) * b * k].view(b1 - b0, b, k)
    q[:, lay.lo] = v & 15
    q[:, lay.hi] = v >> 4
    q = q.view(-1, k)[:rows].sub_(8).view(rows, k // GROUP, GROUP)
    sz = scale_zeros[:, r0:r0 + rows].float().permute(2, 1, 0).unsqueeze(-1).contiguous()  # [2, rows, K/32, 1]
    q.mul_(sz[0]).add_(sz[1])
    return q.view(rows, k)


def _unpack_as(lay: CpuLayout, packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    v = packed.view(n // lay.block, k, lay.block // 2)
    out = torch.empty(n // lay.block, k, lay.block, dtype=torch.uint8)
    out[..., lay.lo] = v & 15
    out[..., lay.hi] = v >> 4
    return out.transpose(1, 2).reshape(n, k)


def _unpack_cpu(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Inverse of ``_convert_weight_to_int4pack_for_cpu`` (uint8 [N, K]) in this process's
    layout (:func:`cpu_layout`); N is a multiple of 64 (rows are padded to it)."""
    lay = cpu_layout()
    if lay is None:
        raise RuntimeError("torch's CPU int4 layout is not one LlamaDesk can read back")
    return _unpack_as(lay, packed, n, k)


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
        elif isinstance(m, KernelLinear):
            key = f"{m.kind} kernel"
        elif isinstance(m, QuantLinear):
            key = f"{m.source} {'int8-packed' if isinstance(m, Int8Linear) else path_of(m.source) if m.source in PACKED_TYPES else 'int4-packed'}"
        elif type(m).__name__ == "Linear":
            key = "float"
        else:
            continue
        out[key] = out.get(key, 0) + 1
    return out
