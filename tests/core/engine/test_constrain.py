"""Constrained generation: JSON schema / regex / grammar lanes always produce matching
output on real models, the mask is applied before the filters, and bad constraints are
typed errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch

from core.checkpoints import load
from core.engine.constrain import Vocabulary, allowed_tokens, new_bitmask
from core.engine.constraint import Constraint
from core.engine.engine import Engine
from core.engine.events import Done, Token
from core.errors import ConstraintError, SettingsError
from core.engine.sampling import apply_bitmask, choose_tokens, sample, seeded_generator
from core.engine.settings import SamplingParams

DEMO = Path(__file__).resolve().parents[3] / "assets" / "models" / "llamadesk-demo"

# Short, bounded schema: compact JSON of it is at most ~32 bytes, so 40 tokens always finish it.
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
WORD_NUMBER = r"[A-Z][a-z]{2,6} (is|was) [0-9]{1,3}"


@pytest.fixture(scope="module")
def story(fixtures):
    lm = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    return lm, Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)


@pytest.fixture(scope="module")
def demo():
    lm = load(DEMO, device="cpu", dtype="float32")
    return lm, Engine(lm.model, lm.tokenizer, stop_ids=sorted(lm.stop_ids))


def run_seeds(engine, prompt, constraint, seeds, **kw) -> list[Done]:
    """All seeds, eight lanes per batched call (one bitmask per step for the eight)."""
    done = []
    for at in range(0, len(seeds), 8):
        params = [SamplingParams(temperature=1.0, top_p=0.95, seed=s, constraint=constraint, **kw)
                  for s in seeds[at:at + 8]]
        evs = list(engine.generate_lanes(prompt, params))
        done += sorted((e for e in evs if isinstance(e, Done)), key=lambda d: d.lane)
    return done


@pytest.mark.parametrize("which", ["story", "demo"])
def test_json_schema_lanes_always_validate_over_100_seeds(which, request):
    lm, eng = request.getfixturevalue(which)
    prompt = (lm.tokenizer.encode("Once upon a time", bos=True) if which == "story" else
              lm.chat_format.encode_dialog([{"role": "user", "content": "Tell me about a dog named Max."}]))
    done = run_seeds(eng, prompt, Constraint("json_schema", json.dumps(PERSON)), list(range(100)),
                     max_new_tokens=40)
    assert len(done) == 100
    for d in done:
        assert d.stop_reason == "eos", (d.stop_reason, d.text)
        jsonschema.validate(json.loads(d.text), PERSON)
    assert len({d.text for d in done}) > 10  # the seeds really sampled different outputs
    # Without the constraint the same lanes write stories, not JSON: the mask did the work.
    free = run_seeds(eng, prompt, None, list(range(8)), max_new_tokens=40)
    assert not any(d.text.startswith("{") for d in free)


def test_json_object_any_object(story):
    """response_format json_object: any object. The story model never closes an unbounded
    one within its tokens, so the grammar's acceptance is checked on given outputs."""
    lm, eng = story
    done = run_seeds(eng, lm.tokenizer.encode("Once upon a time", bos=True), Constraint("json_object"),
                     list(range(8)), max_new_tokens=20)
    assert all(d.text.startswith("{") and "\n" not in d.text for d in done)
    for text, ok in [('{"a": [1, 2.5, null], "b": {"c": "d"}}', True), ("[1, 2]", False), ('{"a" 1}', False)]:
        state = eng.vocabulary.start(Constraint("json_object"), eng.default_stop_ids)
        ids = eng.vocabulary.lltokenizer().tokenize_str(text)
        assert (all(state.advance(t) for t in ids) and state.accepting) is ok


def test_regex_lanes_match(story):
    lm, eng = story
    done = run_seeds(eng, lm.tokenizer.encode("Once upon a time", bos=True), Constraint("regex", WORD_NUMBER),
                     list(range(24)), max_new_tokens=30)
    for d in done:
        assert d.stop_reason == "eos" and re.fullmatch(WORD_NUMBER, d.text), (d.stop_reason, d.text)


@pytest.mark.parametrize("grammar", [
    'root ::= "The " animal " is " ("big" | "small") "."\nanimal ::= "cat" | "dog" | "bird"',  # GBNF
    'start: "The " ANIMAL " is " SIZE "."\nANIMAL: "cat" | "dog" | "bird"\nSIZE: "big" | "small"',  # Lark
])
def test_grammar_lanes_match_gbnf_and_lark(story, grammar):
    lm, eng = story
    done = run_seeds(eng, lm.tokenizer.encode("Once upon a time", bos=True), Constraint("grammar", grammar),
                     list(range(8)), max_new_tokens=30)
    for d in done:
        assert d.stop_reason == "eos" and re.fullmatch(r"The (cat|dog|bird) is (big|small)\.", d.text), d.text


def test_greedy_constrained_lane_is_the_best_allowed_token_each_step(story):
    """Greedy under a constraint = argmax over the allowed tokens at every step (the mask
    comes before the filters), recomputed here from the model's own logits."""
    lm, eng = story
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    c = Constraint("regex", WORD_NUMBER)
    d = [e for e in eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=30, constraint=c))
         if isinstance(e, Done)][0]
    state = eng.vocabulary.start(c, eng.default_stop_ids)
    ids = list(prompt)
    for tok in d.tokens + [d.stop_token]:
        with torch.inference_mode():
            logits = _full_logits(lm.model, ids)
        row = new_bitmask(1, logits.numel())
        state.mask(row[0])
        allowed = allowed_tokens(row[0], logits.numel())
        assert int(logits.masked_fill(~allowed, float("-inf")).argmax()) == tok
        assert state.advance(tok)
        ids.append(tok)


def _full_logits(model, ids):
    from core.model.kv_cache import KVCache
    cache = KVCache.for_model(model)
    cache.ensure(1, len(ids) + 1)
    return model(torch.tensor([ids]), 0, cache, last_only=True)[0, -1]


def test_state_hook_mask_advance_rollback_and_eos_only_when_accepting(story):
    lm, eng = story
    V = lm.model.args.vocab_size
    state = eng.vocabulary.start(Constraint("regex", "(the|a) (dog|cat)"), eng.default_stop_ids)
    eos = sorted(eng.default_stop_ids)

    def allowed():
        row = new_bitmask(1, V)
        state.mask(row[0])
        return allowed_tokens(row[0], V)

    assert not any(allowed()[t] for t in eos)
    leading_space = lm.tokenizer.encode("the dog")[0]  # SentencePiece's dummy prefix: " the"
    assert lm.tokenizer.token_bytes(leading_space).startswith(b" ") and not allowed()[leading_space]
    ids = eng.vocabulary.lltokenizer().tokenize_str("the dog")
    assert b"".join(lm.tokenizer.token_bytes(t) for t in ids) == b"the dog" and len(ids) >= 2
    for t in ids[:-1]:
        assert allowed()[t] and state.advance(t)
    assert not state.accepting and not any(allowed()[t] for t in eos)  # a prefix does not match
    assert allowed()[ids[-1]] and state.advance(ids[-1])
    assert state.accepting and all(allowed()[t] for t in eos)
    state.rollback(1)  # a rejected draft token
    assert not state.accepting and not any(allowed()[t] for t in eos)
    branch = state.copy()
    assert branch.advance(ids[-1]) and branch.accepting
    assert not state.accepting  # the copy moved, the original did not
    assert not state.advance(leading_space) and state.error  # a forbidden token: refused


def test_choose_tokens_applies_the_mask_before_the_filters():
    """Batched constrained choice = the reference sampler on logits with the forbidden
    tokens at -inf, row by row with the same generators (lanes of different settings)."""
    g = torch.Generator().manual_seed(0)
    B, V = 4, 3000
    params = [SamplingParams(temperature=0.9, top_p=0.8, seed=1), SamplingParams(temperature=0),
              SamplingParams(temperature=1.3, top_k=20, min_p=0.05, seed=2), SamplingParams(temperature=1.0, top_p=1.0, seed=3)]
    for trial in range(20):
        logits = torch.randn(B, V, generator=g) * 3
        bitmask = torch.randint(-2**31, 2**31 - 1, (B, (V + 31) // 32), generator=g, dtype=torch.int64).to(torch.int32)
        if trial % 2:
            bitmask[:, : -4] = 0  # a constraint that leaves only a few tokens
        bitmask[3] = -1  # an unconstrained lane beside constrained ones
        allowed = allowed_tokens(bitmask, V)
        assert torch.equal(apply_bitmask(logits, bitmask) == float("-inf"), ~allowed)
        gens = [seeded_generator(q) for q in params]
        got = choose_tokens(logits, params, [None] * B, gens, bitmask=bitmask)
        ref_gens = [seeded_generator(q) for q in params]
        want = [sample(logits[i].masked_fill(~allowed[i], float("-inf")), q, rg)
                for i, (q, rg) in enumerate(zip(params, ref_gens))]
        assert got.ids == want
        assert all(allowed[i, t] for i, t in enumerate(got.ids))
        raw = logits.log_softmax(-1)
        assert got.logprobs == pytest.approx([float(raw[i, t]) for i, t in enumerate(got.ids)], abs=1e-5)


def test_inspector_names_the_tokens_the_constraint_removed(story):
    lm, eng = story
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    c = Constraint("json_schema", json.dumps(PERSON))
    toks = [e for e in eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=40, constraint=c), inspect=5)
            if isinstance(e, Token)]
    first = toks[0].top
    # The story model wants "," after "Once upon a time"; JSON must start with "{".
    assert first["raw"][0][0] in first["constrained"]
    assert first["filtered"][0][0] == toks[0].token_id and toks[0].piece == "{"
    assert all(i not in first["constrained"] for i, _ in first["filtered"])
    unconstrained = [e for e in eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=2), inspect=5)
                     if isinstance(e, Token)][0].top
    assert "constrained" not in unconstrained


@pytest.mark.parametrize("constraint, words", [
    (Constraint("json_schema", "{not json"), "not valid JSON"),
    (Constraint("json_schema", '{"type": "objectx"}'), "cannot be compiled"),
    (Constraint("json_schema", "[1, 2]"), "must be a JSON object"),
    (Constraint("regex", "[a-"), "regular expression cannot be compiled"),
    (Constraint("grammar", 'root ::= "yes |'), "grammar cannot be read"),
    (Constraint("grammar", "start: undefined_rule"), "grammar cannot be compiled"),
    (Constraint("grammar", "start: start"), "grammar allows no output"),  # compiles, matches nothing
    (Constraint("regex", ""), "is empty"),
    (Constraint("xml", "<a/>"), "unknown constraint kind"),
])
def test_uncompilable_constraints_are_typed_errors_before_anything_runs(story, constraint, words):
    lm, eng = story
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    with pytest.raises(ConstraintError, match=words) as err:
        eng.generate_lanes(prompt, [SamplingParams(constraint=constraint)])
    assert isinstance(err.value, SettingsError) and "\n" not in str(err.value)


def test_constraint_round_trips_through_settings_and_refuses_beams():
    c = Constraint("regex", "[0-9]+")
    p = SamplingParams(seed=3, constraint=c)
    d = p.to_dict()
    assert d["constraint"] == {"kind": "regex", "text": "[0-9]+"}
    assert SamplingParams.from_dict(json.loads(json.dumps(d))) == p
    assert SamplingParams(constraint={"kind": "regex", "text": "x"}).constraint == Constraint("regex", "x")
    with pytest.raises(SettingsError, match="beam"):
        SamplingParams(num_beams=2, constraint=c).validate()


@pytest.mark.parametrize("name, size", [("llama2_kind_tokenizer", 32000), ("llama3_kind_tokenizer", 128256)])
def test_real_vocabularies_allow_a_valid_output_token_by_token(request, name, size):
    """With Llama 2's SentencePiece and Llama 3's tiktoken vocabularies (Meta's files where
    present, else ones of their kind and size), the tokenizer's own encoding of a valid output
    is allowed at every step and ends accepting; an invalid one is refused where it goes
    wrong, and special tokens are never allowed."""
    from core.tokenizer import load_tokenizer
    tok = load_tokenizer(request.getfixturevalue(name))
    assert tok.vocab_size == size
    vocab = Vocabulary(tok, size)
    c = Constraint("json_schema", json.dumps(PERSON))
    text = '{"name": "Max", "age": 7}'
    ids = tok.encode(text)
    if tok.kind == "sentencepiece":  # encode adds the dummy-prefix space; JSON has none
        ids = vocab.lltokenizer().tokenize_str(text)
    assert b"".join(tok.token_bytes(t) for t in ids) == text.encode()
    state = vocab.start(c, tok.stop_ids)
    row = new_bitmask(1, size)
    for t in ids:
        state.mask(row[0])
        allowed = allowed_tokens(row[0], size)
        assert allowed[t], tok.token_bytes(t)
        assert not any(allowed[s] for s in tok.special_tokens.values() if s not in tok.stop_ids)
        assert state.advance(t)
    state.mask(row[0])
    assert state.accepting and all(allowed_tokens(row[0], size)[s] for s in tok.stop_ids)
    bad = vocab.start(c, tok.stop_ids)
    wrong = vocab.lltokenizer().tokenize_str('{"name": 7')
    assert not all(bad.advance(t) for t in wrong)


def run_cli(capsys, *argv):
    from core.cli.main import main
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_generate_and_compare_hold_lanes_to_their_constraints(capsys, fixtures, tmp_path):
    model = fixtures / "stories260K.gguf"
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    rc, out, err = run_cli(capsys, "generate", model, "--prompt", "Once upon a time", "--json-schema", f"@{schema}",
                           "--max-new-tokens", 40, "--seed", 1, "--json")
    assert rc == 0, err
    jsonschema.validate(json.loads(json.loads(out)["text"]), PERSON)
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once upon a time", "--max-new-tokens", 30,
                           "--regex", WORD_NUMBER, "--lane", "temperature=0", "--lane", "temperature=1,seed=4",
                           "--lane", f"temperature=1,seed=5,json_schema=@{schema}", "--lane", "temperature=0,constraint=none",
                           "--json")
    assert rc == 0, err
    lanes = json.loads(out)["lanes"]
    assert all(re.fullmatch(WORD_NUMBER, ln["text"]) for ln in lanes[:2])
    assert lanes[0]["settings"]["constraint"] == {"kind": "regex", "text": WORD_NUMBER}
    jsonschema.validate(json.loads(lanes[2]["text"]), PERSON)
    assert lanes[2]["settings"]["constraint"]["kind"] == "json_schema"
    assert lanes[3]["settings"]["constraint"] is None and lanes[3]["text"].startswith(", there was")


@pytest.mark.parametrize("args, words", [
    (["--json-schema", '{"type": "objectx"}'], "JSON schema cannot be compiled"),
    (["--json-schema", "{oops"], "not valid JSON"),
    (["--regex", "[a-"], "regular expression cannot be compiled"),
    (["--grammar", "start: nowhere"], "grammar cannot be compiled"),
    (["--grammar", "@/no/such/grammar.gbnf"], "grammar.gbnf"),
    (["--regex", "a", "--grammar", "b"], "not allowed with"),
])
def test_cli_bad_constraint_exits_2_with_one_line(capsys, fixtures, args, words):
    rc, out, err = run_cli(capsys, "generate", fixtures / "stories260K.gguf", "--prompt", "Hi", *args)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err


def test_a_chat_reply_through_the_worker_is_held_and_a_bad_one_is_an_error_event(make_worker):
    """The app's path: a chat request with the panel's constraint reaches the engine through
    the worker; one that cannot compile comes back as one Error event, and the worker goes on."""
    from core.worker.protocol import Error, GenerateRequest
    w, col = make_worker()
    w.load(str(DEMO))
    schema = json.dumps(PERSON)
    gid = w.generate(GenerateRequest(mode="chat", messages=[{"role": "user", "content": "Tell me about Max."}],
                                     params=SamplingParams(temperature=1.0, seed=2, max_new_tokens=40,
                                                           constraint=Constraint("json_schema", schema))))
    done = col.finished(gid)[-1]
    assert isinstance(done, Done) and done.stop_reason == "eos"
    jsonschema.validate(json.loads(done.text), PERSON)
    bad = w.generate(GenerateRequest(mode="chat", messages=[{"role": "user", "content": "Hi"}],
                                     params=SamplingParams(constraint=Constraint("regex", "(a|b"))))
    err = col.wait(lambda evs: [e for e in evs if e.request_id == bad and isinstance(e, Error)])[-1]
    assert "regular expression cannot be compiled" in err.message and "\n" not in err.message
    again = w.generate(GenerateRequest(mode="chat", messages=[{"role": "user", "content": "Hi"}],
                                       params=SamplingParams(temperature=0, max_new_tokens=4)))
    assert isinstance(col.finished(again)[-1], Done)


def test_a_json_reply_cut_at_the_token_limit_continues_inside_its_object(story):
    """Continue on a constrained reply that stopped on length: the output format starts
    past the text so far, so the two parts together are one valid object (issue 22)."""
    lm, eng = story
    constraint = Constraint("json_schema", json.dumps(PERSON))
    prompt = lm.tokenizer.encode("Once upon a time", bos=True)
    for seed in range(4):
        cut = list(eng.generate(prompt, SamplingParams(temperature=1.0, seed=seed, max_new_tokens=4,
                                                       constraint=constraint)))[-1]
        assert cut.stop_reason == "length" and cut.text.startswith("{")
        rest = list(eng.generate(prompt + [int(t) for t in cut.tokens],
                                 SamplingParams(temperature=1.0, seed=seed, max_new_tokens=40, constraint=constraint),
                                 continued=cut.text))[-1]
        assert rest.stop_reason == "eos" and not rest.text.startswith("{"), rest.text
        jsonschema.validate(json.loads(cut.text + rest.text), PERSON)
    with pytest.raises(ConstraintError, match="does not match"):
        list(eng.generate(prompt, SamplingParams(max_new_tokens=4, constraint=constraint), continued="Once"))
