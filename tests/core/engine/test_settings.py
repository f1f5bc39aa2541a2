"""The settings schema, walked: each numeric setting's declared range is exactly what
every surface built from it accepts (SamplingParams, the sweep parser, the lane-spec
parser, the CLI's flags, serve's request fields; the panel's controls are checked in
tests/gui/settings/test_panel_schema.py), and the client sends each setting only to the
servers the schema says take it."""
from __future__ import annotations

import dataclasses
import math

import pytest

from core.cli.main import UsageError, build_parser
from core.engine.lanes import LANE_KEYS, SPEC_SETTINGS, SWEEP_KEYS, SWEEP_OTHER, SWEEP_PARAMS, parse_lane_spec, \
    parse_sweep
from core.engine.settings import BACKENDS, LLAMADESK, LOCAL, NUMBERS, OPENAI, SCHEMA, SETTINGS, SamplingParams
from core.errors import SettingsError
from core.remote.client import Capabilities, RemoteError, RemoteModel
from core.serving.protocol import APIError, sampling_from_request

BIG = 10 ** 9  # "no upper bound" tried this far up


def edges(s) -> tuple[list, list]:
    """(values just inside the range at both ends, values just outside it)."""
    tick = 1 if s.kind is int else 1e-9  # 1e-9 survives a sweep's rounding to 10 decimals
    inside = [s.lo + tick if s.lo_open else s.lo]
    outside = [s.lo if s.lo_open else s.lo - tick]
    if s.hi is None:
        inside.append(s.kind(BIG))
    else:
        inside.append(s.hi - tick if s.hi_open else s.hi)
        outside.append(s.hi if s.hi_open else s.hi + tick)
    return inside, outside


def text(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


CASES = [(s.name, v, ok) for s in NUMBERS for ok, vs in zip((True, False), edges(s)) for v in vs]


def test_the_schema_declares_every_sampling_field_once_with_its_default():
    fields = {f.name: f for f in dataclasses.fields(SamplingParams)}
    assert set(SCHEMA) == set(fields) and len(SCHEMA) == len(SETTINGS)
    defaults = SamplingParams()
    for s in SETTINGS:
        assert getattr(defaults, s.name) == s.default, s.name
        assert s.help.strip() and s.label.strip(), s.name
        assert s.backends and set(s.backends) <= set(BACKENDS), s.name
        if s.numeric:
            assert s.accepts(s.default), s.name
            if s.panel:  # a control offers only what validation accepts
                assert all(s.accepts(v) for v in s.widget_range()), s.name


def test_lane_and_sweep_keys_come_from_the_schema():
    assert LANE_KEYS == ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "max_new_tokens",
                         "num_beams", "length_penalty", "lookup", "draft", "constraint", "tool_choice",
                         "tool_constraint", "logit_bias_text")
    assert set(SWEEP_KEYS) == {s.name for s in SETTINGS if s.sweep}
    assert set(SWEEP_OTHER) == {s.name for s in SETTINGS if s.sweep and not s.numeric}


@pytest.mark.parametrize("name, value, ok", CASES)
def test_sampling_params_accept_exactly_the_declared_range(name, value, ok):
    p = SamplingParams(**{name: value})
    if ok:
        p.validate()
    else:
        with pytest.raises(SettingsError, match=name):
            p.validate()


@pytest.mark.parametrize("name, value, ok", [c for c in CASES if SCHEMA[c[0]].sweep])
def test_the_sweep_parser_accepts_exactly_the_declared_range(name, value, ok):
    if ok:
        assert parse_sweep(text(value), name) == [value]
    else:
        with pytest.raises(SettingsError, match=name):
            parse_sweep(text(value), name)


@pytest.mark.parametrize("name, value, ok", [c for c in CASES if c[0] in SPEC_SETTINGS])
def test_the_lane_spec_parser_accepts_exactly_the_declared_range(name, value, ok):
    spec = f"{name}={text(value)}"
    if ok:
        assert parse_lane_spec(spec) == {name: value}
        SamplingParams(**parse_lane_spec(spec)).validate()
    else:
        with pytest.raises(SettingsError, match=f"^{name} must be"):
            parse_lane_spec(spec)


def test_every_sweepable_number_and_lane_number_is_covered():
    assert set(SWEEP_PARAMS) == {s.name for s in NUMBERS if s.sweep}
    assert {n for n, s in SPEC_SETTINGS.items() if s.numeric} == {s.name for s in NUMBERS if s.lane}


@pytest.mark.parametrize("s", NUMBERS, ids=lambda s: s.name)
def test_a_range_error_says_the_range(s):
    _, outside = edges(s)
    with pytest.raises(SettingsError) as e:
        s.check(outside[0])
    assert str(e.value).startswith(f"{s.name} must be {s.range_text()}, got ")
    with pytest.raises(SettingsError, match=s.name):
        s.check("7")  # text is not a number
    with pytest.raises(SettingsError, match=s.name):
        s.check(True)  # nor is a bool
    if s.kind is float:
        with pytest.raises(SettingsError, match=s.name):
            s.check(math.nan)
    else:
        with pytest.raises(SettingsError, match=s.name):
            s.check(s.lo + 0.5 if s.lo is not None else 0.5)


def test_the_client_sends_each_setting_where_the_schema_says_it_runs():
    """OpenAI's own fields go to every server; the rest only where the probe saw them
    honoured; this app's extensions only to a LlamaDesk server; local-only ones never."""
    other, ours = RemoteModel("http://127.0.0.1:9", model="m"), RemoteModel("http://127.0.0.1:9", model="m")
    other.card, ours.card = {"id": "m"}, {"id": "m", "llamadesk": {}}
    on = SamplingParams(temperature=0.5, top_p=0.5, top_k=5, min_p=0.1, repetition_penalty=1.2, seed=3,
                        max_new_tokens=7, num_beams=2, length_penalty=0.5)
    probed = {s.name for s in SETTINGS if s.probed}
    assert probed <= set(Capabilities.FIELDS)
    other.caps = Capabilities()  # the probe saw nothing honoured
    sent = other.body(on, prompt="x")
    other.caps = Capabilities(**{f: True for f in Capabilities.FIELDS})
    sent_all = other.body(on, prompt="x")
    for s in NUMBERS:
        if s.backends == {LOCAL}:
            assert s.request_field not in sent_all, s.name
        elif s.probed:
            assert s.request_field not in sent and s.request_field in sent_all, s.name
        elif OPENAI in s.backends:
            assert s.request_field in sent, s.name
    extensions = {"lookup": 2, "draft": "/m/small.gguf", "logit_bias_text": ("girl=-5",), "tool_constraint": False}
    assert set(extensions) == {s.name for s in SETTINGS if s.backends == {LOCAL, LLAMADESK} and not s.probed}
    for name, value in extensions.items():
        with pytest.raises(RemoteError) as e:
            other.body(SamplingParams(**{name: value}), prompt="x")
        assert e.value.kind == "unsupported" and name in str(e.value)
        assert name in ours.body(SamplingParams(**{name: value}), prompt="x")


@pytest.mark.parametrize("name, value, ok", [c for c in CASES if LLAMADESK in SCHEMA[c[0]].backends])
def test_serve_accepts_exactly_the_declared_range(name, value, ok):
    s = SCHEMA[name]
    body = {s.request_field: value}
    if value == s.api_off:  # a request's declared word for off (vLLM's top_k -1)
        [p] = sampling_from_request(body, default_max_tokens=16)
        assert getattr(p, name) == s.off
    elif ok:
        [p] = sampling_from_request(body, default_max_tokens=16)
        assert getattr(p, name) == value
    else:
        with pytest.raises(APIError) as e:
            sampling_from_request(body, default_max_tokens=16)
        assert e.value.status == 400 and e.value.param == s.request_field and s.request_field in str(e.value)


def test_serve_takes_openai_defaults_and_vllm_off():
    [p] = sampling_from_request({}, default_max_tokens=16)
    assert (p.temperature, p.top_p, p.max_new_tokens) == (1.0, 1.0, 16)  # OpenAI's defaults, not the app's
    [p] = sampling_from_request({"top_k": -1, "max_completion_tokens": 3}, default_max_tokens=16)
    assert (p.top_k, p.max_new_tokens) == (0, 3)
    with pytest.raises(APIError) as e:
        sampling_from_request({"max_completion_tokens": 0}, default_max_tokens=16)
    assert e.value.param == "max_completion_tokens"


@pytest.mark.parametrize("name, value, ok", [c for c in CASES if SCHEMA[c[0]].flag])
def test_the_cli_flags_accept_exactly_the_declared_range(name, value, ok):
    s = SCHEMA[name]
    argv = ["generate", "model.gguf", "--prompt", "x", f"{s.flag_name}={text(value)}"]
    if ok:
        assert getattr(build_parser().parse_args(argv), name) == value
    else:
        with pytest.raises(UsageError, match=f"argument {s.flag_name}: {name} must be"):
            build_parser().parse_args(argv)


def test_the_cli_flags_say_their_range_and_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    text = capsys.readouterr().out
    for s in SETTINGS:
        if s.flag and s.numeric:
            assert s.flag_name in text, s.name
    assert "(between 0 (exclusive) and 1; default 0.95)" in " ".join(text.split())
