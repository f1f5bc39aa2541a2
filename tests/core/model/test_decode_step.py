"""The decode step on a static KV cache (fixed shapes, what CUDA graphs capture) and the
compiled paths, against transformers' LlamaForCausalLM on the tiny model's twin.

The static step runs eagerly here in most tests (its shapes and mask logic are what the
GPU captures); one test traces it with ``fullgraph=True`` (no graph break: nothing in it
reads the host), and inductor itself compiles in two tests marked slow (a minute or more
on a 2-core CPU). The CUDA-graph capture itself is tested in tests/core/test_cuda.py.
"""
import time

import pytest
import torch

from core.checkpoints import load
from core.model.decode_step import DecodeStep, static_step
from core.engine.engine import Engine
from core.engine.events import Done, Prefilled
from core.model.kv_cache import KVCache, static_capacity
from core.engine.settings import SamplingParams
from tests.helpers import TINY_META, hf_greedy, tiny_hf

# Logits of the static step (attention over every slot, masked) against transformers'
# full forward, both float32: they differ only in summation order.
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def lm(tiny_meta_dir):
    return load(tiny_meta_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def hf():
    return tiny_hf(**TINY_META)  # the same weights as lm (tiny_meta_dir is built from it)


def _compile_available() -> str | None:
    """Why torch.compile cannot run here, or None."""
    try:
        import torch._dynamo  # noqa: F401
    except Exception as e:  # a build without dynamo
        return f"torch.compile unavailable: {type(e).__name__}: {e}"
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python/platform"
    return None


def _needs_compile():
    why = _compile_available()
    if why:
        pytest.skip(why)
    torch._dynamo.reset()


def lanes_of(engine, prompt, n_lanes, n_new):
    evs = list(engine.generate_lanes(prompt, [SamplingParams(temperature=0, max_new_tokens=n_new)] * n_lanes))
    return [e for e in evs if isinstance(e, Prefilled)][0], sorted((e for e in evs if isinstance(e, Done)),
                                                                   key=lambda d: d.lane)


def assert_matches_hf(hf, prompt, done: Done, n_new, atol=LOGPROB_ATOL):
    ref_ids, ref_lps = hf_greedy(hf, prompt, n_new)
    assert done.tokens == ref_ids
    torch.testing.assert_close(torch.tensor(done.logprobs), ref_lps, atol=atol, rtol=0)


def two_turns(engine, lm, hf, n_new=10, atol=LOGPROB_ATOL):
    """A chat of two turns with 2 greedy lanes each; every lane equals transformers (on
    the CPU, float32). Returns the Done events, turn 1's lanes first."""
    tok = lm.tokenizer
    p1 = tok.encode("Once upon a time there was", bos=True)
    pre, done = lanes_of(engine, p1, 2, n_new)
    for d in done:
        assert_matches_hf(hf, p1, d, n_new, atol)
    p2 = p1 + done[0].tokens + tok.encode(" and then the dragon said")
    pre, done2 = lanes_of(engine, p2, 2, n_new)
    assert pre.cached_tokens >= len(p1)  # the second turn reused the first from the cache
    for d in done2:
        assert_matches_hf(hf, p2, d, n_new, atol)
    return done + done2


def test_static_capacity_is_a_power_of_two_within_the_context():
    assert [static_capacity(n, 4096) for n in (1, 256, 257, 600, 4096)] == [256, 256, 512, 1024, 4096]
    assert static_capacity(5000, 3000) == 3072  # never past the context (rounded to a growth step)


def test_static_step_matches_transformers_over_two_turns_with_two_lanes(lm, hf):
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), static=True)
    two_turns(eng, lm, hf)
    assert eng.compile_status == "eager: compile is off (static cache)"
    assert eng.cache.capacity == 256 and eng.cache.static_addresses


def test_static_step_keeps_rows_at_different_positions_apart(lm, hf):
    """Rows of one batch at different positions (different prompts): each row's mask
    hides the slots the longer row wrote past its own end."""
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), static=True)
    prompts = [lm.tokenizer.encode("Hi", bos=True), lm.tokenizer.encode("The cat sat on the mat and", bos=True)]
    assert len(prompts[0]) != len(prompts[1])
    done = sorted((e for e in eng.generate_batch(prompts, SamplingParams(temperature=0, max_new_tokens=8))
                   if isinstance(e, Done)), key=lambda d: d.lane)
    for p, d in zip(prompts, done):
        assert_matches_hf(hf, p, d, 8)


def test_static_cache_outgrown_mid_reply_regrows_and_stays_right(lm, hf):
    """A reply that runs past the static capacity (256) moves to the next size (512):
    new tensors, still marked static (CUDA graphs re-record for them), same tokens."""
    g = torch.Generator().manual_seed(5)
    prompt = [1] + [int(t) for t in torch.randint(100, 31000, (240,), generator=g)]
    step = DecodeStep(lm.model, static=True)
    cache = KVCache.for_model(lm.model, capacity=256)
    ids, lps, capacities = [], [], []
    with torch.inference_mode():
        logits = lm.model(torch.tensor([prompt]), 0, cache.row(0), last_only=True)[0, -1]
        pos = len(prompt)
        for _ in range(30):  # positions 241..270: past 256
            t = int(logits.argmax())
            ids.append(t)
            lps.append(float(torch.log_softmax(logits, -1)[t]))
            cache.ensure(1, static_capacity(pos + 1, 4096))  # as the engine does
            capacities.append(cache.capacity)
            logits = step(torch.tensor([[t]]), pos, cache)[0, -1]
            pos += 1
    assert capacities[0] == 256 and capacities[-1] == 512
    assert all(getattr(t, "_dynamo_static_input_type", None) for t in cache.k + cache.v)  # the new tensors too
    ref_ids, ref_lps = hf_greedy(hf, prompt, 30)
    assert ids == ref_ids
    torch.testing.assert_close(torch.tensor(lps), ref_lps, atol=LOGPROB_ATOL, rtol=0)


def test_engine_static_reply_crossing_the_capacity_matches_transformers(lm, hf):
    g = torch.Generator().manual_seed(6)
    prompt = [1] + [int(t) for t in torch.randint(100, 31000, (230,), generator=g)]
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), static=True, max_context=300)
    _, (done,) = lanes_of(eng, prompt, 1, 40)  # 231 + 40 positions: the cache is sized 512 at once
    assert eng.cache.capacity == static_capacity(271, 300) == 512
    assert_matches_hf(hf, prompt, done, 40)


def test_static_step_traces_as_one_graph_without_host_reads(lm):
    """fullgraph=True fails on any graph break, such as reading a tensor's value on the
    host: the captured step has none (CUDA graphs need that)."""
    _needs_compile()
    cache = KVCache.for_model(lm.model, batch=2, capacity=256)
    cache.mark_static()
    lm.model.rope(256)
    fn = torch.compile(static_step, backend="eager", fullgraph=True, dynamic=False)
    x = torch.tensor([[5], [7]])
    pos = torch.tensor([3, 9])
    with torch.inference_mode():
        got = fn(lm.model, x, pos, cache.k, cache.v)
        cache2 = KVCache.for_model(lm.model, batch=2, capacity=256)
        want = static_step(lm.model, x, pos, cache2.k, cache2.v)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cache.k[1], cache2.k[1])  # it wrote the same keys where eager did


def test_compiled_static_step_through_dynamo_matches_transformers(lm, hf):
    """The engine's static path through torch.compile (dynamo's "eager" backend: the
    capture without inductor's minutes of C++ compiling) over two turns with two lanes."""
    _needs_compile()
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), compile="eager", static=True)
    two_turns(eng, lm, hf)
    assert eng.compile_status == "compiled (eager, static cache)"


def test_a_failing_backend_falls_back_to_eager_once_and_the_reply_is_right(lm, hf):
    _needs_compile()
    calls = []

    def broken_backend(gm, example_inputs):
        calls.append(1)
        raise RuntimeError("no C++ compiler here")

    for static in (True, False):
        calls.clear()
        eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), compile=broken_backend, static=static)
        done = two_turns(eng, lm, hf, n_new=6)
        assert len(done) == 4
        assert calls == [1]  # tried once; every later step went straight to eager
        assert eng.compile_status.startswith("eager: compiling failed") and "C++" in eng.compile_status


def test_compile_time_is_kept_out_of_the_decode_speed(lm, hf):
    """A step that compiles is warm-up: its seconds go to stats.warmup_s, not decode_s
    (so decode tok/s is not the compiler's), and the tokens are the reference's."""
    _needs_compile()

    def slow_backend(gm, example_inputs):
        time.sleep(0.5)  # a compiler that takes its time
        return gm.forward

    eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), compile=slow_backend, static=True)
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    t0 = time.perf_counter()
    _, (done,) = lanes_of(eng, prompt, 1, 6)
    elapsed = time.perf_counter() - t0
    assert_matches_hf(hf, prompt, done, 6)
    st = done.stats
    assert st.warmup_s >= 0.5 and st.to_dict()["warmup_s"] == st.warmup_s
    # Counted once, in warmup_s: with it in decode_s as well the parts would exceed the whole.
    assert st.prefill_s + st.decode_s + st.warmup_s <= elapsed
    assert eng.compile_status == "compiled (slow_backend, static cache)"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_inductor_on_cpu_matches_transformers(lm, hf, static):
    """Inductor itself (C++ kernels; a minute or more to compile on a small CPU): the
    CPU's default --compile path (dynamic shapes) and the static-cache step."""
    _needs_compile()
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set(), compile=True, static=static)
    two_turns(eng, lm, hf, n_new=6)  # right tokens whether it compiled or fell back
    if eng.compile_status.startswith("eager: compiling failed"):
        pytest.skip(f"inductor cannot compile here: {eng.compile_status}")
    assert eng.compile_status == ("compiled (inductor, static cache)" if static else "compiled (inductor)")
