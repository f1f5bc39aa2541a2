"""A small float32 model's forward over a KV cache in one C call (csrc/layer.c,
core/model/fused.py): against transformers, float64 torch and the torch path; each row the
same bits alone or batched, on 1 or 2 threads, prefilled at once, in chunks or token by
token; and the rule that keeps other models on the torch path (issue 23)."""
import pytest
import torch
import torch.nn.functional as F

from core.model import fused
from core.model.kernels import ops as kernel_ops
from core.model.kv_cache import KVCache
from core.model.transformer import PLAIN_MODULES
from tests.helpers import meta_from_hf, tiny_hf

LLAMA31 = dict(rope_theta=500000.0, max_position_embeddings=2048,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
CONFIGS = {
    "mha": {},
    # stories260K's shape: 8 heads of 8 over 4 kv heads, a 172-wide feed-forward
    "gqa_hd8_172": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=4, intermediate_size=172),
    "hd64_mqa": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=200),
    "hd32_not_dim_over_heads": dict(head_dim=32, num_attention_heads=4, num_key_value_heads=2),
    "llama31_tied": dict(tie_word_embeddings=True, num_key_value_heads=2, **LLAMA31),
}
_models: dict = {}


def model_for(name):
    """(transformers model, ours) for a config, built once per module."""
    if name not in _models:
        hf = tiny_hf(**CONFIGS[name])
        _models[name] = (hf, meta_from_hf(hf).eval())
    return _models[name]


def ran_in_c(model) -> bool:
    plan = getattr(model.__dict__.get("_fused_plan"), "plan", None)
    return plan is not None


def run(model, ids, steps, c=True):
    """Logits of a prefill of ids [1, T] then greedy ``steps`` one token at a time."""
    model.fused = c
    try:
        cache = KVCache.for_model(model, capacity=ids.shape[1] + steps)
        with torch.no_grad():
            out = [model(ids, 0, cache)]
            pos = ids.shape[1]
            for _ in range(steps):
                out.append(model(out[-1][:, -1:].argmax(-1), pos, cache))
                pos += 1
    finally:
        model.fused = True
    return torch.cat(out, 1)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers_float64_and_the_torch_path(lib, name):
    hf, ours = model_for(name)
    T = 40 if name == "llama31_tied" else 12  # past the scaled config's 16-token original context
    ids = torch.randint(0, 96, (1, T), generator=torch.Generator().manual_seed(1))
    got = run(ours, ids, 6)
    assert ran_in_c(ours)
    full = torch.cat([ids, got[:, T - 1:-1].argmax(-1)], 1)  # the tokens the steps fed in
    with torch.no_grad():
        ref = hf(full).logits.float()
        ref64 = hf.double()(full).logits
        hf.float()
    assert (got - ref).abs().max() < 1e-4
    assert (got.double() - ref64).abs().max() < 2e-5
    torch_path = run(ours, ids, 6, c=False)
    assert (got - torch_path).abs().max() < 2e-5


def test_a_row_is_the_same_bits_alone_or_batched_at_mixed_positions(lib):
    _, model = model_for("gqa_hd8_172")
    g = torch.Generator().manual_seed(2)
    B = 16
    lengths = [3 + (5 * r) % 23 for r in range(B)]
    prompts = [torch.randint(0, 96, (1, n), generator=g) for n in lengths]
    nxt = torch.randint(0, 96, (B, 1), generator=g)
    cache = KVCache.for_model(model, batch=B, capacity=32)
    with torch.no_grad():
        for r, p in enumerate(prompts):
            model(p, 0, cache.row(r))
        pos = torch.tensor(lengths)
        alone = []
        for r in range(B):  # each row alone, in a cache of its own
            own = KVCache.for_model(model, capacity=32)
            model(prompts[r], 0, own)
            alone.append(model(nxt[r:r + 1], lengths[r], own))
        for n in (2, 3, 5, 16):
            batched = model(nxt[:n], pos[:n], cache)
            for r in range(n):
                assert torch.equal(batched[r:r + 1], alone[r])
    assert ran_in_c(model)


def test_a_batch_is_the_same_bits_on_one_thread_and_on_two(lib):
    _, model = model_for("hd64_mqa")
    ids = torch.randint(0, 96, (6, 100), generator=torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            cache = KVCache.for_model(model, batch=6, capacity=101)
            with torch.no_grad():  # enough work per product that two threads split it
                out.append(torch.cat([model(ids, 0, cache), model(ids[:, :1], 100, cache)], 1))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[0], out[1])


def test_a_prompt_prefilled_at_once_in_chunks_or_token_by_token_is_the_same_bits(lib):
    _, model = model_for("gqa_hd8_172")
    ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        once = model(ids, 0, KVCache.for_model(model, capacity=30))
        cache = KVCache.for_model(model, capacity=30)
        chunks = torch.cat([model(ids[:, a:b], a, cache) for a, b in ((0, 7), (7, 8), (8, 30))], 1)
        cache = KVCache.for_model(model, batch=3, capacity=30)
        by_token = torch.cat([model(ids[:, i:i + 1], i, cache.row(2)) for i in range(30)], 1)
    assert torch.equal(once, chunks) and torch.equal(once, by_token)


def test_a_verification_forward_of_several_rows_is_the_same_bits_as_token_by_token(lib):
    """Speculative verification: k+1 tokens of each row in one forward at per-row positions."""
    _, model = model_for("gqa_hd8_172")
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 96, (1, n), generator=g) for n in (4, 9)]
    drafted = torch.randint(0, 96, (2, 3), generator=g)
    with torch.no_grad():
        cache = KVCache.for_model(model, batch=2, capacity=16)
        for r, p in enumerate(prompts):
            model(p, 0, cache.row(r))
        together = model(drafted, torch.tensor([4, 9]), cache)
        for r, p in enumerate(prompts):
            own = KVCache.for_model(model, capacity=16)
            model(p, 0, own)
            steps = [model(drafted[r:r + 1, i:i + 1], p.shape[1] + i, own) for i in range(3)]
            assert torch.equal(torch.cat(steps, 1), together[r:r + 1])


def test_a_tensor_of_positions_and_last_only_match_the_int_form(lib):
    _, model = model_for("mha")
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a = model(ids, 0, KVCache.for_model(model, batch=2, capacity=16))
        b = model(ids, torch.tensor([0, 0]), KVCache.for_model(model, batch=2, capacity=16), last_only=True)
    assert b.shape == (2, 1, 96) and torch.equal(a[:, -1:], b)


def test_weights_written_in_place_are_seen(lib):
    hf = tiny_hf(**CONFIGS["mha"])
    model = meta_from_hf(hf).eval()
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = model(ids, 0, KVCache.for_model(model, capacity=8))
        model.layers[1].feed_forward.w2.weight.mul_(3.0)
        after = model(ids, 0, KVCache.for_model(model, capacity=8))
        model.fused = False
        want = model(ids, 0, KVCache.for_model(model, capacity=8))
    assert (after - before).abs().max() > 1e-2 and (after - want).abs().max() < 2e-5


def test_bad_tokens_and_positions_raise(lib):
    _, model = model_for("mha")
    cache = KVCache.for_model(model, capacity=8)
    with torch.no_grad(), pytest.raises(IndexError):
        model(torch.tensor([[96]]), 0, cache)
    with torch.no_grad(), pytest.raises(IndexError):
        model(torch.tensor([[1, 2]]), 255, cache)  # past the cache's 256 positions
    with torch.no_grad(), pytest.raises(IndexError):
        model(torch.tensor([[1], [2]]), 0, cache)  # two rows in a one-row cache


def test_no_tokens_is_left_to_the_torch_path(lib):
    _, model = model_for("mha")
    empty = torch.zeros(1, 0, dtype=torch.long)
    cache = KVCache.for_model(model, capacity=4)
    with torch.no_grad():
        assert fused.forward(model, empty, 0, cache, True, PLAIN_MODULES) is None
        assert fused.forward(model, torch.tensor([[1]]), 0, cache, True, PLAIN_MODULES).shape == (1, 1, 96)


def calls(monkeypatch):
    """Counts the C forward's calls (through the Plan)."""
    seen = []
    real = fused.Plan.run
    monkeypatch.setattr(fused.Plan, "run", lambda self, *a: seen.append(1) or real(self, *a))
    return seen


def rule_model():
    return meta_from_hf(tiny_hf(**CONFIGS["mha"])).eval()


def forward(model, grad=False):
    with torch.set_grad_enabled(grad):
        return model(torch.tensor([[1, 2, 3]]), 0, KVCache.for_model(model, capacity=4))


def test_a_hooked_or_training_model_takes_the_torch_path(lib, monkeypatch):
    model = rule_model()
    seen = calls(monkeypatch)
    handle = model.layers[0].attention.wq.register_forward_hook(lambda *a: None)
    forward(model)  # attribution's hooks
    handle.remove()
    model.train()
    forward(model)
    model.eval()
    assert seen == []
    forward(model)
    assert seen == [1]


def test_a_model_over_the_size_limit_or_without_kernels_takes_the_torch_path(lib, monkeypatch):
    model = rule_model()
    seen = calls(monkeypatch)
    monkeypatch.setattr(fused, "MAX_PARAMS", 1000)
    forward(model)
    assert seen == []
    model = rule_model()
    monkeypatch.setattr(fused, "MAX_PARAMS", 10 ** 9)
    monkeypatch.setattr(kernel_ops, "kernels", lambda tick=None: None)
    forward(model)
    assert seen == []


def test_a_float64_model_or_one_that_wants_gradients_takes_the_torch_path(lib, monkeypatch):
    model = rule_model()
    seen = calls(monkeypatch)
    model.to(torch.float64)
    forward(model)
    assert seen == []
    model = rule_model().requires_grad_(True)
    forward(model, grad=True).sum().backward()
    assert seen == [] and model.output.weight.grad is not None
    model.requires_grad_(False)
    forward(model)
    assert seen == [1]


def test_kernels_turned_off_by_the_environment_take_the_torch_path(lib, monkeypatch, fresh_state):
    seen = calls(monkeypatch)
    for var in ("LLAMADESK_KERNELS", "LLAMADESK_FUSED"):
        with monkeypatch.context() as m:
            m.setenv(var, "0")
            forward(rule_model())
    assert seen == []


def test_the_other_isa_paths_match_the_torch_path_and_stay_invariant(other_isa_lib):
    _, model = model_for("gqa_hd8_172")
    plan = fused.Plan(model, other_isa_lib)
    ids = torch.randint(0, 96, (3, 11), generator=torch.Generator().manual_seed(7))
    cache = KVCache.for_model(model, batch=3, capacity=16)
    got = plan.run(ids, 0, cache, 0, False)
    model.fused = False
    try:
        with torch.no_grad():
            want = model(ids, 0, KVCache.for_model(model, batch=3, capacity=16))
    finally:
        model.fused = True
    assert (got - want).abs().max() < 2e-5
    alone = plan.run(ids[1:2], 0, KVCache.for_model(model, capacity=16), 0, False)
    assert torch.equal(alone, got[1:2])


def test_the_product_kernel_matches_float64(lib):
    g = torch.Generator().manual_seed(8)
    for m, k, n in ((1, 64, 172), (7, 172, 64), (5, 33, 1)):
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        wt, y = w.t().contiguous(), torch.empty(m, n)
        lib.ld_mm_f32(x.data_ptr(), m, k, wt.data_ptr(), n, y.data_ptr())
        assert (y.double() - F.linear(x.double(), w.double())).abs().max() < 1e-4


def test_a_copy_of_a_model_builds_its_own_plan(lib):
    import copy
    import pickle
    _, model = model_for("mha")
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        want = model(ids, 0, KVCache.for_model(model, capacity=4))
        for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert torch.equal(twin(ids, 0, KVCache.for_model(twin, capacity=4)), want)
            assert twin._fused_plan.plan.model() is twin


def test_an_unloaded_model_is_freed_without_a_garbage_collection(lib):
    import weakref
    model = meta_from_hf(tiny_hf(**CONFIGS["mha"])).eval()
    with torch.no_grad():
        model(torch.tensor([[1, 2]]), 0, KVCache.for_model(model, capacity=4))
    assert model._fused_plan.plan is not None
    gone = weakref.ref(model)
    del model
    assert gone() is None  # no reference cycle through its plan


def test_model_info_says_a_small_float32_model_runs_in_c(lib):
    from core import checkpoints
    from pathlib import Path
    demo = Path(__file__).resolve().parents[4] / "assets" / "models" / "llamadesk-demo"
    assert "whole forward in one C call" in checkpoints.load(demo, device="cpu", dtype="float32").info["kernels"]
    assert "C call" not in checkpoints.load(demo, device="cpu", dtype="bfloat16").info["kernels"]
