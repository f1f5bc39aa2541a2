"""Float16 weights kept as the file stores them, with float32 activations around them.

A GGUF F16 file computed in bfloat16 drops 3 mantissa bits of every weight and of every
activation: teacher-forced on a peaked model it stood 16x further from the exact
(float64) result than llama.cpp, which keeps F16 weights and accumulates in float32. In
float32 throughout it is exact but holds and reads 4 bytes a weight, and decode reads
every weight once a token. So the linear layers keep the file's 2-byte weights (a view
of the memory-mapped file: nothing is converted at load) and the model around them runs
in float32:

- decode (a few rows): PyTorch's float16 matrix-vector kernel, which accumulates in
  float32; only the activation (rounded to float16, as llama.cpp does) and the output
  (rounded once) lose bits. ``W @ x.T`` takes that kernel; ``F.linear`` on one row ran
  2.5x slower on the AMD EPYC measured (2.3 vs 6.0 ms for 8192x2048), and fp32 ran 5.8.
- prefill (many rows): PyTorch's float16 GEMM has no fast CPU kernel (128 rows: 255 ms
  against 100 ms in float32 plus 53 ms to widen the weight), so from DENSE_ROWS rows the
  weight is widened to float32 (exactly) and multiplied densely; a long prompt widens
  each layer once per prompt (:func:`core.model.quant.dense_weights`). The float32 GEMM
  is oneDNN's where PyTorch has it: on the AMD EPYC measured, MKL's (``F.linear``) ran
  8192x2048 at 16 rows in 22.5 ms and at 64 rows in 50 ms, oneDNN's in 9.3 and 25.6 ms
  (1 thread); a layered prefill multiplies chunks of 16-64 rows.

The output layer is the exception: its float16 results are the logits, whose rounding
(2**-11 of a logit of 20 is 0.01) stood for most of the distance from exact (a 4-layer
peaked model: 2.6e-4 mean |Δ log-prob|, 8.1e-5 with float32 logits, 7.9e-5 with float32
outputs everywhere). So a layer made with ``refine=R`` recomputes its R largest outputs per
row in float32 (a gather of R weight rows: ~1 MB at R=64 against a 128k-row vocabulary):
the tokens that carry the probability get float32 logits, the tail keeps float16 ones.

A float16 activation overflows past 65504; a row whose float16 result is not finite is
computed again in float32, so a large activation costs time, never a wrong token.

All of the above is the torch path. Where the compiled kernels build
(:mod:`core.model.kernels`), a layer made with ``kernels=`` multiplies every row count with
``ld_mm_f16`` instead (csrc/q8_f16.c): float32 x against the weight widened in registers,
float32 sums, each output the same bits whatever rows share the call and however many
threads run. Nothing is rounded to float16 (so no refine and no overflow retry), no
weight is copied into column blocks, and prefill needs no widened copy.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from core.model.kernels import ops

#: Rows from which a multiply widens the weight to float32 instead of running the float16
#: GEMM (see the module docstring; bench/bench_fidelity.py measures the crossover).
DENSE_ROWS = 16

#: Inputs per contiguous block of a float16 weight (see :func:`k_parts`)
SPLIT_K = 4096

#: oneDNN's float32 inner product (see the module docstring), where this PyTorch has it
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def dense_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T for a float32 weight: oneDNN's kernel on the CPU, else ``F.linear``."""
    if ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32:
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    return F.linear(x, weight)


def k_parts(k: int) -> int:
    """In how many contiguous column blocks a float16 weight of ``k`` inputs is kept.

    PyTorch's float16 matrix-vector kernel reads a weight row against x, both float16; past
    SPLIT_K inputs the two no longer share the L1 cache and the kernel slows (the 1B
    shape's 2048x8192 down projection: 10 GB/s against 15 GB/s for 8192x2048, 1 thread).
    Such a weight is kept as [parts, N, K/parts] (one copy at load) and multiplied part by
    part, summed in float32: at the 8192x2048 rate (2.2 against 3.4 ms)."""
    parts = -(-k // SPLIT_K)
    return parts if k % parts == 0 else 1


class Float16Linear(nn.Module):
    """y = x @ W.T with W held in float16 and x, y in the model's (float32) dtype.

    ``invariant`` (set by :meth:`Transformer.batch_invariant`): a decode step runs each
    row through the one-row kernel, so a row's numbers do not depend on its neighbours.
    ``kernels``: the compiled library (see the module docstring), which then takes every
    product of a CPU weight; None: the torch path.
    """

    def __init__(self, weight: torch.Tensor, source: str = "F16", refine: int = 0,
                 kernels: ctypes.CDLL | None = None):
        super().__init__()
        if weight.dtype != torch.float16 or weight.dim() != 2:
            raise ValueError(f"Float16Linear takes a 2-D float16 weight, not {weight.dtype} {tuple(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        on = kernels is not None and weight.device.type == "cpu" and ops.supports("F16", kernels)
        self.kernels = kernels if on else None
        self.prefills_itself = on  # quant.dense_weights() leaves it be: no widened copy
        self.parts = 1 if on else k_parts(self.in_features)
        if self.parts > 1:  # [parts, N, K/parts]: each part's rows contiguous (see k_parts)
            weight = weight.view(self.out_features, self.parts, -1).transpose(0, 1).contiguous()
        self.register_buffer("weight16", weight)
        self.source = source
        # top outputs per row recomputed in float32 (the kernels' are all float32 already)
        self.refine = 0 if on else min(refine, self.out_features)
        self.invariant = False
        self.dense: torch.Tensor | None = None  # set within quant.dense_weights()
        self.dense_dtype = torch.float32  # what dense_weights() widens to: exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        x2 = x.reshape(rows, self.in_features)
        if self.dense is not None:
            y = dense_linear(x2.to(self.dense.dtype), self.dense)
        elif self.kernels is not None and self.weight16.device.type == "cpu":
            y = ops.mm("F16", self.weight16.view(torch.uint8), self.out_features, self.in_features, x2,
                       self.kernels)
        elif rows >= DENSE_ROWS:
            y = dense_linear(x2.float(), self.dequantize())
        elif self.invariant or rows == 1:
            y = torch.cat([self._half(r) for r in x2.split(1)]) if rows > 1 else self._half(x2)
        else:
            y = self._half(x2)
        if self.refine and self.dense is None and rows < DENSE_ROWS:
            y = self._refined(y, x2)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _half(self, x: torch.Tensor) -> torch.Tensor:
        """float32 x @ W.T from float16 x and W (float32 sums), in float32 when float16 overflowed.
        One row takes PyTorch's float16 matrix-vector kernel (``W @ x.T``)."""
        xh = x.half()
        if self.parts == 1:
            y = (self.weight16 @ xh.t()).t().float()
        else:
            xs = xh.view(-1, self.parts, self.in_features // self.parts)
            y = (self.weight16[0] @ xs[:, 0].t()).t().float()
            for i in range(1, self.parts):
                y += (self.weight16[i] @ xs[:, i].t()).t().float()
        if not bool(torch.isfinite(y).all()):  # float16 overflowed (or x held inf/NaN)
            y = F.linear(x.float(), self.dequantize())
        return y

    def _rows(self, idx: torch.Tensor) -> torch.Tensor:
        """The float16 weight rows ``idx`` ([...] -> [..., K])."""
        if self.parts == 1:
            return self.weight16[idx]
        return self.weight16[:, idx].movedim(0, -2).reshape(*idx.shape, self.in_features)

    def _refined(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y with each row's ``refine`` largest entries recomputed from float32 x in float32."""
        idx = y.topk(self.refine, dim=-1).indices  # [rows, R]
        w = self._rows(idx).float()  # [rows, R, K]
        xf = x.float()
        # row by row: a bmm over the rows rounded a row differently beside others
        exact = torch.stack([torch.mv(w[i], xf[i]) for i in range(len(xf))])
        return y.scatter_(1, idx, exact)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as [N, K] in ``dtype`` (one converting pass, also for a split weight)."""
        if self.parts == 1:
            return self.weight16.to(dtype)
        out = torch.empty(self.out_features, self.in_features, dtype=dtype, device=self.weight16.device)
        out.view(self.out_features, self.parts, -1).copy_(self.weight16.transpose(0, 1))
        return out

    def extra_repr(self) -> str:
        kernel = ", kernel=ld_mm_f16" if self.kernels is not None else ""
        return f"in={self.in_features}, out={self.out_features}, source={self.source}{kernel}"


class Float16Embedding(nn.Module):
    """A token embedding held in float16 (the file's rows), looked up into the model's dtype.

    ``weight`` is a zero-size stand-in carrying the device and compute dtype (what the
    engine and KV cache ask of an embedding), as for :class:`core.model.quant.GGUFEmbedding`.
    """

    def __init__(self, half: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("weight16", half, persistent=False)
        self.register_buffer("weight", torch.empty(0, dtype=dtype, device=half.device), persistent=False)
        self.num_embeddings, self.embedding_dim = half.shape

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight16).to(self.weight.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, source=F16"
