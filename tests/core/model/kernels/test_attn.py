"""The decode-attention kernel (csrc/attn.c): every row of a decode step in one call, each
over its own keys, as scaled_dot_product_attention computes it, bit for bit the same alone
or batched and whatever the thread count (issue 23: serve's batch-invariant step)."""
import pytest
import torch
import torch.nn.functional as F

from core.model.args import ModelArgs
from core.model.kernels import ops
from core.model.kv_cache import KVCache
from core.model.transformer import Transformer


def cache_rows(B, Hkv, C, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # two spare rows, so k and v are strided views of a bigger cache as the model passes them
    k = (torch.randn(B + 2, Hkv, C, D, generator=g) * 2).to(dtype)
    v = torch.randn(B + 2, Hkv, C, D, generator=g).to(dtype)
    return k, v


def reference(q, k, v, n):
    """One row's attention in float64 over its first n keys (heads repeated for GQA)."""
    rep = q.shape[1] // k.shape[1]
    kk = k[:, :, :n].double().repeat_interleave(rep, 1)
    vv = v[:, :, :n].double().repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q.double(), kk, vv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,H,Hkv,D,C", [(5, 8, 4, 8, 40), (3, 6, 2, 12, 70), (2, 4, 4, 64, 300), (3, 8, 1, 128, 37),
                                         (2, 4, 2, 16, 1100), (2, 4, 2, 32, 20), (2, 2, 1, 264, 19)])
def test_each_row_matches_float64_attention_and_is_the_same_bits_alone(lib, dtype, B, H, Hkv, D, C):
    k, v = cache_rows(B, Hkv, C, D, dtype)
    q = (torch.randn(B, H, 1, D, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    lengths = [1 + (7 * r + 3) % C for r in range(B)]
    L = max(lengths)
    out = ops.attn_decode(q, k[:B, :, :L], v[:B, :, :L], lengths, lib)
    assert out.shape == (B, 1, H * D) and out.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 1e-2  # the output's own rounding in 16 bits
    for r, n in enumerate(lengths):
        want = reference(q[r:r + 1], k[r:r + 1], v[r:r + 1], n).transpose(1, 2).reshape(1, 1, H * D)
        assert (out[r:r + 1].double() - want).abs().max() < tol
        alone = ops.attn_decode(q[r:r + 1], k[r:r + 1, :, :n], v[r:r + 1, :, :n], [n], lib)
        assert torch.equal(alone, out[r:r + 1])  # whatever else shares the call


@pytest.mark.parametrize("dtype,H,Hkv,D,C", [(torch.float32, 8, 4, 64, 600), (torch.bfloat16, 8, 4, 8, 2000),
                                             (torch.float16, 8, 8, 128, 600)])
def test_a_row_is_the_same_bits_on_one_thread_and_on_two(lib, dtype, H, Hkv, D, C):
    k, v = cache_rows(16, Hkv, C, D, dtype)
    q = torch.randn(16, H, 1, D, generator=torch.Generator().manual_seed(2))
    lengths = [C - 13 * r for r in range(16)]  # enough work that two threads split it
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.attn_decode(q, k[:16], v[:16], lengths, lib)
        torch.set_num_threads(2)
        two = ops.attn_decode(q, k[:16], v[:16], lengths, lib)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    last = ops.attn_decode(q[15:], k[15:16], v[15:16], lengths[15:], lib)
    assert torch.equal(last, one[15:])  # the row alone: no other row's work or thread count in it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_plain_c_and_avx2_builds_give_this_machines_bits(lib, other_isa_lib, dtype):
    """One order of operations on every path: the SIMD transposes and widening move data only."""
    for B, H, Hkv, D, C in [(3, 8, 4, 8, 45), (2, 4, 1, 64, 33), (2, 6, 3, 12, 20), (2, 4, 4, 16, 17)]:
        k, v = cache_rows(B, Hkv, C, D, dtype, seed=D)
        q = torch.randn(B, H, 1, D, generator=torch.Generator().manual_seed(4))
        lengths = [C - 3 * r for r in range(B)]
        want = ops.attn_decode(q, k[:B], v[:B], lengths, lib)
        assert torch.equal(ops.attn_decode(q, k[:B], v[:B], lengths, other_isa_lib), want)


def test_shapes_and_lengths_that_do_not_fit_are_refused(lib):
    k, v = cache_rows(2, 2, 10, 8, torch.float32)
    q = torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError):
        ops.attn_decode(q, k[:2], v[:2], [3, 11], lib)  # past the keys held
    with pytest.raises(ValueError):
        ops.attn_decode(q, k[:2], v[:2], [0, 3], lib)  # no key at all
    with pytest.raises(ValueError):
        ops.attn_decode(torch.zeros(2, 3, 1, 8), k[:2], v[:2], [3, 3], lib)  # 3 heads over 2 kv heads
    with pytest.raises(ValueError):
        ops.attn_decode(q, k[:2], v[:2].double(), [3, 3], lib)


def test_the_invariant_decode_step_runs_one_kernel_call_per_layer_and_no_sdpa(lib, monkeypatch):
    torch.manual_seed(0)
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64)
    model = Transformer(args).eval()
    model.fused = False  # the torch path's step (a model this small otherwise runs in C)
    cache = KVCache.for_model(model, batch=3, capacity=32)
    with torch.inference_mode():
        for r, n in enumerate((5, 9, 2)):
            model(torch.randint(0, 64, (1, n)), 0, cache.row(r))
        calls = []
        real = ops.attn_decode
        monkeypatch.setattr(ops, "attn_decode", lambda *a: calls.append(1) or real(*a))
        monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: pytest.fail("SDPA ran"))
        x, pos = torch.tensor([[1], [2], [3]]), torch.tensor([5, 9, 2])
        got = model(x, pos, cache, last_only=True)
        assert len(calls) == args.n_layers
        monkeypatch.undo()
        # the per-row SDPA path (no compiled kernels) agrees within float rounding
        monkeypatch.setattr(ops, "kernels", lambda tick=None: None)
        want = model(x, pos, cache, last_only=True)
    assert (got - want).abs().max() < 1e-4


def test_silu_mul_matches_float64_and_gives_an_element_the_same_bits_anywhere(lib):
    g = torch.Generator().manual_seed(3)
    a = torch.cat([torch.randn(5, 172, generator=g) * 6, torch.tensor([[-100.0, -88.0, 0.0, 90.0] * 43])])
    b = torch.randn(6, 172, generator=g)
    out = ops.silu_mul(a, b, lib)
    want = F.silu(a.double()) * b.double()
    assert ((out.double() - want).abs() <= 1e-6 * (1 + want.abs())).all()
    for r in range(6):  # a row alone: torch's own silu differs here for the last rows
        assert torch.equal(ops.silu_mul(a[r:r + 1].clone(), b[r:r + 1].clone(), lib), out[r:r + 1])
    bf = ops.silu_mul(a.bfloat16(), b.bfloat16(), lib)
    assert bf.dtype == torch.bfloat16 and (bf.double() - want).abs().max() < 0.05 * want.abs().max()
