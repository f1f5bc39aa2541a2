"""Attention attribution against transformers' eager attention weights."""
import threading

import pytest
import torch

from core.engine.attribution import AttributionCancelled, attention_mass, attribute
from core.errors import SettingsError
from tests.helpers import meta_from_hf, tiny_hf


def reference_mass(hf, ids, qa, qb):
    """Sum over layers and heads of HF's eager softmax rows qa..qb-1, averaged over rows."""
    hf.set_attn_implementation("eager")
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True)
    att = torch.stack([a[0].double() for a in out.attentions])  # [L, H, T, T]
    return att[:, :, qa:qb, :qb].sum(dim=(0, 1, 2)) / (qb - qa)


@pytest.fixture(scope="module")
def gqa_pair():
    hf = tiny_hf(num_attention_heads=8, num_key_value_heads=2)
    return hf, meta_from_hf(hf)


@pytest.mark.parametrize("chunk,queries", [(512, (20, 31)), (7, (12, 40)), (5, (0, 1))])
def test_mass_matches_transformers_eager(gqa_pair, chunk, queries):
    hf, ours = gqa_pair
    ids = torch.randint(0, 96, (41,), generator=torch.Generator().manual_seed(3)).tolist()
    got = attention_mass(ours, ids, queries, chunk=chunk, block=4)
    want = reference_mass(hf, ids, *queries)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    # every softmax row sums to one: the whole mass is layers x heads
    assert float(got.sum()) == pytest.approx(2 * 8, rel=1e-5)


def test_shares_per_passage_and_none(gqa_pair):
    hf, ours = gqa_pair
    ids = torch.randint(0, 96, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    passages = [(2, 8), (10, 15), (12, 18)]  # the third overlaps the second: counted once
    res = attribute(ours, ids, (24, 30), passages, chunk=9)
    want = reference_mass(hf, ids, 23, 29) / 16
    assert res.shares[0] == pytest.approx(float(want[2:8].sum()), abs=1e-5)
    assert res.shares[1] == pytest.approx(float(want[10:15].sum()), abs=1e-5)
    assert res.shares[2] == pytest.approx(float(want[15:18].sum()), abs=1e-5)
    assert res.none == pytest.approx(1 - float(want[2:8].sum() + want[10:18].sum()), abs=1e-5)
    assert (res.layers, res.heads, res.queries) == (2, 8, 6)


def test_cancel_and_bad_spans(gqa_pair):
    _, ours = gqa_pair
    stop = threading.Event()
    stop.set()
    with pytest.raises(AttributionCancelled):
        attribute(ours, list(range(20)), (10, 12), [(0, 5)], cancel=stop)
    with pytest.raises(SettingsError):
        attribute(ours, list(range(20)), (0, 3), [(0, 5)])
    with pytest.raises(SettingsError):
        attribute(ours, list(range(20)), (15, 25), [(0, 5)])
