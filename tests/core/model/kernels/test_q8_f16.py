"""F16 and Q8_0 products (csrc/q8_f16.c) against float64 references on the exact weights
(Q8_0: the gguf package's own dequantization), bit-for-bit invariance over batch mixes and
thread counts, NaN/inf, Q8_0's dequantization."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from core.model.kernels import ops
from tests.core.model.kernels.test_kquants import quantized_x
from tests.core.model.test_quant import as_raw, gguf_blocks


def rand_x(m, k, seed=1):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    x[:, ::37] *= 30  # outliers, as real activations have
    return x


def f16_weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.05).half()


def mm_f16(w: torch.Tensor, x: torch.Tensor, lib=None) -> torch.Tensor:
    return ops.mm("F16", w.view(torch.uint8), w.shape[0], w.shape[1], x, lib)


@pytest.mark.parametrize("k", [2048, 53, 16, 7])  # multiples of 16 and tails of 5, 0, 7 lanes
def test_f16_is_float32_arithmetic_on_the_exact_weights(k, lib):
    n, m = 37, 5
    w, x = f16_weight(n, k), rand_x(m, k)
    y = mm_f16(w, x).double()
    ref = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    # float32 sums of exact products: a few float32 roundings of the magnitudes summed
    assert ((y - ref).abs() <= 1e-6 * scale * max(1, k / 512) + 1e-30).all()
    # the torch path's float16 activations are ~100x further off
    half = (x.half().double() @ w.double().T)
    assert (half - ref).abs().max() > 20 * (y - ref).abs().max()


def test_f16_extreme_halves_are_read_exactly(lib):
    k = 48
    vals = torch.tensor([65504, -65504, 6e-8, -6e-8, 6.1e-5, 1.0, -0.0, 0.0], dtype=torch.float16)
    w = vals.repeat(k // 8).view(1, k).repeat(3, 1).contiguous()
    w[1] = w[1].roll(3)
    x = torch.zeros(2, k)
    for i in range(k):  # one input at a time: each output is one weight, read exactly
        x.zero_()
        x[0, i], x[1, i] = 1.0, -2.0
        y = mm_f16(w, x)
        assert torch.equal(y[0], w[:, i].float()) and torch.equal(y[1], -2 * w[:, i].float())


def test_f16_non_finite_inputs_give_non_finite_outputs(lib):
    w = f16_weight(8, 64)
    x = rand_x(3, 64)
    x[1, 5] = float("inf")
    x[2, 9] = float("nan")
    y = mm_f16(w, x)
    assert torch.isfinite(y[0]).all() and not torch.isfinite(y[1]).any() and torch.isnan(y[2]).all()


@pytest.mark.parametrize("kind", ["F16"])
def test_rows_are_bit_identical_alone_batched_and_at_any_thread_count(kind, lib):
    n, k = 75, 256  # a tail of output rows beyond the tiles
    w = f16_weight(n, k).view(torch.uint8)
    x = rand_x(16, k, seed=4)
    alone = torch.cat([ops.mm(kind, w, n, k, x[i:i + 1]) for i in range(16)])
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for rows in ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [3], [5, 2], [1, 4, 9],
                         [15, 0, 7, 7, 2, 11], list(range(9))):
                got = ops.mm(kind, w, n, k, x[rows])
                assert torch.equal(got, alone[rows]), (kind, t, rows)
    finally:
        torch.set_num_threads(threads)


def q8_weights(n, k, seed=0, d=None):
    data = gguf_blocks("Q8_0", n=n, k=k, seed=seed)
    if d is not None:  # set the blocks' half scales
        blocks = data.reshape(n, k // 32, 34)
        blocks[..., :2] = np.resize(np.asarray(d, np.float16), (n, k // 32)).view(np.uint8).reshape(n, k // 32, 2)
    return as_raw(data), dequantize(data, Q.Q8_0).astype(np.float64).reshape(n, k)


@pytest.mark.parametrize("d", [None, [65504, 6e-8, 1e-3, 2.0, -0.5]], ids=["quantizer", "extreme-scales"])
def test_q8_0_matches_gguf_dequantization_in_float64(d, lib):
    n, k, m = 41, 512, 3
    raw, w = q8_weights(n, k, d=d)
    x = rand_x(m, k)
    y = ops.mm("Q8_0", raw, n, k, x).double().numpy()
    xq, s = quantized_x(x.numpy(), block=32)
    # on its int16 activations the kernel is exact but for float32 rounding
    ref = xq @ w.T
    scale = np.abs(xq) @ np.abs(w).T
    assert (np.abs(y - ref) <= 2e-6 * scale + 1e-30).all()
    # against x itself: within half a quantization step per input (1.5e-5 of a block's max)
    exact = x.double().numpy() @ w.T
    step = np.repeat(s.reshape(m, -1), 32, axis=1) / 2
    assert (np.abs(y - exact) <= step @ np.abs(w).T + 2e-6 * scale).all()


def test_q8_0_zero_and_non_finite_activation_blocks(lib):
    n, k = 6, 128
    raw, w = q8_weights(n, k)
    x = rand_x(4, k)
    x[0, :32] = 0  # an all-zero block contributes nothing
    x[1, 40] = float("inf")
    x[2, 100] = float("nan")
    x[3] = 1e-30  # tiny but normal inputs still count
    y = ops.mm("Q8_0", raw, n, k, x).double().numpy()
    exact = x.double().numpy() @ w.T
    assert np.allclose(y[0], exact[0], rtol=1e-4, atol=1e-4 * np.abs(exact[0]).max())
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    assert np.allclose(y[3], exact[3], rtol=1e-4, atol=0)


def test_q8_0_refuses_k_off_its_block(lib):
    with pytest.raises(ValueError, match="multiple of Q8_0's block size 32"):
        ops.mm("Q8_0", torch.zeros(34 * 3, dtype=torch.uint8), 3, 48, torch.zeros(1, 48))


def test_q8_0_dequantizes_to_gguf_bit_for_bit_and_to_bfloat16_rounded(lib):
    n, k = 9, 96
    raw, w = q8_weights(n, k, seed=7, d=[65504, 6e-8, 1e-3, -2.0])
    got = ops.dequantize("Q8_0", raw, n, k)
    assert torch.equal(got, torch.from_numpy(w.astype(np.float32)))
    assert torch.equal(ops.dequantize("Q8_0", raw, n, k, torch.bfloat16), got.bfloat16())


def test_q8_0_rows_are_bit_identical_alone_batched_and_at_any_thread_count(lib):
    n, k = 75, 256
    raw = as_raw(gguf_blocks("Q8_0", n=n, k=k, seed=3))
    x = rand_x(16, k, seed=4)
    alone = torch.cat([ops.mm("Q8_0", raw, n, k, x[i:i + 1]) for i in range(16)])
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for rows in (list(range(16)), [3], [5, 2], [15, 0, 7, 7, 2, 11], list(range(9))):
                assert torch.equal(ops.mm("Q8_0", raw, n, k, x[rows]), alone[rows]), (t, rows)
    finally:
        torch.set_num_threads(threads)


def test_the_plain_c_and_avx2_paths_give_this_machines_bits(lib, other_isa_lib):
    w, x = f16_weight(37, 301), rand_x(6, 301, seed=8)  # 301: a 13-lane tail
    assert torch.equal(mm_f16(w, x, other_isa_lib), mm_f16(w, x))
    raw = as_raw(gguf_blocks("Q8_0", n=37, k=320, seed=9))
    x = rand_x(6, 320, seed=10)
    assert torch.equal(ops.mm("Q8_0", raw, 37, 320, x, lib=other_isa_lib), ops.mm("Q8_0", raw, 37, 320, x))
