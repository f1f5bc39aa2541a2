"""Q4_K / Q5_K / Q6_K products (csrc/kquants.c) against the gguf package's own
dequantization in float64, bit-for-bit invariance over batch mixes and thread counts, and
the plain-C path against this machine's SIMD path."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from core.model.kernels import ops
from tests.core.model.test_quant import as_raw, gguf_blocks

KINDS = ["Q4_K", "Q5_K", "Q6_K"]


def weights(kind, n, k, seed=0):
    data = gguf_blocks(kind, n=n, k=k, seed=seed)
    return as_raw(data), dequantize(data, Q[kind]).astype(np.float64).reshape(n, k)


def quantized_x(x: np.ndarray, block: int = 256):
    """The int16 activations the kernels work on, as float64 (their definition: per
    ``block`` inputs, 256 for the K-quants and 32 for Q8_0, s = max|x| / 32767,
    q = rint(x * float32(32767 / max|x|)))."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.abs(xb).max(-1, keepdims=True)
    inv = np.float32(32767) / np.where(amax == 0, np.float32(1), amax)
    q = np.rint(xb * inv)
    s = (amax / np.float32(32767)).astype(np.float32)
    return (q.astype(np.float64) * s.astype(np.float64)).reshape(x.shape), s


def rand_x(m, k, seed=1):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    x[:, ::97] *= 30  # outliers, as real activations have
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_products_match_gguf_dequantization_in_float64(kind, lib):
    n, k, m = 40, 768, 3
    raw, w = weights(kind, n, k)
    x = rand_x(m, k)
    y = ops.mm(kind, raw, n, k, x).double().numpy()
    xq, s = quantized_x(x.numpy())
    # on the int16 activations it works on, the kernel is exact but for float32 rounding
    ref = xq @ w.T
    scale = np.abs(xq) @ np.abs(w).T
    assert np.abs(y - ref).max() <= 1e-5 * scale.max()
    assert (np.abs(y - ref) <= 2e-6 * scale + 1e-30).all()
    # and against x itself: no further than half a quantization step per input
    exact = x.double().numpy() @ w.T
    step = np.repeat(s.reshape(m, -1), 256, axis=1) / 2
    assert (np.abs(y - exact) <= step @ np.abs(w).T + 2e-6 * scale).all()


@pytest.mark.parametrize("kind", KINDS)
def test_extreme_scales_stay_exact_to_float32(kind, lib):
    n, k = 8, 512
    data = gguf_blocks(kind, n=n, k=k, seed=5).reshape(n, k // 256, -1)
    d = np.array([65504, 6e-8, 1e-3, 2.0], np.float16)  # largest, subnormal, ordinary
    at = slice(data.shape[-1] - 2, None) if kind == "Q6_K" else slice(0, 2)
    data[..., at] = d[np.arange(n * (k // 256)).reshape(n, -1) % 4].view(np.uint8).reshape(n, -1, 2)
    raw, w = as_raw(data), dequantize(data.reshape(n, -1), Q[kind]).astype(np.float64).reshape(n, k)
    x = rand_x(4, k, seed=2)
    x[1] *= 1e-30
    x[2] *= 1e20
    y = ops.mm(kind, raw, n, k, x).double().numpy()
    xq, _ = quantized_x(x.numpy())
    ref, scale = xq @ w.T, np.abs(xq) @ np.abs(w).T
    assert np.isfinite(y).all()
    assert (np.abs(y - ref) <= 2e-6 * scale).all()


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_finite_input_spoils_its_own_row_only(kind, lib):
    n, k = 24, 512
    raw, _ = weights(kind, n, k)
    x = rand_x(3, k)
    alone = ops.mm(kind, raw, n, k, x)
    for bad in (float("nan"), float("inf")):
        xb = x.clone()
        xb[1, 300] = bad
        y = ops.mm(kind, raw, n, k, xb)
        assert y[1].isnan().all()
        assert torch.equal(y[0], alone[0]) and torch.equal(y[2], alone[2])


@pytest.mark.parametrize("kind", KINDS)
def test_each_row_is_the_same_bits_alone_batched_and_on_two_threads(kind, lib):
    n, k = 72, 512  # 72: a partial tile of output rows
    raw, _ = weights(kind, n, k, seed=3)
    x = rand_x(16, k, seed=4)
    alone = torch.cat([ops.mm(kind, raw, n, k, x[i:i + 1]) for i in range(16)])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in ([0], [3, 1], list(range(5)), list(range(9)), list(range(16)), [15, 2, 9, 4, 7, 0, 11]):
                assert torch.equal(ops.mm(kind, raw, n, k, x[rows]), alone[rows]), (threads, rows)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kind", KINDS)
def test_the_plain_c_and_avx2_paths_give_this_machines_bits(kind, lib, other_isa_lib):
    n, k = 40, 768
    raw, _ = weights(kind, n, k, seed=6)
    x = rand_x(5, k, seed=7)
    assert torch.equal(ops.mm(kind, raw, n, k, x, lib=other_isa_lib), ops.mm(kind, raw, n, k, x))


def test_shapes_that_do_not_fit_are_refused(lib):
    raw, _ = weights("Q4_K", 4, 256)
    with pytest.raises(ValueError, match="multiple of Q4_K's block size 256"):
        ops.mm("Q4_K", raw[:4 * 72], 4, 128, torch.zeros(1, 128))
    with pytest.raises(ValueError, match="bytes"):
        ops.mm("Q4_K", raw[:-1], 4, 256, torch.zeros(1, 256))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 256\]"):
        ops.mm("Q4_K", raw, 4, 256, torch.zeros(1, 512))


@pytest.mark.parametrize("kind", KINDS)
def test_dequantization_is_ggufs_bit_for_bit_and_bfloat16_is_torchs_rounding(kind, lib):
    n, k = 24, 512
    raw, w = weights(kind, n, k, seed=8)
    f32 = ops.dequantize(kind, raw, n, k)
    assert torch.equal(f32, torch.from_numpy(w.astype(np.float32)))
    assert torch.equal(ops.dequantize(kind, raw, n, k, torch.bfloat16), f32.bfloat16())
