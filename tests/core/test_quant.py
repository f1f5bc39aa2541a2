"""Packed quantized layers: repacks against gguf's own dequantizer, kernels against dense math."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from core import quant

CPU = torch.device("cpu")
N, K = 160, 512  # 160 rows: not a multiple of the CPU kernel's 64-row block (padding is exercised)


def gguf_blocks(kind: str, n: int = N, k: int = K, seed: int = 0) -> np.ndarray:
    """Raw blocks of one [n, k] tensor: gguf's quantizer where it has one, else random
    K-quant blocks with random fp16 d/dmin (every 4-bit value and 6-bit scale occurs)."""
    rng = np.random.default_rng(seed)
    if kind != "Q4_K":
        return quantize(rng.standard_normal((n, k)).astype(np.float32), Q[kind])
    block, size = GGML_QUANT_SIZES[Q.Q4_K]
    data = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    d = rng.uniform(1e-4, 3e-2, size=(n, k // block, 2)).astype(np.float16)
    data[..., 0:4] = d.view(np.uint8).reshape(n, k // block, 4)
    return data.reshape(n, -1)


def as_raw(data: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(data).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "Q4_K"])
def test_block_decoding_is_bit_exact_against_gguf(kind):
    data = gguf_blocks(kind)
    ref = torch.from_numpy(dequantize(data, Q[kind]).astype(np.float32)).reshape(N, K)
    g = quant.decode_blocks(as_raw(data), kind, N, K)
    mine = (g.q.view(N, K // 32, 32).float() * g.scale.unsqueeze(-1) + g.zero.unsqueeze(-1)).view(N, K)
    assert torch.equal(mine, ref)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_q4_0_and_q8_0_repack_exactly_up_to_the_bfloat16_scale(kind):
    """The packed layer holds q * bf16(d) bit for bit; bf16(d) is the only rounding (<= 2**-8)."""
    data = gguf_blocks(kind)
    g = quant.decode_blocks(as_raw(data), kind, N, K)
    layer = quant.pack_gguf(as_raw(data), kind, N, K, CPU)
    d = g.scale.bfloat16().float().unsqueeze(-1)
    q = g.q.view(N, K // 32, 32).float() - (8 if kind == "Q4_0" else 0)
    assert torch.equal(layer.dequantize(), (q * d).view(N, K))
    ref = torch.from_numpy(dequantize(data, Q[kind]).astype(np.float32)).reshape(N, K)
    bound = 2 ** -8 * ref.abs() + 1e-30
    assert ((layer.dequantize() - ref).abs() <= bound).all()
    assert not torch.equal(layer.dequantize(), ref)  # fp16 scales really do round


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K"])
def test_affine_repacks_within_the_stated_rounding(kind):
    """Q4_1/Q4_K: scale and zero (m + 8d, 8*d*sc - dmin*m) each round to bf16 (<= 2**-8 relative)."""
    data = gguf_blocks(kind)
    g = quant.decode_blocks(as_raw(data), kind, N, K)
    ref = torch.from_numpy(dequantize(data, Q[kind]).astype(np.float32)).reshape(N, K)
    layer = quant.pack_gguf(as_raw(data), kind, N, K, CPU)
    zero8 = (g.zero + 8 * g.scale).abs()
    bound = (2 ** -8 * (8 * g.scale.abs() + zero8) * 1.001).repeat_interleave(32, 1)
    err = (layer.dequantize() - ref).abs()
    assert (err <= bound).all(), (err / bound).max()
    assert err.max() > 0


def test_cpu_unpack_reads_the_kernels_layout():
    q = torch.randint(0, 16, (192, 96), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    assert torch.equal(quant._unpack_cpu(packed, 192, 96).int(), q)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("rows", [1, 3, quant.DENSE_ROWS])
def test_packed_matmul_matches_dense_math(kind, rows):
    """Kernel (few rows) and dequantize-then-bf16 (many rows) both equal x @ W.T computed in
    float64 from the bf16-rounded input, within bfloat16 output rounding."""
    data = gguf_blocks(kind)
    layer = quant.pack_gguf(as_raw(data), kind, N, K, CPU)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows))
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (rows, N)
    ref = x.bfloat16().double() @ layer.dequantize().double().t()
    # bf16 output (2**-8 relative) plus, on the dense path, bf16 weights (2**-8 each)
    assert ((y.double() - ref).abs() <= 2 ** -7 * ref.abs().max()).all()


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_quantize_float_weights_on_load(kind):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(1))
    layer = quant.quantizer(kind)(w, CPU)
    err = (layer.dequantize() - w).abs()
    if kind == "int4":  # half a step of each 32-weight group, plus bf16 rounding of scale/min
        g = w.view(N, K // 32, 32)
        step = ((g.amax(-1) - g.amin(-1)) / 15).repeat_interleave(32, 1)
        assert (err <= 0.5 * step + 2 ** -8 * (w.abs() + g.abs().amax(-1).repeat_interleave(32, 1)) * 2).all()
    else:
        step = (w.abs().amax(1, keepdim=True) / 127)
        assert (err <= 0.5 * step * 1.01).all()
    x = torch.randn(2, K)
    ref = x.bfloat16().double() @ layer.dequantize().double().t()
    assert ((layer(x).double() - ref).abs() <= 2 ** -7 * ref.abs().max()).all()


def test_bad_blocks_raise_value_errors_that_say_why():
    data = gguf_blocks("Q8_0")
    with pytest.raises(ValueError, match="bytes"):
        quant.decode_blocks(as_raw(data)[:-5], "Q8_0", N, K)
    with pytest.raises(ValueError, match="multiple of Q4_0's block size 32"):
        quant.decode_blocks(as_raw(gguf_blocks("Q4_0")), "Q4_0", N, 48)
    assert quant.packable("Q6_K", (64, 256), CPU) == "Q6_K has no packed kernel"
    assert "group size" in quant.packable("int4", (64, 48), CPU)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_cuda_int4_matches_cpu():  # pragma: no cover - runs only with a GPU
    data = gguf_blocks("Q4_0", 256, 512)
    cpu = quant.pack_gguf(as_raw(data), "Q4_0", 256, 512, CPU)
    gpu = quant.pack_gguf(as_raw(data), "Q4_0", 256, 512, torch.device("cuda"))
    torch.testing.assert_close(gpu.dequantize().cpu(), cpu.dequantize())
    x = torch.randn(2, 512)
    torch.testing.assert_close(gpu(x.cuda()).cpu(), cpu(x), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_packing_in_row_chunks_equals_packing_at_once(kind, monkeypatch):
    data = gguf_blocks(kind, n=200)
    whole = quant.pack_gguf(as_raw(data), kind, 200, K, CPU)
    monkeypatch.setattr(quant, "CHUNK_ROWS", 64)  # 200 rows: three whole chunks and a padded one
    chunked = quant.pack_gguf(as_raw(data), kind, 200, K, CPU)
    assert torch.equal(chunked.dequantize(), whole.dequantize())
    x = torch.randn(2, K)
    assert torch.equal(chunked(x), whole(x))
