"""Packed quantized layers: repacks against gguf's own dequantizer, kernels against dense math."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from core.model import pack, quant

CPU = torch.device("cpu")
N, K = 160, 512  # 160 rows: not a multiple of the CPU kernel's 64-row block (padding is exercised)


def gguf_blocks(kind: str, n: int = N, k: int = K, seed: int = 0) -> np.ndarray:
    """Raw blocks of one [n, k] tensor: gguf's quantizer where it has one, else random
    K-quant blocks with random fp16 d/dmin (every 4-bit value and 6-bit scale occurs)."""
    rng = np.random.default_rng(seed)
    if not kind.endswith("_K"):
        return quantize(rng.standard_normal((n, k)).astype(np.float32), Q[kind])
    block, size = GGML_QUANT_SIZES[Q[kind]]
    data = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    d = rng.uniform(1e-4, 3e-2, size=(n, k // block, 2)).astype(np.float16)
    if kind == "Q6_K":  # d ends the block (the int8 sub-block scales take every value)
        data[..., size - 2:] = d[..., :1].view(np.uint8).reshape(n, k // block, 2)
    else:  # Q4_K/Q5_K: d and dmin lead
        data[..., 0:4] = d.view(np.uint8).reshape(n, k // block, 4)
    return data.reshape(n, -1)


def as_raw(data: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(data).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K"])
def test_block_decoding_is_bit_exact_against_gguf(kind):
    data = gguf_blocks(kind)
    ref = torch.from_numpy(dequantize(data, Q[kind]).astype(np.float32)).reshape(N, K)
    g = pack.decode_blocks(as_raw(data), kind, N, K)
    assert g.size == (16 if kind == "Q6_K" else 32)
    mine = (g.q.view(N, K // g.size, g.size).float() * g.scale.unsqueeze(-1) + g.zero.unsqueeze(-1)).view(N, K)
    assert torch.equal(mine, ref)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q5_0"])
def test_q4_0_q5_0_and_q8_0_repack_exactly_up_to_the_bfloat16_scale(kind):
    """The packed layer holds q * bf16(d) bit for bit; bf16(d) is the only rounding (<= 2**-8)."""
    data = gguf_blocks(kind)
    g = pack.decode_blocks(as_raw(data), kind, N, K)
    layer = pack.pack_gguf(as_raw(data), kind, N, K, CPU)
    assert layer.planes == (1 if kind == "Q4_0" else 2)
    d = g.scale.bfloat16().float().unsqueeze(-1)
    q = g.q.view(N, K // 32, 32).float() - (8 if kind == "Q4_0" else 0)
    assert torch.equal(layer.dequantize(), (q * d).view(N, K))
    ref = torch.from_numpy(dequantize(data, Q[kind]).astype(np.float32)).reshape(N, K)
    bound = 2 ** -8 * ref.abs() + 1e-30
    assert ((layer.dequantize() - ref).abs() <= bound).all()
    assert not torch.equal(layer.dequantize(), ref)  # fp16 scales really do round


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K", "Q5_1", "Q5_K"])
def test_affine_repacks_within_the_stated_rounding(kind):
    """Q4_1/Q4_K/Q5_1/Q5_K: scale and zero (m + 8d, 8*d*sc - dmin*m) each round to bf16
    (<= 2**-8 relative); the 5-bit types' high plane carries 16x the scale."""
    data = gguf_blocks(kind)
    g = pack.decode_blocks(as_raw(data), kind, N, K)
    ref = torch.from_numpy(dequantize(data, Q[kind]).astype(np.float32)).reshape(N, K)
    layer = pack.pack_gguf(as_raw(data), kind, N, K, CPU)
    zero8 = (g.zero + 8 * g.scale).abs()
    top = 8 if kind.startswith("Q4") else 128 + 16 * 8  # the largest |q - 8| (|u - 128| twice for 5 bits)
    bound = (2 ** -8 * (top * g.scale.abs() + zero8) * 1.001).repeat_interleave(32, 1)
    err = (layer.dequantize() - ref).abs()
    assert (err <= bound).all(), (err / bound).max()
    assert err.max() > 0


def test_q6_k_requantizes_within_the_stated_rounding():
    """Q6_K's 16-weight scales become one per 32: the sub-block with the larger |sc| keeps
    its values exactly (up to the bf16 scale), the other rounds by at most d*|sc|/8."""
    data = gguf_blocks("Q6_K")
    g = pack.decode_blocks(as_raw(data), "Q6_K", N, K)
    ref = torch.from_numpy(dequantize(data, Q.Q6_K).astype(np.float32)).reshape(N, K)
    layer = pack.pack_gguf(as_raw(data), "Q6_K", N, K, CPU)
    assert layer.planes == 2 and quant.path_of("Q6_K") == "int4x2-requantized"
    s = g.scale.view(N, -1, 2)
    first = s[..., 0].abs() >= s[..., 1].abs()
    big = torch.where(first, s[..., 0], s[..., 1]).abs()
    err = (layer.dequantize() - ref).abs().view(N, -1, 2, 16)
    scale_rounding = 2 ** -8 * ref.abs().view(N, -1, 2, 16) * 1.001
    is_big = torch.stack([first, ~first], -1)
    assert (err <= scale_rounding)[is_big].all()  # exact but for bf16(d*sc/4)
    q = g.q.view(N, -1, 2, 16)
    clamped = (s[..., 0] == -s[..., 1]).view(N, -1, 1, 1) & (q == -32) & ~is_big.unsqueeze(-1)
    bound = big.view(N, -1, 1, 1) / torch.where(clamped, 4.0, 8.0) * 1.001 + scale_rounding
    assert (err <= bound).all()
    assert (err > scale_rounding)[~is_big].any()  # the rounding is real


def test_cpu_unpack_reads_the_kernels_layout():
    q = torch.randint(0, 16, (192, 96), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    assert torch.equal(quant._unpack_cpu(packed, 192, 96).int(), q)


_OTHER_CAPABILITY = """
import sys, torch
from core.model import pack, quant
lay = quant.cpu_layout()
assert lay is not None and lay.name == sys.argv[1], (lay, sys.argv[1])
g = torch.Generator().manual_seed(1)
w = torch.randn(200, 96, generator=g)
layer = pack.quantize_int4(w, torch.device("cpu"))
x = torch.randn(quant.DENSE_ROWS, 96, generator=g).to(torch.bfloat16)
kernel = quant._int4_mm(x, layer.packed, layer.scale_zeros)[:, :200].float()
dense = x.float() @ layer.dequantize().t()   # the prefill path reads the bytes back
assert (kernel - dense).abs().max() <= 0.02 * dense.abs().max(), (kernel - dense).abs().max()
"""


@pytest.mark.parametrize("capability,layout", [("avx2", "avx2"), ("default", "scalar")])
def test_weights_read_back_in_the_layout_of_the_cpu_torch_runs_on(capability, layout):
    """Most desktop CPUs have no AVX-512, and torch's packer then writes 32-row blocks (AVX2)
    or neighbouring rows (scalar): reading every CPU's bytes as AVX-512's scrambled the prefill
    path's weights there. A fresh interpreter, since torch picks the capability at start."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", _OTHER_CAPABILITY, layout], env=env, cwd=root,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("rows", [1, 3, quant.DENSE_ROWS])
def test_packed_matmul_matches_dense_math(kind, rows):
    """Kernel (few rows) and dequantize-then-bf16 (many rows) both equal x @ W.T computed in
    float64 from the bf16-rounded input, within bfloat16 output rounding."""
    data = gguf_blocks(kind)
    layer = pack.pack_gguf(as_raw(data), kind, N, K, CPU)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows))
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (rows, N)
    ref = x.bfloat16().double() @ layer.dequantize().double().t()
    # bf16 output (2**-8 relative) plus, on the dense path, bf16 weights (2**-8 each)
    assert ((y.double() - ref).abs() <= 2 ** -7 * ref.abs().max()).all()


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_quantize_float_weights_on_load(kind):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(1))
    layer = pack.quantizer(kind)(w, CPU)
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
        pack.decode_blocks(as_raw(data)[:-5], "Q8_0", N, K)
    with pytest.raises(ValueError, match="multiple of Q4_0's block size 32"):
        pack.decode_blocks(as_raw(gguf_blocks("Q4_0")), "Q4_0", N, 48)
    assert pack.packable("Q3_K", (64, 256), CPU) == "Q3_K has no packed kernel"
    assert "group size" in pack.packable("int4", (64, 48), CPU)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_cuda_int4_matches_cpu():  # pragma: no cover - runs only with a GPU
    data = gguf_blocks("Q4_0", 256, 512)
    cpu = pack.pack_gguf(as_raw(data), "Q4_0", 256, 512, CPU)
    gpu = pack.pack_gguf(as_raw(data), "Q4_0", 256, 512, torch.device("cuda"))
    torch.testing.assert_close(gpu.dequantize().cpu(), cpu.dequantize())
    x = torch.randn(2, 512)
    torch.testing.assert_close(gpu(x.cuda()).cpu(), cpu(x), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_packing_in_row_chunks_equals_packing_at_once(kind, monkeypatch):
    data = gguf_blocks(kind, n=200)
    whole = pack.pack_gguf(as_raw(data), kind, 200, K, CPU)
    monkeypatch.setattr(pack, "CHUNK_ROWS", 64)  # 200 rows: three whole chunks and a padded one
    chunked = pack.pack_gguf(as_raw(data), kind, 200, K, CPU)
    assert torch.equal(chunked.dequantize(), whole.dequantize())
    x = torch.randn(2, K)
    assert torch.equal(chunked(x), whole(x))


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
def test_dequantize_in_row_blocks_equals_unpacking_the_whole_weight(kind, monkeypatch):
    """dequantize() works a few 64-row blocks at a time; bit for bit what unpacking the whole
    kernel layout at once and applying (q - 8) * scale + zero in float32 gives, in float32
    and (after one rounding) in bfloat16, the dense prefill weight."""
    data = gguf_blocks(kind, n=200)
    layer = pack.pack_gguf(as_raw(data), kind, 200, K, CPU)
    k = K * layer.planes
    q = quant._unpack_cpu(layer.packed, layer.scale_zeros.shape[1], k)[:200].view(200, k // 32, 32).float()
    sz = layer.scale_zeros[:, :200].float()
    ref = ((q - 8) * sz[..., 0].t().unsqueeze(-1) + sz[..., 1].t().unsqueeze(-1)).view(200, layer.planes, K).sum(1)
    monkeypatch.setattr(quant, "DEQUANT_CHUNK", 64 * k)  # one 64-row block a step, the last one short
    assert torch.equal(layer.dequantize(), ref)
    assert torch.equal(layer.dequantize(torch.bfloat16), ref.bfloat16())
    monkeypatch.setattr(quant, "DEQUANT_CHUNK", 1 << 30)  # all at once
    assert torch.equal(layer.dequantize(), ref)


def test_dense_weights_are_set_inside_the_block_only():
    data = gguf_blocks("Q4_0")
    seq = torch.nn.Sequential(pack.pack_gguf(as_raw(data), "Q4_0", N, K, CPU),
                              pack.quantize_int8(torch.randn(K, N), CPU))
    x = torch.randn(5, K)
    few_rows = seq(x)  # the packed kernels
    with quant.dense_weights(seq):
        assert seq[0].dense.dtype == torch.bfloat16 and torch.equal(seq[0].dense, seq[0].dequantize(torch.bfloat16))
        assert torch.equal(seq[1].dense, seq[1].dequantize(torch.bfloat16))
        dense = seq(x)
        ref = x.bfloat16().float() @ seq[0].dense.float().t()
        assert ((seq[0](x) - ref).abs() <= 2 ** -7 * ref.abs().max()).all()
    assert seq[0].dense is None and seq[1].dense is None
    assert ((dense - few_rows).abs() <= 2 ** -6 * few_rows.abs().max()).all()
    with pytest.raises(RuntimeError), quant.dense_weights(seq):
        raise RuntimeError("freed on the way out of an error too")
    assert seq[0].dense is None and seq[1].dense is None
