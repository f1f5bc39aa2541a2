"""Our Transformer against transformers' LlamaForCausalLM on tiny random checkpoints."""
import pytest
import torch

from core.model.kv_cache import KVCache
from tests.helpers import greedy, hf_greedy, meta_from_hf, tiny_hf
import core.model.transformer as model_mod
from core.model.transformer import Linear, SMALL_BATCH, Transformer
from core.model.args import ModelArgs

CONFIGS = {
    "mha": {},
    "gqa2": dict(num_key_value_heads=2),
    "gqa4_8heads": dict(num_attention_heads=8, num_key_value_heads=2),
    "mqa": dict(num_key_value_heads=1),
    "theta500k": dict(rope_theta=500000.0),
    "llama31_scaled": dict(rope_theta=500000.0, max_position_embeddings=2048,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "tied": dict(tie_word_embeddings=True),
    "head_dim32": dict(head_dim=32, num_attention_heads=4, num_key_value_heads=2),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(name):
    hf = tiny_hf(**CONFIGS[name])
    ours = meta_from_hf(hf)
    # Long enough for the scaled-RoPE config: positions past the 64-token original context.
    T = 300 if name == "llama31_scaled" else 40
    ids = torch.randint(0, 96, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits.float()
        got = ours(ids)
    assert got.shape == ref.shape
    torch.testing.assert_close(torch.log_softmax(got, -1), torch.log_softmax(ref, -1), atol=1e-4, rtol=0)


@pytest.mark.parametrize("fused", [True, False], ids=["C", "torch"])
@pytest.mark.parametrize("name", ["mha", "gqa2", "theta500k", "llama31_scaled", "tied"])
def test_greedy_ids_and_logprobs_match_transformers(name, fused):
    hf = tiny_hf(**CONFIGS[name])
    ours = meta_from_hf(hf)
    ours.fused = fused  # a model this small runs its cached forward in C (core.model.fused)
    prompt = [1] + [5 + (i * 7) % 90 for i in range(120 if name == "llama31_scaled" else 12)]
    ref_ids, ref_lp = hf_greedy(hf, prompt, 24)
    got_ids, got_lp = greedy(ours, prompt, 24)
    assert got_ids == ref_ids
    torch.testing.assert_close(got_lp, ref_lp, atol=1e-4, rtol=0)


def test_scaled_rope_changes_long_range_logits():
    """Guards the test above: scaling must matter at these lengths, or it proves nothing."""
    cfg = CONFIGS["llama31_scaled"]
    hf = tiny_hf(**cfg)
    plain = tiny_hf(**{**cfg, "rope_scaling": None})
    ids = torch.randint(0, 96, (1, 300), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = meta_from_hf(hf)(ids), meta_from_hf(plain)(ids)
    assert (a[0, -1] - b[0, -1]).abs().max() > 1e-2


@pytest.mark.parametrize("fused", [True, False], ids=["C", "torch"])
def test_cached_decode_equals_full_forward(fused):
    model = meta_from_hf(tiny_hf(num_key_value_heads=2))
    model.fused = fused
    ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache.for_model(model, capacity=30)
        steps = [model(ids[:, :10], 0, cache)]
        steps += [model(ids[:, i:i + 1], i, cache) for i in range(10, 22)]
        steps.append(model(ids[:, 22:], 22, cache))  # a chunk after a cached prefix
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fused", [True, False], ids=["C", "torch"])
def test_batched_prefill_equals_token_by_token(fused):
    model = meta_from_hf(tiny_hf())
    model.fused = fused
    ids = torch.randint(0, 96, (1, 25), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = KVCache.for_model(model, capacity=25)
        one_by_one = torch.cat([model(ids[:, i:i + 1], i, cache) for i in range(25)], 1)
        batched = model(ids, 0, KVCache.for_model(model, capacity=25))
    torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=0)


def test_rows_at_different_positions_match_each_alone():
    """Batched prompts of different lengths: per-row positions and masks."""
    model = meta_from_hf(tiny_hf(num_key_value_heads=2))
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (7, 19, 12)]
    with torch.no_grad():
        cache = KVCache.for_model(model, batch=3, capacity=40)
        last = []
        for r, p in enumerate(prompts):
            last.append(model(torch.tensor([p]), 0, cache.row(r), last_only=True)[0, -1])
        nxt = torch.tensor([[int(l.argmax())] for l in last])
        pos = torch.tensor([len(p) for p in prompts])
        batched = model(nxt, pos, cache)[:, -1]
        for r, p in enumerate(prompts):
            alone = model(torch.tensor([p + [int(nxt[r])]]))[0, -1]
            torch.testing.assert_close(batched[r], alone, atol=1e-5, rtol=0)


def test_kv_cache_in_model_dtype_and_sized_by_request():
    model = meta_from_hf(tiny_hf()).to(torch.bfloat16)
    cache = KVCache.for_model(model, capacity=10)
    assert cache.k[0].dtype == torch.bfloat16
    assert cache.capacity < 1024  # not max_seq_len up front
    cache.ensure(1, 300)
    assert cache.capacity >= 300


def test_small_batch_weight_first_matmul_equals_linear():
    """Linear takes W @ x.T for 2-16 rows of a large weight (faster on CPU BLAS): same numbers."""
    torch.manual_seed(0)
    lin = Linear(512, 1024)  # above the size where the weight-first path kicks in
    lin.weight.data.normal_(0, 0.05)
    for rows in (1, 2, 4, SMALL_BATCH, SMALL_BATCH + 1):
        x = torch.randn(rows, 1, 512)
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight), atol=1e-5, rtol=1e-5)
    # And through a whole model: 4 decode rows at once equal each row decoded alone.
    m = Transformer(ModelArgs(dim=512, n_layers=2, n_heads=8, n_kv_heads=2, vocab_size=600, hidden_dim=1024)).eval()
    ids = torch.randint(0, 600, (4, 6))
    with torch.no_grad():
        cache = KVCache.for_model(m, batch=4, capacity=8)
        m(ids[:, :5], 0, cache)
        together = m(ids[:, 5:], 5, cache)[:, -1]
        for r in range(4):
            alone = m(ids[r:r + 1])[0, -1]
            torch.testing.assert_close(together[r], alone, atol=1e-4, rtol=0)


@pytest.mark.parametrize("native_gqa", [True, False])
def test_gqa_with_and_without_enable_gqa_matches_transformers(monkeypatch, native_gqa):
    """K/V heads shared through SDPA's enable_gqa, or repeated where torch lacks it: causal
    prefill, a chunk after a cached prefix (bool mask) and rows at different positions."""
    if native_gqa:
        assert model_mod._sdpa_has_gqa()  # torch 2.5+: the path users get
    monkeypatch.setattr(model_mod, "_GQA", native_gqa)
    hf = tiny_hf(num_attention_heads=8, num_key_value_heads=2)
    ours = meta_from_hf(hf)
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = torch.log_softmax(hf(ids).logits.float(), -1)
        cache = KVCache.for_model(ours, batch=2, capacity=24)
        got = torch.cat([ours(ids[:, :9], 0, cache), ours(ids[:, 9:], 9, cache)], 1)
        torch.testing.assert_close(torch.log_softmax(got, -1), ref, atol=1e-4, rtol=0)
        # Row 1 three positions behind row 0: per-row positions take the bool-mask path.
        cache = KVCache.for_model(ours, batch=2, capacity=24)
        ours(ids[:1, :20], 0, cache.row(0))
        ours(ids[1:, :17], 0, cache.row(1))
        step = ours(torch.stack([ids[0, 20:21], ids[1, 17:18]]), torch.tensor([20, 17]), cache)[:, -1]
        torch.testing.assert_close(torch.log_softmax(step, -1), torch.stack([ref[0, 20], ref[1, 17]]),
                                   atol=1e-4, rtol=0)


def test_rope_rotation_is_the_pairwise_rotation_bit_for_bit():
    # apply_rope multiplies by precomputed (cos, cos) / (-sin, sin) rows in 4 ops; it must
    # give exactly the pairwise x0*cos - x1*sin, x0*sin + x1*cos it replaced.
    from torch.utils._python_dispatch import TorchDispatchMode
    args = ModelArgs(dim=64, n_layers=1, n_heads=4, vocab_size=32, rope_theta=500000.0)
    table = model_mod.rope_table(args, 300)  # [L, D/2, 2]
    torch.manual_seed(0)
    pos = torch.tensor([[0, 7, 299], [3, 150, 201]])
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(2, 3, 4, 16) * 3).to(dtype)
        cos, sin = table[pos][..., 0].unsqueeze(2), table[pos][..., 1].unsqueeze(2)
        xf = x.float()
        x0, x1 = xf[..., 0::2], xf[..., 1::2]
        want = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2).to(dtype)

        class Count(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, a=(), kw=None):
                Count.n += 1
                return func(*a, **(kw or {}))

        rope = model_mod.rotation_table(table)[pos]
        with Count():
            got = model_mod.apply_rope(x, rope)
        assert torch.equal(got, want)
        assert Count.n <= 8 + 2 * (dtype != torch.float32)  # the pairwise form ran 16 (18)


def test_a_batch_invariant_decode_step_costs_few_torch_calls_per_layer():
    # A small model's decode step (serve's scheduler thread) is bound by the number of torch
    # calls, not arithmetic: 8 rows at 8 positions cost 150 calls a layer with one
    # attention call per row; with the compiled kernel one, and per-step tables, ~54.
    from torch.utils._python_dispatch import TorchDispatchMode
    from core.model.kernels import ops

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            Count.n += 1
            return func(*a, **(kw or {}))

    if ops.kernels() is None:
        pytest.skip("no compiled kernels here: attention runs row by row")
    counts = []
    for layers in (1, 2):
        torch.manual_seed(0)
        model = Transformer(ModelArgs(dim=64, n_layers=layers, n_heads=4, n_kv_heads=2, vocab_size=64,
                                      max_seq_len=64)).eval()
        model.fused = False  # the torch path's step (bigger models'; this one otherwise runs in C)
        cache = KVCache.for_model(model, batch=8, capacity=32)
        with torch.inference_mode():
            for r in range(8):
                model(torch.randint(0, 64, (1, 2 + r)), 0, cache.row(r))
            x, pos = torch.randint(0, 64, (8, 1)), torch.arange(2, 10)
            Count.n = 0
            with Count():
                model(x, pos, cache, last_only=True)
        counts.append(Count.n)
    assert counts[1] - counts[0] <= 60


@pytest.mark.parametrize("kernels", [True, False])
def test_decode_rows_are_the_same_bits_alone_and_batched_at_a_width_not_a_multiple_of_32(kernels, monkeypatch):
    # stories260K's FFN is 172 wide: torch's silu ran the last elements of a step's buffer on
    # its scalar path, so the last row of 5, 7 or 13 got other bits than alone (issue 23.12).
    from core.model.kernels import ops
    if not kernels:
        monkeypatch.setattr(ops, "kernels", lambda tick=None: None)
    elif ops.kernels() is None:
        pytest.skip("no compiled kernels here")
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, hidden_dim=172,
                                  max_seq_len=64)).eval()
    model.fused = False  # the torch path with act.c's silu (core.model.fused's C forward: test_layer.py)
    prompts = [torch.randint(0, 64, (1, 2 + r % 5)) for r in range(7)]
    x = torch.randint(0, 64, (7, 1))
    pos = torch.tensor([p.shape[1] for p in prompts])
    with torch.inference_mode():
        alone = []
        for r in range(7):
            cache = KVCache.for_model(model, batch=1, capacity=16)
            model(prompts[r], 0, cache.row(0))
            alone.append(model(x[r:r + 1], pos[r:r + 1], cache, last_only=True))
        for B in (5, 7):
            cache = KVCache.for_model(model, batch=B, capacity=16)
            for r in range(B):
                model(prompts[r], 0, cache.row(r))
            together = model(x[:B], pos[:B], cache, last_only=True)
            assert all(torch.equal(together[r:r + 1], alone[r]) for r in range(B)), f"{B} rows"
