"""Samplers on hand-made distributions, seeded determinism, beam search."""
import json
import math
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import core.engine.sampling as sampling
from core.engine import cpu_rows
from core.engine.beam import beam_search
from core.engine.sampling import (apply_repetition_penalty, choose_tokens, draw, filter_logits, inverse_cdf,
                                  filter_rows, min_p_filter, sample, seeded_generator, top_alternatives, top_k_filter,
                                  top_p_filter)
from core.engine.settings import SamplingParams, parse_logit_bias
from core.errors import SettingsError


def logits_of(probs):
    return torch.tensor(probs, dtype=torch.float32).log()


def kept(logits):
    return set(torch.isfinite(logits).nonzero().view(-1).tolist())


def test_top_k_keeps_k_largest():
    lg = logits_of([0.1, 0.4, 0.05, 0.3, 0.15])
    assert kept(top_k_filter(lg, 2)) == {1, 3}
    assert kept(top_k_filter(lg, 0)) == {0, 1, 2, 3, 4}


def test_top_p_keeps_smallest_set_reaching_p():
    lg = logits_of([0.1, 0.4, 0.05, 0.3, 0.15])
    assert kept(top_p_filter(lg, 0.5)) == {1, 3}  # 0.4 < 0.5, 0.4 + 0.3 ≥ 0.5
    assert kept(top_p_filter(lg, 0.7)) == {1, 3}  # reaches exactly 0.7
    assert kept(top_p_filter(lg, 0.71)) == {1, 3, 4}
    assert kept(top_p_filter(lg, 0.01)) == {1}  # the top token always stays


def test_min_p_relative_to_top_token():
    lg = logits_of([0.1, 0.4, 0.05, 0.3, 0.15])
    assert kept(min_p_filter(lg, 0.3)) == {1, 3, 4}  # threshold 0.12
    assert kept(min_p_filter(lg, 0.8)) == {1}


def test_repetition_penalty_divides_positive_multiplies_negative():
    lg = torch.tensor([2.0, -1.0, 0.5])
    out = apply_repetition_penalty(lg, torch.tensor([0, 1]), 2.0)
    assert out.tolist() == [1.0, -2.0, 0.5]


def test_filters_compose_and_sampling_stays_inside_kept_set():
    lg = logits_of([0.1, 0.4, 0.05, 0.3, 0.15])
    p = SamplingParams(temperature=0.7, top_k=3, top_p=0.6, seed=1)
    allowed = kept(filter_logits(lg, p))
    assert allowed == {1, 3}
    g = seeded_generator(p)
    assert {sample(lg, p, g) for _ in range(200)} == allowed


def test_seeded_determinism_and_seed_sensitivity():
    lg = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0, top_p=1.0, seed=42)
    a = [sample(lg, p, g) for g in [seeded_generator(p)] for _ in range(50)]
    b = [sample(lg, p, g) for g in [seeded_generator(p)] for _ in range(50)]
    c = [sample(lg, SamplingParams(temperature=1.0, seed=43), g)
         for g in [seeded_generator(SamplingParams(seed=43))] for _ in range(50)]
    assert a == b
    assert a != c


def test_greedy_ignores_generator():
    lg = logits_of([0.1, 0.4, 0.05, 0.3, 0.15])
    assert sample(lg, SamplingParams(temperature=0), None) == 1


def test_sampled_frequencies_follow_filtered_distribution():
    lg = logits_of([0.5, 0.3, 0.2])
    p = SamplingParams(temperature=1.0, top_p=1.0, seed=5)
    g = seeded_generator(p)
    n = 4000
    counts = torch.bincount(torch.tensor([sample(lg, p, g) for _ in range(n)]), minlength=3).float() / n
    assert torch.allclose(counts, torch.tensor([0.5, 0.3, 0.2]), atol=0.03)


def test_top_alternatives_before_and_after_filters():
    lg = logits_of([0.1, 0.4, 0.05, 0.3, 0.15])
    alt = top_alternatives(lg, SamplingParams(temperature=1.0, top_k=2), k=3)
    assert [t for t, _ in alt["raw"]] == [1, 3, 4]
    assert alt["raw"][0][1] == pytest.approx(0.4, abs=1e-6)
    assert [t for t, _ in alt["filtered"]] == [1, 3]
    assert alt["filtered"][0][1] == pytest.approx(0.4 / 0.7, abs=1e-6)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2),
                                 dict(min_p=1.0), dict(repetition_penalty=0), dict(max_new_tokens=0),
                                 dict(num_beams=0), dict(seed=-1), dict(stop=("",))])
def test_invalid_settings_are_rejected_with_their_name(bad):
    with pytest.raises(SettingsError) as e:
        SamplingParams(**bad).validate()
    assert list(bad)[0].split("_")[0] in str(e.value)


def test_beam_search_beats_greedy_on_a_trap():
    """Token 1 looks best first but leads to a flat distribution; token 2 leads to a sure path."""
    V, stop = 4, 3
    table = {
        (): [0.0, 0.5, 0.4, 0.1],
        (1,): [0.3, 0.3, 0.3, 0.1],
        (2,): [0.0, 0.0, 0.95, 0.05],
    }

    def dist(prefix):
        p = table.get(tuple(prefix), [0.05, 0.05, 0.05, 0.85])
        return torch.tensor(p).clamp_min(1e-9).log()

    state = {"beams": [[]]}

    def step(last, origin):
        beams = [state["beams"][o] + [t] for o, t in zip(origin, last)]
        state["beams"] = beams
        return torch.stack([dist(b) for b in beams])

    res = beam_search(step, dist([]), num_beams=2, max_new_tokens=3, stop_ids={stop}, length_penalty=0.0)
    greedy = [1, 0]  # 0.5 then 0.3 (ties broken low): total log 0.15
    beam_lp = sum(res.logprobs)
    greedy_lp = math.log(0.5) + math.log(0.3)
    assert res.tokens[:2] == [2, 2]
    assert beam_lp > greedy_lp
    assert res.tokens[:2] != greedy


def test_rows_filtered_together_equal_each_filtered_alone():
    """Comparison lanes filter in one batch; every row must equal its single-row result."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 300, generator=g) * 3
    params = [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0),
              SamplingParams(temperature=1.3, top_k=20, top_p=0.5, min_p=0.05),
              SamplingParams(temperature=1.0, top_p=1.0, repetition_penalty=1.3),
              SamplingParams(temperature=0.5, top_p=0.99, min_p=0.2, repetition_penalty=0.8)]
    previous = [None, None, None, torch.tensor([1, 5, 9]), torch.tensor([2, 2, 7])]
    together = filter_rows(logits, params, previous)
    for i, (q, prev) in enumerate(zip(params, previous)):
        alone = filter_logits(logits[i], q, prev)
        assert torch.equal(torch.isfinite(together[i]), torch.isfinite(alone))
        torch.testing.assert_close(together[i][torch.isfinite(alone)], alone[torch.isfinite(alone)], atol=0, rtol=0)


def test_draw_never_picks_a_removed_token_and_is_seeded():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    g = torch.Generator().manual_seed(0)
    picks = [draw(probs, g) for _ in range(500)]
    assert set(picks) == {1, 3}
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert [draw(probs, g1) for _ in range(20)] == [draw(probs, g2) for _ in range(20)]


# -- the fast sampler against the reference filters ------------------------------------------

_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),
    top_p=st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.1, 0.01]),
    top_k=st.sampled_from([0, 1, 2, 5, 40, 300]),
    min_p=st.sampled_from([0.0, 0.01, 0.05, 0.3]),
    repetition_penalty=st.sampled_from([1.0, 1.3]),
    seed=st.integers(0, 2**31),
)


@st.composite
def _case(draw):
    vocab = draw(st.integers(2, 700))
    rows = draw(st.integers(1, 4))
    levels = draw(st.sampled_from([0, 3, 12]))  # 0: continuous; else few distinct values -> ties
    scale = draw(st.sampled_from([0.5, 3.0, 12.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    lg = torch.randn(rows, vocab, generator=g) * scale
    if levels:
        lg = (lg * levels / scale).round() * scale / levels
    params = [draw(_params) for _ in range(rows)]
    prev = [torch.randint(0, vocab, (draw(st.integers(0, 6)),), generator=g) for _ in range(rows)]
    return lg, params, prev, draw(st.sampled_from([1, 4, 16, 64, 256]))


def _reference_in_float64(row, q, prev):
    """sample() with the same uniform, but filtered and summed in float64."""
    u = torch.rand((), generator=seeded_generator(q), dtype=torch.float32)
    if q.greedy:
        return sample(row, q, None, prev)
    filt = filter_rows(row.double().view(1, -1), [q], [prev])
    return int(inverse_cdf(filt.softmax(-1), u.double().view(1))[0])


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_fast_sampler_picks_what_the_reference_filters_pick(case):
    """Every setting, ties, and candidate counts from 1 (always the fallback) to the vocabulary.

    The reference sums probabilities in sorted order and the fast sampler in candidate
    order, so where float32 rounding alone decides (a cumulative mass within an ulp of
    top_p), the reference's own float64 answer is accepted too.
    """
    lg, params, prev, candidates = case
    got = choose_tokens(lg, params, prev, [seeded_generator(q) for q in params], candidates=candidates)
    want = [sample(row, q, seeded_generator(q), p) for row, q, p in zip(lg, params, prev)]
    for r, (g, w) in enumerate(zip(got.ids, want)):
        if g != w:
            assert g == _reference_in_float64(lg[r], params[r], prev[r]) != w
    assert got.tokens.tolist() == got.ids
    ref_lp = torch.log_softmax(lg, -1)
    for r, t in enumerate(got.ids):
        assert got.logprobs[r] == pytest.approx(float(ref_lp[r, t]), abs=1e-5)


def test_fast_sampler_advances_each_generator_like_the_reference():
    """Successive draws stay in step: one uniform per sampled row, none for greedy rows."""
    lg = torch.randn(3, 5000, generator=torch.Generator().manual_seed(3)) * 4
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=1), SamplingParams(temperature=0, seed=2),
              SamplingParams(temperature=1.2, top_k=50, min_p=0.02, seed=3)]
    gens = [seeded_generator(q) for q in params]
    refs = [seeded_generator(q) for q in params]
    for _ in range(30):
        got = choose_tokens(lg, params, [None] * 3, gens)
        assert got.ids == [sample(row, q, g) for row, q, g in zip(lg, params, refs)]


# ---------------------------------------------------------------- logit bias

def _biased_by_hand(row, bias):
    """The reference: the bias added entry by entry, then the settings without it."""
    out = row.clone()
    for t, b in bias.items():
        out[t] = out[t] + b
    return out


@st.composite
def _biased_case(draw):
    vocab = draw(st.integers(4, 600))
    rows = draw(st.integers(1, 4))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    lg = torch.randn(rows, vocab, generator=g) * draw(st.sampled_from([0.5, 3.0, 12.0]))
    params = []
    for r in range(rows):
        q = draw(_params)
        top = int(lg[r].argmax())
        bias = {top: draw(st.sampled_from([-math.inf, -3.0, 5.0]))}
        for t in draw(st.lists(st.integers(0, vocab - 1), max_size=5)):
            bias[t] = draw(st.sampled_from([-math.inf, -100.0, -2.5, 1.0, 40.0]))
        params.append(SamplingParams.from_dict({**q.to_dict(), "logit_bias": bias}))
    return lg, params


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_biased_case())
def test_logit_bias_is_added_before_every_filter_and_minus_inf_bans(case):
    """Rows with their own biases, sampled together, pick what the reference filters pick
    on logits biased by hand; a token biased by -inf is never chosen; log-probs stay raw."""
    lg, params = case
    got = choose_tokens(lg, params, [None] * len(params), [seeded_generator(q) for q in params])
    for r, q in enumerate(params):
        plain = SamplingParams.from_dict({**q.to_dict(), "logit_bias": {}})
        want = sample(_biased_by_hand(lg[r], q.logit_bias), plain, seeded_generator(plain))
        assert got.ids[r] == want
        assert q.logit_bias.get(got.ids[r]) != -math.inf
        assert got.logprobs[r] == pytest.approx(float(torch.log_softmax(lg[r], -1)[got.ids[r]]), abs=1e-5)
        # filter_logits (the inspector's "after the filters") applies the same bias
        ref = filter_logits(_biased_by_hand(lg[r], q.logit_bias), plain)
        assert torch.equal(filter_logits(lg[r], q).isinf(), ref.isinf())


def test_banning_the_greedy_token_gives_the_runner_up():
    lg = torch.tensor([[0.0, 5.0, 4.0, 1.0]])
    q = SamplingParams(temperature=0, logit_bias={1: -math.inf})
    assert choose_tokens(lg, [q], [None], [None]).ids == [2]
    assert choose_tokens(lg, [SamplingParams(temperature=0, logit_bias={3: 10})], [None], [None]).ids == [3]


def test_logit_bias_survives_json_and_rejects_bad_values():
    q = SamplingParams(logit_bias={5: -math.inf, 7: 2.5})
    back = SamplingParams.from_dict(json.loads(json.dumps(q.to_dict())))
    assert back.logit_bias == {5: -math.inf, 7: 2.5}
    for bad in ({3: 101.0}, {3: math.inf}, {3: math.nan}, {-1: 1.0}):
        with pytest.raises(SettingsError, match="logit_bias"):
            SamplingParams(logit_bias=bad).validate()
    with pytest.raises(SettingsError, match="logit_bias"):
        SamplingParams(logit_bias={"x": 1})


def test_logit_bias_spec_by_text():
    encode = {"cat": [9], " the cat": [4, 9], "<|eot_id|>": [27, 91, 68]}.__getitem__
    assert parse_logit_bias("cat=+5", encode) == {9: 5.0}
    assert parse_logit_bias(" the cat=-inf", encode) == {4: -math.inf, 9: -math.inf}
    for bad in ("cat", "=5", "cat=lots", "cat=+500", "cat=inf"):
        with pytest.raises(SettingsError, match="logit bias"):
            parse_logit_bias(bad, encode)


# ---------------------------------------------------------------- the cut without a full sort

def _before64(row, p):
    """The reference's ``before`` (mass strictly above each token, stable sorted order) in
    float64, by token id: where it lies within float32 rounding of p, the reference's own
    float32 and float64 cuts may differ, and so may ours."""
    vals, order = row.double().sort(descending=True, stable=True)
    probs = vals.softmax(-1)
    before = probs.cumsum(-1) - probs
    return torch.empty_like(before).scatter_(0, order, before)


def _assert_same_cut(kept, row, p):
    """kept equals the reference's kept set except for tokens whose float64 ``before`` is
    within twice the reference's own float32 error of p (its softmax over the sorted row
    sums to 1 +- that error: 2e-5 on a peaked 128k row)."""
    want = torch.isfinite(top_p_filter(row, p))
    differ = (kept != want).nonzero().view(-1)
    if differ.numel():  # only where rounding alone decides
        err = abs(1 - float(row.sort(descending=True, stable=True).values.softmax(-1).double().sum()))
        band = 2 * max(err, 1e-6)
        assert ((_before64(row, p)[differ] - p).abs() <= band).all(), differ[:10].tolist()
    return differ.numel() == 0


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_case(), st.sampled_from([2, 8, 64]))
def test_window_cut_picks_what_the_reference_filters_pick(case, sample):
    """candidates=1 sends every filtered row to the window; a small strided sample makes
    the window miss and move (both ways, wider), and ties and -inf entries fall inside it."""
    lg, params, prev, _ = case
    with mock.patch.object(sampling, "SAMPLE", sample):
        got = choose_tokens(lg, params, prev, [seeded_generator(q) for q in params], candidates=1)
    want = [sample_(row, q, seeded_generator(q), p) for row, q, p in zip(lg, params, prev)]
    for r, (g, w) in enumerate(zip(got.ids, want)):
        if g != w:
            assert g == _reference_in_float64(lg[r], params[r], prev[r]) != w


sample_ = sample


def _window_or_justified(row, p):
    """top_p_kept(row, p) is the reference's kept set, or None only where a token's
    float32 ``before`` in the reference lies within rounding of p. True when decided."""
    kept = sampling.top_p_kept(row, p)
    if kept is None:
        vals = row.sort(descending=True, stable=True).values
        probs = vals.softmax(-1)
        assert ((probs.cumsum(-1) - probs - p).abs() <= 2 * sampling.ROUNDING).any()
        return False
    _assert_same_cut(kept, row, p)
    return True


@pytest.mark.parametrize("std", [0.05, 0.5, 2.0, 4.0])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_window_cut_on_a_llama3_vocabulary(std, p):
    """The window's kept set at 128,256 tokens, from flat (nearly every token kept) to peaked."""
    g = torch.Generator().manual_seed(int(std * 100 + p * 1000))
    for _ in range(3):
        _window_or_justified(torch.randn(128256, generator=g) * std, p)


@pytest.mark.skipif(sampling.ROUNDING > 5e-7, reason=(
    "torch runs AVX2 or scalar kernels here: the window's margin is wider by design, so more "
    "flat rows go to the sort (the rows it decides are still checked against the reference)"))
def test_window_decides_most_flat_rows_without_the_sort():
    """The bench's flat rows (logit std 0.5 at temperature 0.8, top-p 0.9): the reference's
    sort runs only for the rows where its rounding sits at the cut (5 of 20 measured)."""
    g = torch.Generator().manual_seed(5)
    decided = sum(_window_or_justified(torch.randn(128256, generator=g) * 0.5 / 0.8, 0.9) for _ in range(20))
    assert decided >= 12


@pytest.mark.parametrize("scale", [0.5, 4.0])
def test_ties_across_the_top_p_cut_keep_the_lowest_ids(scale):
    """A group of equal logits straddles the cut: the reference keeps its first tokens by
    id (its sort is stable), and so must the window and the candidates. Each tie step
    (1/2000 of the mass) is far above float32 rounding, so the cut is exact."""
    V = 128256
    g = torch.Generator().manual_seed(7)
    row = torch.randn(V, generator=g) * scale - 3 * scale - 8  # below the group: about 2% of the mass
    perm = torch.randperm(V, generator=g)
    group = perm[:2000]
    row[group] = 0.0  # above most of the row
    row[perm[2000:2005]] = 2.0 + scale  # a few tokens above the group
    probs = row.double().softmax(-1)
    above = probs[row > 0].sum()
    q = float(probs[group[0]])
    for n_kept in (1, 700, 1999):
        p = float(above + (n_kept - 0.5) * q)  # halfway through a tie step: no rounding decides
        want = torch.isfinite(top_p_filter(row, p))
        assert int(want[group].sum()) == n_kept
        assert torch.equal(sampling.top_p_kept(row, p), want)
        params = [SamplingParams(temperature=1.0, top_p=p, seed=s) for s in range(3)]
        lg = row.expand(3, V).contiguous()
        got = choose_tokens(lg, params, [None] * 3, [seeded_generator(q) for q in params])
        assert got.ids == [sample(row, q, seeded_generator(q)) for q in params]


@pytest.mark.parametrize("std", [0.5, 1.5, 4.0])
def test_fast_sampler_on_a_llama3_vocabulary(std):
    """Eight lanes at 128,256 tokens (candidates, window, min-p, top-k, greedy), each
    row's token equal to the reference's wherever the reference's cut is not decided by
    rounding alone, and inside its kept set."""
    V = 128256
    g = torch.Generator().manual_seed(int(std * 10))
    lg = torch.randn(8, V, generator=g) * std
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=1), SamplingParams(temperature=1.0, top_p=0.5, seed=2),
              SamplingParams(temperature=0.7, top_p=0.95, min_p=0.05, seed=3),
              SamplingParams(temperature=1.0, top_p=1.0, min_p=0.2, seed=4),
              SamplingParams(temperature=1.2, top_k=40, top_p=0.9, seed=5), SamplingParams(temperature=0),
              SamplingParams(temperature=1.0, top_p=1.0, seed=7), SamplingParams(temperature=0.8, top_p=0.99, seed=8)]
    got = choose_tokens(lg, params, [None] * 8, [seeded_generator(q) for q in params])
    exact = 0
    for r, q in enumerate(params):
        x = lg[r] / q.temperature if not q.greedy else lg[r]
        x = top_k_filter(x, q.top_k)
        filt = filter_logits(lg[r], q)
        assert torch.isfinite(filt[got.ids[r]])
        if q.greedy or q.top_p >= 1.0 or _assert_same_cut(torch.isfinite(top_p_filter(x, q.top_p)) & torch.isfinite(x),
                                                          x, q.top_p):
            assert got.ids[r] == sample(lg[r], q, seeded_generator(q))
            exact += 1
    assert exact >= 6


def test_fast_sampler_in_float64_uses_the_plain_torch_path():
    """float64 logits take the torch (not numpy) branches, as an accelerator's would."""
    g = torch.Generator().manual_seed(11)
    lg = torch.randn(4, 3000, generator=g, dtype=torch.float64) * 3
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=1), SamplingParams(temperature=0),
              SamplingParams(temperature=1.0, top_p=0.999, seed=3), SamplingParams(temperature=1.0, top_k=5, seed=4)]
    for candidates in (1, 64, 1024):
        got = choose_tokens(lg, params, [None] * 4, [seeded_generator(q) for q in params], candidates=candidates)
        assert got.ids == [sample(row, q, seeded_generator(q)) for row, q in zip(lg, params)]


@pytest.mark.parametrize("sample_size", [8, 4096])
def test_inspector_filters_without_the_sort_equal_the_reference(sample_size):
    """top_alternatives' "after the filters" comes from the window's cut: the same
    filtered logits as filter_logits, bit for bit, on flat and peaked rows."""
    g = torch.Generator().manual_seed(13)
    params = [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0),
              SamplingParams(temperature=1.2, top_k=300, top_p=0.5, min_p=0.01, repetition_penalty=1.3),
              SamplingParams(temperature=1.0, top_p=0.99, logit_bias={3: 5.0, 7: -math.inf}),
              SamplingParams(temperature=0.5, top_p=1.0, min_p=0.1)]
    with mock.patch.object(sampling, "SAMPLE", sample_size):
        for std in (0.3, 1.0, 4.0):
            for q in params:
                row = torch.randn(20000, generator=g) * std
                prev = torch.tensor([1, 5, 9, 9])
                assert torch.equal(sampling.filtered_row(row, q, prev), filter_logits(row, q, prev))
    row = torch.randn(20000, generator=g)
    alt = top_alternatives(row, params[0], k=5)
    ref = filter_logits(row, params[0]).softmax(-1)
    assert [i for i, _ in alt["filtered"]] == torch.topk(ref, 5).indices.tolist()


def _bits(t):
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


@pytest.mark.parametrize("B,V", [(16, 512), (3, 1024), (1, 32000), (64, 64)])
def test_a_small_batch_scans_at_once_bit_for_bit_as_row_by_row(B, V):
    """The sampler's whole-row passes run on a small batch at once (sampling.at_once):
    every value each row's own passes give, to the bit (NaN of an all -inf row
    included), at several temperatures and candidate widths, and so the same tokens and
    log-probs: a row's draw cannot depend on the batch beside it."""
    g = torch.Generator().manual_seed(B * V)
    logits = torch.randn(B, V, generator=g) * torch.tensor([0.3, 3.0, 30.0]).repeat(B)[:B].view(B, 1)
    logits[0, : V // 3] = float("-inf")
    logits[-1] = float("-inf") if B > 2 else logits[-1]
    qs = [SamplingParams(temperature=[1.0, 0.7, 1.3, 0.0][i % 4], top_p=[0.95, 1.0, 0.5][i % 3], seed=i,
                         min_p=0.05 if i % 5 == 4 else 0.0) for i in range(B)]
    sampled = [i for i, q in enumerate(qs) if not q.greedy]
    x, temps = logits[sampled], [float(qs[i].temperature) for i in sampled]
    assert sampling.at_once(logits)
    for cand in (512, 64):
        fast = sampling._scan(logits, x, sampled, temps, cand)
        with mock.patch.object(sampling, "at_once", lambda _: False):
            ref = sampling._scan(logits, x, sampled, temps, cand)
        assert torch.equal(_bits(fast[0]), _bits(ref[0]))
        for a, b in zip(fast[1], ref[1]):
            assert a.shape == b.shape and torch.equal(_bits(a), _bits(b))
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(B)]  # noqa: E731
    got = choose_tokens(logits[1:], qs[1:], [None] * (B - 1), gens()[1:]) if B > 1 else None
    with mock.patch.object(sampling, "at_once", lambda _: False):
        want = choose_tokens(logits[1:], qs[1:], [None] * (B - 1), gens()[1:]) if B > 1 else None
    if got is not None:
        assert got.ids == want.ids and list(map(repr, got.logprobs)) == list(map(repr, want.logprobs))  # NaN too


def test_a_large_batch_scans_row_by_row():
    assert not sampling.at_once(torch.zeros(2, 32000)) and not sampling.at_once(torch.zeros(4, 1000))


def test_the_candidate_threshold_is_topks_kth_value():
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(3))
    x[1, :100] = float("-inf")
    for kc in (512, 100, 1):
        assert torch.equal(sampling._threshold(x, kc), x.topk(kc, dim=-1).values[:, -1])
        assert torch.equal(sampling._threshold(x[2], kc), x[2].topk(kc).values[-1])



@pytest.mark.parametrize("levels", [0, 3, 40])
def test_cpu_rows_draw_the_torch_paths_tokens_without_its_stable_sort(levels):
    """A CPU batch's candidate draw in numpy, its top-p cut from the sorted values alone
    (no stable argsort): the tokens and log-probs of the torch path, bit for bit, with
    many ties (``levels`` distinct values) at and across the cut, temperatures, min-p,
    biases, a row mostly -inf."""
    g = torch.Generator().manual_seed(levels + 1)
    B, V = 16, 512
    lg = torch.randn(B, V, generator=g) * 3
    if levels:
        lg = (lg * levels / 3).round() * 3 / levels
    lg[0, :200] = float("-inf")
    qs = [SamplingParams(temperature=[1.0, 0.7, 1.3][i % 3], top_p=[0.95, 0.5, 0.9, 0.99][i % 4], seed=i,
                         min_p=0.05 if i % 5 == 4 else 0.0, logit_bias={2: -100.0} if i % 2 else {})
          for i in range(B)]
    gens = lambda: [seeded_generator(q) for q in qs]  # noqa: E731
    sorts = []
    real_sort = torch.Tensor.sort
    with mock.patch.object(torch.Tensor, "sort", lambda self, *a, **k: sorts.append(1) or real_sort(self, *a, **k)):
        got = [choose_tokens(lg, qs, [None] * B, gens()) for _ in range(2)][-1]
    assert not sorts  # the value sort decided every row
    with mock.patch.object(sampling, "candidate_draw", lambda *a: None):
        want = choose_tokens(lg, qs, [None] * B, gens())
    assert got.ids == want.ids and list(map(repr, got.logprobs)) == list(map(repr, want.logprobs))


def test_a_kept_set_that_is_not_a_prefix_of_the_sorted_values_goes_to_the_sort():
    masked = np.array([[3.0, 2.0, 2.0, 1.0]], dtype=np.float32)
    vals_s = masked.copy()
    assert cpu_rows.kept_by_place(masked, vals_s, np.array([[True, False, True, False]])) is None
    got = cpu_rows.kept_by_place(masked[:, [1, 0, 3, 2]], vals_s, np.array([[True, True, False, False]]))
    assert got.tolist() == [[True, True, False, False]]  # of the tied 2.0s, the first by place
