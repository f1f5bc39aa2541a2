"""F16 products (csrc/q8_f16.c) against float64 references, bit-for-bit invariance over
batch mixes and thread counts, NaN/inf."""
import pytest
import torch

from core.model.kernels import ops


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
