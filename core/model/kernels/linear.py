"""A linear layer on a GGUF tensor's own bytes (K-quants, Q8_0), multiplied by the compiled kernels.

:class:`KernelLinear` holds the tensor's raw blocks as a uint8 view of the memory-mapped
file: nothing is copied or repacked at load (opening a model costs its header, and memory
grows only by the pages a product reads). Rows of x go through ``ld_mm_<type>``
(:mod:`.ops`) whatever their number: decode, comparison lanes and serve's batches alike,
each row's result the same bits in any batch. A long prompt is the exception: the Engine's
layered prefill (:func:`core.model.quant.dense_weights`) sets ``dense`` to the layer's
weight dequantized to bfloat16 once per prompt, and multiplies that, which measured faster
than the kernel from a few dozen rows (docs/PERFORMANCE.md, "Our own kernels").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.model.kernels import ops

#: rows from which one product dequantizes the weight to bfloat16 and runs a dense GEMM
#: instead of the kernel (outside a layered prefill, which dequantizes once per prompt)
DENSE_ROWS = 96


class KernelLinear(nn.Module):
    """y = x @ W.T for W an [out, in] GGUF tensor of a type :data:`.ops.MM` holds, kept as
    the file's blocks (``raw``: uint8 [out, bytes per row], usually a view of the file)."""

    #: the GGUF types it takes (a product and a dequantization in csrc/kquants.c, csrc/q8_f16.c)
    KINDS = ("Q4_K", "Q5_K", "Q6_K", "Q8_0")

    def __init__(self, raw: torch.Tensor, kind: str, in_features: int, out_features: int):
        super().__init__()
        if raw.dtype != torch.uint8 or raw.numel() != out_features * ops.row_bytes(kind, in_features):
            raise ValueError(f"{raw.numel()} bytes do not hold a {kind} [{out_features}, {in_features}] tensor")
        # the tensor itself when already [out, bytes]: a tied embedding holding it counts once
        self.register_buffer("raw", raw if raw.dim() == 2 and raw.shape[0] == out_features
                             else raw.reshape(out_features, -1), persistent=False)
        self.kind, self.source = kind, kind
        self.in_features, self.out_features = in_features, out_features
        self.dense: torch.Tensor | None = None  # set within core.model.quant.dense_weights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.dense is not None or rows >= DENSE_ROWS:
            w = self.dense if self.dense is not None else self.dequantize(torch.bfloat16)
            y = F.linear(x.reshape(rows, self.in_features).to(w.dtype), w)
            return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return ops.mm(self.kind, self.raw, self.out_features, self.in_features, x).to(x.dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [out, in] as ``dtype`` (float32: gguf's dequantization bit for bit)."""
        return ops.dequantize(self.kind, self.raw, self.out_features, self.in_features, dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, source={self.kind}, kernel=ld_mm"
