"""Pure comparison helpers: divergence, diff, repetition, perplexity, sweeps."""
import math

import pytest

from core.engine.lanes import (MAX_LANES, distinct_n, divergence_index, lane_stats, lock_seeds, mean_logprob,
                               parse_sweep, perplexity, settings_label, sweep_lanes, text_diff, token_diff)
from core.engine.settings import SamplingParams
from core.errors import SettingsError


def test_divergence_index():
    assert divergence_index([1, 2, 3], [1, 2, 3]) is None
    assert divergence_index([], []) is None
    assert divergence_index([1, 2, 3], [1, 5, 3]) == 1
    assert divergence_index([1, 2, 3], [9]) == 0
    assert divergence_index([1, 2], [1, 2, 3]) == 2  # one stopped, the other went on
    assert divergence_index([1, 2, 3], [1, 2]) == 2
    assert divergence_index([], [4]) == 0


def test_token_diff_marks_changes_and_realignment():
    base = [1, 2, 3, 4, 5, 6]
    d = token_diff(base, base)
    assert d.divergence is None and not any(d.changed) and d.removed == 0
    # one token replaced, the rest realigns with the baseline
    d = token_diff(base, [1, 2, 9, 4, 5, 6])
    assert d.divergence == 2
    assert d.changed == (False, False, True, False, False, False)
    assert d.removed == 1 and d.changed_count == 1
    # an inserted token shifts the rest, which still aligns
    d = token_diff(base, [1, 2, 7, 3, 4, 5, 6])
    assert d.divergence == 2 and d.changed == (False, False, True, False, False, False, False)
    assert d.removed == 0
    # completely different after the first token
    d = token_diff(base, [1, 8, 8, 8])
    assert d.divergence == 1 and d.changed == (False, True, True, True)
    # a longer lane: the extra tokens are changes
    d = token_diff([1, 2], [1, 2, 3, 4])
    assert d.divergence == 2 and d.changed == (False, False, True, True)
    # a shorter lane: nothing of its own changed, baseline tokens removed
    d = token_diff([1, 2, 3], [1, 2])
    assert d.divergence == 2 and d.changed == (False, False) and d.removed == 1


def test_divergence_point_is_always_marked():
    # The matcher would align [5] with baseline's later 5; the divergence point still shows.
    d = token_diff([1, 2, 5], [1, 5])
    assert d.divergence == 1 and d.changed[1]


def test_distinct_n():
    assert distinct_n([1, 2, 3, 4], 1) == 1.0
    assert distinct_n([1, 1, 1, 1], 1) == 0.25
    assert distinct_n([1, 2, 1, 2, 1, 2], 2) == pytest.approx(2 / 5)
    assert distinct_n([1], 2) is None
    assert distinct_n([], 1) is None
    with pytest.raises(ValueError):
        distinct_n([1], 0)


def test_mean_logprob_and_perplexity():
    assert mean_logprob([]) is None and perplexity([]) is None
    lps = [math.log(0.5), math.log(0.25)]
    assert mean_logprob(lps) == pytest.approx((math.log(0.5) + math.log(0.25)) / 2)
    # perplexity is the inverse geometric mean probability
    assert perplexity(lps) == pytest.approx(1 / math.sqrt(0.5 * 0.25))
    assert perplexity([0.0, 0.0]) == pytest.approx(1.0)
    assert perplexity([-1e6]) == math.inf


def test_lane_stats():
    s = lane_stats([1, 2, 2], [math.log(0.5)] * 3, {"decode_tok_s": 12.5}, "length")
    assert s["tokens"] == 3 and s["tokens_per_s"] == 12.5 and s["stop_reason"] == "length"
    assert s["perplexity"] == pytest.approx(2.0)
    assert s["distinct_1"] == pytest.approx(2 / 3) and s["distinct_2"] == pytest.approx(1.0)
    empty = lane_stats([], [], None, "eos")
    assert empty["tokens"] == 0 and empty["perplexity"] is None and empty["distinct_1"] is None


def test_parse_sweep_lists_and_ranges():
    assert parse_sweep("0.2, 0.7, 1.2") == [0.2, 0.7, 1.2]
    assert parse_sweep("0.2:1.4:0.4") == [0.2, 0.6, 1.0, 1.4]
    assert parse_sweep(" 0.5 ; 0.5, 1 ") == [0.5, 1.0]  # duplicates dropped, ; accepted
    assert parse_sweep("1:4", "top_k") == [1, 2, 3, 4]
    assert parse_sweep("0, 40, 100", "top_k") == [0, 40, 100]
    assert all(isinstance(v, int) for v in parse_sweep("1, 2", "seed"))
    assert parse_sweep("0.1:0.3:0.1", "min_p") == [0.1, 0.2, 0.3]


@pytest.mark.parametrize("text,param,needle", [
    ("", "temperature", "enter values"),
    ("a, b", "temperature", "not a number"),
    ("1:0:0.1", "temperature", "below its start"),
    ("0:1:0", "temperature", "step"),
    ("0:1:0.1", "temperature", "at most 8"),
    ("1,2,3,4,5,6,7,8,9", "temperature", "at most 8"),
    ("-0.5", "temperature", "at least"),
    ("1.5", "top_p", "between"),
    ("2.5", "top_k", "whole numbers"),
    ("0.5", "num_beams", "whole numbers"),
    ("1, 17", "num_beams", "to 16"),
    ("1:2:3:4", "temperature", "start:stop:step"),
    ("nan", "temperature", "finite"),
])
def test_parse_sweep_errors(text, param, needle):
    with pytest.raises(SettingsError, match=needle):
        parse_sweep(text, param)


def test_sweep_lanes_and_seed_lock():
    base = {"temperature": 0.8, "top_p": 0.9, "seed": 3}
    lanes = sweep_lanes(base, "temperature", [0.2, 1.2])
    assert lanes == [{"temperature": 0.2, "top_p": 0.9, "seed": 3}, {"temperature": 1.2, "top_p": 0.9, "seed": 3}]
    assert base["temperature"] == 0.8  # not mutated
    assert [l["seed"] for l in lock_seeds([{"seed": 1}, {"seed": None}], 9)] == [9, 9]
    assert len(parse_sweep(":".join(["0", "0.7", "0.1"]))) == MAX_LANES


def test_parse_sweep_every_knob():
    """seed, lookup, a logit bias over one TEXT and the output format on/off sweep too."""
    assert parse_sweep("1:4", "seed") == [1, 2, 3, 4]
    assert parse_sweep("0, 2, 4", "lookup") == [0, 2, 4]
    assert parse_sweep("girl=-inf, -5, 0, +5", "logit_bias_text") == ["girl=-inf", "girl=-5", "girl=0", "girl=5"]
    assert parse_sweep("girl=-10:10:10", "logit_bias_text") == ["girl=-10", "girl=0", "girl=10"]
    assert parse_sweep(" dragon=1.5; -inf; 1.5", "logit_bias_text") == [" dragon=1.5", " dragon=-inf"]
    assert parse_sweep("on, off", "constraint") == [True, False]
    assert parse_sweep("OFF", "constraint") == [False]
    base = {"temperature": 0.5, "logit_bias_text": ["girl=2", "Lily=1"], "lookup": 0,
            "constraint": {"kind": "regex", "text": "[a-z]+"}}
    lanes = sweep_lanes(base, "logit_bias_text", ["girl=-inf", "girl=5"])
    assert [ln["logit_bias_text"] for ln in lanes] == [["Lily=1", "girl=-inf"], ["Lily=1", "girl=5"]]
    assert base["logit_bias_text"] == ["girl=2", "Lily=1"]  # not mutated
    assert [ln["constraint"] for ln in sweep_lanes(base, "constraint", [True, False])] == [base["constraint"], None]
    assert [ln["lookup"] for ln in sweep_lanes(base, "lookup", [0, 3])] == [0, 3]
    with pytest.raises(SettingsError, match="no output format"):
        sweep_lanes({**base, "constraint": None}, "constraint", [True, False])


def test_draft_model_sweep_and_its_exclusion_with_prompt_lookup():
    """A draft model sweeps over paths ("off" is none); every lane it makes validates as
    SamplingParams, since a lane with a draft turns lookup off and a lookup lane the draft."""
    assert parse_sweep("off, /m/a.gguf, ~/m/b folder/, /m/a.gguf", "draft") == ["", "/m/a.gguf", "~/m/b folder/"]
    assert parse_sweep("OFF", "draft") == [""]
    for bad, needle in (("", "draft models' paths"), (" , ,", "draft models' paths"),
                        (", ".join(f"/m/{i}.gguf" for i in range(9)), "at most 8")):
        with pytest.raises(SettingsError, match=needle):
            parse_sweep(bad, "draft")
    base = {"temperature": 0.0, "lookup": 3, "draft": ""}
    lanes = sweep_lanes(base, "draft", ["", "/m/a.gguf"])
    assert [(ln["lookup"], ln["draft"]) for ln in lanes] == [(3, ""), (0, "/m/a.gguf")]
    lanes = sweep_lanes({**base, "lookup": 0, "draft": "/m/a.gguf"}, "lookup", [0, 2])
    assert [(ln["lookup"], ln["draft"]) for ln in lanes] == [(0, "/m/a.gguf"), (2, "")]
    for ln in lanes:
        SamplingParams.from_dict(ln).validate()
    assert settings_label({"draft": "/m/small.gguf"}) == "draft small.gguf"
    assert settings_label({"temperature": 0.0, "draft": "/m/llama-1b/"}, differs_from={"temperature": 0.0}) \
        == "draft llama-1b"
    assert settings_label({"draft": ""}) == "draft off"


@pytest.mark.parametrize("text,param,needle", [
    ("9", "lookup", r"from 0 \(off\) to 8"), ("-1", "lookup", r"from 0 \(off\) to 8"), ("1.5", "lookup", "whole"),
    ("girl", "logit_bias_text", "TEXT=biases"), ("=5", "logit_bias_text", "TEXT=biases"),
    ("girl=", "logit_bias_text", "TEXT=biases"), ("girl=lots", "logit_bias_text", "not a number"),
    ("girl=500", "logit_bias_text", "between"), ("girl=inf", "logit_bias_text", "finite"),
    ("girl=-100:100:10", "logit_bias_text", "at most 8"), ("maybe", "constraint", "on and off"),
    ("", "constraint", "on, off"),
])
def test_parse_sweep_errors_for_the_other_knobs(text, param, needle):
    with pytest.raises(SettingsError, match=needle):
        parse_sweep(text, param)


def test_settings_label():
    a = {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 7}
    assert settings_label(a) == "T 0.7 · top-p 0.9 · top-k 0 · seed 7"
    assert settings_label({**a, "top_p": 0.5}, differs_from=a) == "top-p 0.5"
    assert settings_label(a, differs_from=a) == "T 0.7"


def test_text_diff_aligns_lanes_of_different_tokenizers_by_text():
    # Same text, cut into tokens differently: identical by text.
    d = text_diff("Once upon a time", ["Once", " upon", " a", " time"])
    assert d.divergence is None and not any(d.changed) and d.removed == 0
    d = text_diff("Once upon a time", ["On", "ce up", "on a t", "ime"])
    assert d.divergence is None and not any(d.changed)
    # Departs inside the third token ("a" -> "the"): that token is the divergence.
    d = text_diff("Once upon a time there", ["Once", " upon", " the", " time", " there"])
    assert d.divergence == 2 and d.changed == (False, False, True, False, False)
    assert d.removed == 2  # the baseline's " a" (words keep the space before them)
    # A token that added no text yet (held back) is never marked.
    d = text_diff("ab", ["a", "", "c"])
    assert d.divergence == 2 and d.changed == (False, False, True)
    # A strict prefix departs where it ends.
    d = text_diff("Once upon", ["Once"])
    assert d.divergence == 1 and d.changed == (False,) and d.removed == len(" upon")
    d = text_diff("", [])
    assert d.divergence is None
    # Text that re-aligns after a change counts as unchanged, whatever the token cuts.
    d = text_diff("the cat sat on the mat", ["the", " dog", " sa", "t on", " the", " mat"])
    assert d.divergence == 1 and d.changed == (False, True, False, False, False, False)
    # Without alignment (a reply still streaming): everything from the divergence on.
    d = text_diff("the cat sat on the mat", ["the", " dog", " sa", "t on", " the", " mat"], align=False)
    assert d.divergence == 1 and d.changed == (False, True, True, True, True, True)
