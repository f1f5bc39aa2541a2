"""Batch invariance: a seeded request's tokens do not depend on which other requests (or
comparison lanes) share its decode steps, in float32 and bfloat16 (docs/SERVING.md)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.checkpoints import load
from core.engine.engine import Engine, Joining
from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.model.kernels import ops as kernel_ops

DEMO = Path(__file__).resolve().parents[3] / "assets" / "models" / "llamadesk-demo"
WORDS = "cat dog sun moon tree ship king bird rain fox".split()


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def demo(request):
    lm = load(DEMO, device="cpu", dtype=request.param)
    return lm, Engine(lm.model, lm.tokenizer, stop_ids=sorted(lm.stop_ids))


def requests(lm, n: int) -> list[tuple[list[int], SamplingParams]]:
    """n different prompts (different lengths, so rows sit at different positions), seeded."""
    out = []
    for i in range(n):
        text = " ".join(WORDS[j % len(WORDS)] for j in range(i, i + 1 + i % 4))
        prompt = lm.tokenizer.encode(f"A story about {text}.", bos=True)
        out.append((prompt, SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_new_tokens=6)))
    return out


def serve_together(engine, reqs) -> list[tuple]:
    """All of reqs decoded side by side through the serving loop: (tokens, log-probs) per
    request. Equal log-probs mean bit-identical logits, which tokens alone would not show."""
    engine.cache.reset()  # no request reuses a prefix another run left behind
    pending = [Joining(p, [q]) for p, q in reqs]

    def admit(free, _next):
        nonlocal pending
        now, pending = pending[:free], pending[free:]
        return [Joining(j.prompt, engine.check_request(j.prompt, j.lanes)) for j in now]

    done = sorted((e for e in engine.serve(admit, max_rows=16) if isinstance(e, Done)), key=lambda d: d.lane)
    return [(d.tokens, d.logprobs) for d in done]


def test_twenty_seeded_requests_alone_and_in_batches_of_2_to_16_give_the_same_tokens(demo):
    lm, engine = demo
    assert lm.model.invariant  # the default
    reqs = requests(lm, 20)
    alone = [serve_together(engine, [r])[0] for r in reqs]
    assert len({tuple(t) for t, _ in alone}) > 10  # seeded sampling, not one fixed reply
    for size in (2, 5, 16):  # 16 rows: a serve batch at --max-batch 16
        together = []
        for at in range(0, len(reqs), size):
            together += serve_together(engine, reqs[at:at + size])
        assert together == alone, f"batches of {size}"


def test_four_comparison_lanes_equal_each_lane_alone(demo):
    """A lane alone is a comparison of one lane (a lone chat reply takes the fast one-row
    path instead: nothing shares its steps, see the next test)."""
    lm, engine = demo
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    lanes = [SamplingParams(temperature=t, seed=7 + i, max_new_tokens=8) for i, t in enumerate((0, 0.7, 1.0, 1.3))]
    engine.cache.reset()
    done = sorted((e for e in engine.generate_lanes(prompt, lanes) if isinstance(e, Done)), key=lambda d: d.lane)
    for lane, d in zip(lanes, done):
        engine.cache.reset()
        alone = [e for e in engine.generate_lanes(prompt, [lane]) if isinstance(e, Done)][0]
        assert (alone.tokens, alone.logprobs) == (d.tokens, d.logprobs)


def test_a_lone_reply_takes_the_fast_path_and_serve_the_invariant_one(demo):
    lm, engine = demo
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    seen = []
    forward = lm.model.forward

    def spy(*a, **k):
        seen.append(lm.model.invariant)
        return forward(*a, **k)
    lm.model.forward = spy
    try:
        list(engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=3)))
        assert seen and not any(seen)
        seen.clear()
        list(engine.generate_lanes(prompt, [SamplingParams(temperature=0, max_new_tokens=3)]))
        assert seen and all(seen)
        seen.clear()
        serve_together(engine, requests(lm, 1))
        assert seen and all(seen)
    finally:
        del lm.model.forward


def test_without_invariance_a_batch_changes_a_request(demo):
    """The tests above can fail: the fast paths (matrix-vector for one row, masked attention
    over the longest row) round a row differently once it shares its step."""
    lm, engine = demo
    reqs = requests(lm, 5)
    engine.batch_invariant = False
    lm.model.fused = False  # (the demo model's forward in C is invariant whatever: below)
    try:
        alone = [serve_together(engine, [r])[0] for r in reqs]
        assert serve_together(engine, reqs) != alone
    finally:
        engine.batch_invariant = True
        lm.model.fused = True


def test_a_small_float32_model_in_c_is_invariant_without_the_invariant_path(demo):
    """core.model.fused: every product one FMA chain per output, so no padding or per-row
    attention is needed for a batch to leave a request's bits alone."""
    lm, engine = demo
    if lm.model.tok_embeddings.weight.dtype != torch.float32 or kernel_ops.kernels() is None:
        pytest.skip("the C forward runs float32 models, with the kernels built")
    reqs = requests(lm, 5)
    engine.batch_invariant = False
    try:
        alone = [serve_together(engine, [r])[0] for r in reqs]
        assert serve_together(engine, reqs) == alone
        assert lm.model.__dict__["_fused_plan"].plan is not None  # it ran in C
    finally:
        engine.batch_invariant = True
