"""Constraints that are too big or pathological end as a ConstraintError with one line, up
front where the grammar engine can tell (a regex past MAX_REGEX_CHARS, a schema nested past
MAX_SCHEMA_DEPTH, a repetition that exhausts llguidance's lexer a token in), else as a reply
that stops with its reason said: in the engine (Done.error), the CLI (exit 2, one stderr line)
and serve (a 400 naming the field). Never a traceback, a hang or a 500."""
import json

import httpx
import pytest

from core.cli.main import main
from core.checkpoints import load
from core.engine.constrain import Vocabulary
from core.engine.constraint import MAX_REGEX_CHARS, MAX_SCHEMA_DEPTH, Constraint, from_argument, json_depth, syntax_error
from core.engine.engine import Engine
from core.engine.events import Done
from core.errors import ConstraintError
from core.engine.settings import SamplingParams
from core.serving.run import RunningServer
from core.serving.state import ServerState

pytestmark = pytest.mark.timeout(180)
# Compiles, and its first masks are fine; ~29 tokens of "a" in, llguidance's lexer runs out
# of expressions (its limit, not ours): the reply must stop saying so.
LATE = "((a{1,50}){1,50}){1,50}"


def nested_schema(depth: int) -> str:
    return '{"type": "object", "required": ["a"], "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


@pytest.fixture(scope="module")
def stories(fixtures):
    return load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def vocab(stories):
    return Vocabulary(stories.tokenizer, stories.model.args.vocab_size)


@pytest.mark.parametrize("kind,text,needle", [
    ("regex", "a" * 100_000, f"at most {MAX_REGEX_CHARS:,} are accepted"),
    ("regex", "(ab|cd)" * (MAX_REGEX_CHARS // 7 + 1), f"at most {MAX_REGEX_CHARS:,} are accepted"),
    ("regex", "a{99999999}", "too big for the grammar engine"),
    ("json_schema", nested_schema(MAX_SCHEMA_DEPTH + 1), f"nested {2 * (MAX_SCHEMA_DEPTH + 1) + 1} levels deep"),
    ("json_schema", "[" * 40_000 + "]" * 40_000, "nested 40,000 levels deep"),
    ("json_schema", '{"type": "array", "items": ' * 300 + "{}" + "}" * 300, "nested 301 levels deep"),
])
def test_pathological_constraints_are_one_line_constraint_errors(vocab, kind, text, needle):
    with pytest.raises(ConstraintError) as e:
        vocab.check(Constraint(kind, text))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and len(msg) < 400, msg
    # The settings panel's as-you-type check refuses the same ones it can see without a vocabulary.
    if "grammar engine" not in needle:
        assert needle in syntax_error(Constraint(kind, text))


def test_the_bounds_leave_room_for_what_people_write(vocab, stories):
    vocab.check(Constraint("regex", "a" * MAX_REGEX_CHARS))  # exactly the bound compiles
    vocab.check(Constraint("json_schema", nested_schema(MAX_SCHEMA_DEPTH // 2 - 1)))
    eng = Engine(stories.model, stories.tokenizer, stop_ids=stories.stop_ids)
    ids = stories.tokenizer.encode("Once upon a time", bos=True)
    d = [e for e in eng.generate(ids, SamplingParams(temperature=0, max_new_tokens=12,
                                                     constraint=Constraint("regex", "(x|y){0,9999}")))
         if isinstance(e, Done)][0]
    assert d.stop_reason == "length" and set(d.text) <= {"x", "y"} and d.error == ""


def test_json_depth_counts_brackets_outside_strings_only():
    assert json_depth('{"a": [1, {"b": "[[[{{{"}], "c": "\\"]"}') == 3
    assert json_depth("[]") == 1 and json_depth('"x"') == 0


def test_a_constraint_that_runs_out_of_the_engines_limits_mid_reply_says_so(stories):
    eng = Engine(stories.model, stories.tokenizer, stop_ids=stories.stop_ids)
    ids = stories.tokenizer.encode("Once upon a time", bos=True)
    d = [e for e in eng.generate(ids, SamplingParams(temperature=0, max_new_tokens=60,
                                                     constraint=Constraint("regex", LATE))) if isinstance(e, Done)][0]
    assert d.stop_reason == "error" and 4 < len(d.tokens) < 60 and set(d.text) == {"a"}
    assert d.error.startswith("the regular expression went past the grammar engine's limits mid-reply")
    assert "\n" not in d.error


@pytest.mark.parametrize("argv,needle,partial", [
    (["--regex", "a{99999999}"], "too big for the grammar engine", False),
    (["--regex", "b" * 20_000], "at most 10,000", False),
    (["--json-schema", nested_schema(200)], "levels deep", False),
    (["--regex", LATE], "went past the grammar engine's limits mid-reply", True),
])
def test_cli_exits_2_with_one_line(capsys, fixtures, argv, needle, partial):
    rc = main(["generate", str(fixtures / "stories260K.gguf"), "--prompt", "Once upon a time", "--temperature", "0",
               "--max-new-tokens", "60", *argv])
    out, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    assert "Traceback" not in err
    assert (out.strip() != "" and set(out.strip()) == {"a"}) if partial else out == ""


def test_cli_compare_names_the_lane_that_failed_and_keeps_the_others(capsys, fixtures, tmp_path):
    (tmp_path / "late.re").write_text(LATE)  # a lane spec splits at commas: the regex comes from a file
    rc = main(["compare", str(fixtures / "stories260K.gguf"), "--prompt", "Once upon a time", "--max-new-tokens", "40",
               "--lane", "temperature=0", "--lane", f"temperature=0,regex=@{tmp_path / 'late.re'}", "--json"])
    out, err = capsys.readouterr()
    lanes = json.loads(out)["lanes"]
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: lane 2: the regular expression went past"), err
    assert lanes[0]["stop_reason"] == "length" and "error" not in lanes[0]
    assert lanes[1]["stop_reason"] == "error" and lanes[1]["error"] in err


def test_from_argument_refuses_an_oversized_regex_file(tmp_path):
    f = tmp_path / "big.re"
    f.write_text("a" * (MAX_REGEX_CHARS + 1))
    with pytest.raises(ConstraintError, match="at most 10,000"):
        from_argument("regex", "@" + str(f))


@pytest.fixture(scope="module")
def server(fixtures):
    with RunningServer(ServerState(load(fixtures / "stories260K.gguf", device="cpu", dtype="float32"))) as s:
        yield s


@pytest.mark.parametrize("body,param,needle", [
    ({"regex": "a" * 100_000}, "regex", "at most 10,000"),
    ({"regex": "a{99999999}"}, "regex", "too big for the grammar engine"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": json.loads(nested_schema(100))}}},
     "response_format", "levels deep"),
    ({"json_schema": json.loads(nested_schema(100))}, "json_schema", "levels deep"),
    ({"regex": LATE}, "regex", "went past the grammar engine's limits mid-reply"),
])
def test_serve_answers_400_naming_the_field(server, body, param, needle):
    for path, base in (("/completions", {"prompt": "Once upon a time"}),
                       ("/chat/completions", {"messages": [{"role": "user", "content": "Once upon a time"}]})):
        r = httpx.post(server.url + path, json={**base, "max_tokens": 60, "temperature": 0, **body}, timeout=120)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and needle in err["message"] and "\n" not in err["message"]


def test_serve_streams_what_it_had_then_the_error_naming_the_field(server):
    body = {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "regex": LATE, "stream": True}
    with httpx.stream("POST", server.url + "/completions", json=body, timeout=120) as r:
        data = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    text = "".join(d["choices"][0]["text"] for d in data if d.get("choices"))
    assert set(text) == {"a"} and data[-1]["error"]["param"] == "regex"
    assert "went past the grammar engine's limits" in data[-1]["error"]["message"]


def test_serve_refuses_a_body_nested_past_the_json_reader_with_400(server):
    raw = '{"prompt": "x", "regex": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(server.url + "/completions", content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "too deeply" in r.json()["error"]["message"]


def test_the_walk_ahead_picks_the_lowest_allowed_token_but_the_ones_left_out():
    import random

    from core.engine.constrain import _lowest_token, allowed_tokens, new_bitmask
    rng = random.Random(1)
    for _ in range(200):
        size = rng.choice([40, 512, 1000, 128256])
        row = new_bitmask(1, size)[0]
        row.zero_()
        allowed = rng.sample(range(size), rng.randint(0, 5))
        words = row.numpy().view("uint32")
        for t in allowed:
            words[t >> 5] |= 1 << (t & 31)  # bit 31 too: the words are int32 underneath
        but = rng.sample(allowed, min(len(allowed), rng.randint(0, 2)))
        want = allowed_tokens(row, size).clone()
        want[but] = False
        assert _lowest_token(row, but) == (int(want.nonzero()[0, 0]) if bool(want.any()) else None)
