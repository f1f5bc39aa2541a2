"""Batch invariance on packed weights: the int4 and int8 kernels give a row the same
numbers alone and in a batch of any size (their row blocks of 4 included), so serve and
comparison lanes need no other kernel for packed models (docs/PERFORMANCE.md: lanes)."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.settings import SamplingParams

DEMO = Path(__file__).resolve().parents[3] / "assets" / "models" / "llamadesk-demo"


@pytest.fixture(scope="module", params=["int4", "int8"])
def packed(request):
    lm = load(DEMO, device="cpu", dtype=request.param)
    assert any(type(m).__name__ in ("Int4Linear", "Int8Linear") for m in lm.model.modules())
    return lm, Engine(lm.model, lm.tokenizer, stop_ids=sorted(lm.stop_ids))


def test_five_comparison_lanes_equal_each_lane_alone(packed):
    lm, engine = packed
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    # five rows: the kernels' row blocks of 4 and 1 (a dense path from 5 rows fails this)
    lanes = [SamplingParams(temperature=t, seed=3 + i, max_new_tokens=4) for i, t in enumerate((0, .7, 1, 1.2, 1.4))]
    engine.cache.reset()
    done = sorted((e for e in engine.generate_lanes(prompt, lanes) if isinstance(e, Done)), key=lambda d: d.lane)
    for lane, d in zip(lanes, done):
        engine.cache.reset()
        alone = next(e for e in engine.generate_lanes(prompt, [lane]) if isinstance(e, Done))
        assert (alone.tokens, alone.logprobs) == (d.tokens, d.logprobs)
