"""Speculative decoding: same tokens as plain greedy decoding, the same distribution as
plain sampling (chi-square at a fixed prefix), KV cache rollback, cancel, bad settings."""
import threading

import pytest
import torch

from core.checkpoints import load
from core.engine.engine import Engine, Joining
from core.engine.events import Done, Prefilled, Token
from core.errors import DraftModelError, SettingsError
from core.model.kv_cache import KVCache
from core.model.transformer import Transformer
from core.model.args import ModelArgs
from core.engine.sampling import filter_logits
from core.engine.settings import SamplingParams
from core.engine import speculative
from core.engine.drafters import NgramIndex
from core.engine.speculative import LOOKUP_MAX_DRAFT, Pace, verify
from tests.core.checkpoints.util import write_tiny_tokenizer


@pytest.fixture(scope="module")
def stories(fixtures):
    return load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tiny(tiny_meta_dir):
    return load(tiny_meta_dir, device="cpu", dtype="float32")


def random_model(vocab: int, dim: int = 32, layers: int = 2, heads: int = 4, kv: int = 2, seed: int = 0,
                 std: float = 0.15, ctx: int = 512) -> Transformer:
    """A random Transformer; std wide enough that its choices are clear (not near-ties)."""
    torch.manual_seed(seed)
    m = Transformer(ModelArgs(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv, vocab_size=vocab,
                              multiple_of=16, max_seq_len=ctx))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.normal_(0, std)
    return m.eval()


def done_of(events) -> Done:
    evs = list(events)
    assert isinstance(evs[-1], Done)
    return evs[-1]


def tokens_of(engine, prompt, **kw):
    return done_of(engine.generate(prompt, SamplingParams(**kw)))


class AlwaysDraft(Pace):
    """Drafts as much as it may at every step, whatever happened before: how often a
    lane drafts never changes what it emits, and this way every step is verified."""

    def __init__(self, most: int, **kw):
        super().__init__(most, **kw)
        self.probing = False

    def next(self) -> int:
        return self.most

    def miss(self) -> None:
        pass


class NeverDraft(Pace):
    """A drafter that never finds it worth drafting (every step undrafted)."""

    def next(self) -> int:
        return 0


@pytest.fixture(params=["paced", "always"])
def pacing(request, monkeypatch):
    """Run a test with the real pacing and with drafts at every step (every verification
    path taken, rejections included, whatever the drafter's record)."""
    if request.param == "always":
        monkeypatch.setattr(speculative, "Pace", AlwaysDraft)
    return request.param


# -- the KV cache rolls back -----------------------------------------------------------

def test_rollback_forgets_rejected_positions_and_guards_its_invariants():
    model = random_model(64, seed=1)
    cache = KVCache.for_model(model, batch=2, capacity=16)
    ids = [1, 5, 9, 2, 7, 3]
    with torch.no_grad():
        model(torch.tensor([ids, ids]), 0, cache)
    cache.tokens[0], cache.tokens[1] = list(ids), list(ids)
    kept = [t[1].clone() for t in cache.k]
    cache.rollback(0, 4)
    assert cache.tokens[0] == ids[:4] and cache.tokens[1] == ids  # only row 0 changed
    for t, before in zip(cache.k + cache.v, kept + kept):
        assert not t[0, :, 4:6].any()  # the rejected slots hold nothing any more
    for t, before in zip(cache.k, kept):
        assert torch.equal(t[1], before)
    with pytest.raises(ValueError):
        cache.rollback(0, 5)  # cannot roll forward past what the row holds
    with pytest.raises(ValueError):
        cache.rollback(0, -1)
    with pytest.raises(IndexError):
        cache.rollback(2, 0)
    cache.rollback(0, 4)  # to where it is: nothing happens
    assert cache.tokens[0] == ids[:4]
    # After rolling back, running other tokens gives what a cache that never saw the
    # rejected ones gives.
    fresh = KVCache.for_model(model, capacity=16)
    with torch.no_grad():
        model(torch.tensor([ids[:4]]), 0, fresh)
        a = model(torch.tensor([[11, 12]]), 4, cache.row(0))[0]
        b = model(torch.tensor([[11, 12]]), 4, fresh)[0]
    torch.testing.assert_close(a, b)


# -- prompt lookup ---------------------------------------------------------------------

def test_ngram_index_proposes_what_followed_the_longest_latest_match():
    idx = NgramIndex(3, [1, 2, 3, 4, 5, 9, 2, 3, 6, 7])
    idx.extend([8, 2, 3])
    # "2 3" last occurred followed by 6 7; the 3-gram "8 2 3" never occurred before.
    assert idx.propose(3) == [6, 7, 8]
    idx.extend([4])  # "2 3 4" occurred at the start
    assert idx.propose(2) == [5, 9]
    assert NgramIndex(2, [1, 2, 3]).propose(4) == []  # the tail never matches itself
    assert NgramIndex(2, [5, 5]).propose(4) == [5]


# -- greedy: the same tokens as plain decoding ----------------------------------------

REPEAT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"


@pytest.mark.parametrize("lookup", [1, 2, 3])
def test_greedy_lookup_equals_plain_on_the_fixture(stories, lookup):
    eng = Engine(stories.model, stories.tokenizer, stop_ids=stories.stop_ids)
    for text in ("Once upon a time", REPEAT):
        prompt = stories.tokenizer.encode(text, bos=True)
        plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=80)
        spec = tokens_of(eng, prompt, temperature=0, max_new_tokens=80, lookup=lookup)
        assert spec.tokens == plain.tokens and spec.text == plain.text
        assert spec.stop_reason == plain.stop_reason
        torch.testing.assert_close(torch.tensor(spec.logprobs), torch.tensor(plain.logprobs), atol=1e-4, rtol=0)
        s = spec.stats.speculative
        assert s["kind"] == "lookup" and 0 <= s["accepted"] <= s["drafted"]
        # Every token came from a verification forward or the prefill.
        assert s["forwards"] + 1 + s["accepted"] >= len(spec.tokens)
    assert s["accepted"] > 0  # the story repeats itself: some drafts were right


def test_greedy_draft_models_equal_plain_on_the_fixture(stories):
    eng = Engine(stories.model, stories.tokenizer, stop_ids=stories.stop_ids)
    eng.add_draft("itself", stories.model, stories.tokenizer)
    eng.add_draft("random", random_model(stories.model.args.vocab_size, seed=3), stories.tokenizer)
    prompt = stories.tokenizer.encode("Once upon a time", bos=True)
    plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=60)
    same = tokens_of(eng, prompt, temperature=0, max_new_tokens=60, draft="itself")
    rand = tokens_of(eng, prompt, temperature=0, max_new_tokens=60, draft="random")
    assert same.tokens == plain.tokens == rand.tokens
    assert same.stats.speculative["acceptance"] == 1.0  # its own drafts are always right
    assert rand.stats.speculative["acceptance"] < 0.5  # a random draft rarely is
    assert same.stats.speculative["forwards"] < len(plain.tokens) // 2


def test_greedy_equals_plain_on_random_checkpoints_with_penalty_and_lanes(tiny, pacing):
    tok = tiny.tokenizer
    eng = Engine(tiny.model, tok, stop_ids=tiny.stop_ids)
    eng.add_draft("small", random_model(tiny.model.args.vocab_size, dim=16, layers=1, heads=2, kv=1, seed=5), tok)
    eng.add_draft("itself", tiny.model, tok)
    prompt = tok.encode(REPEAT, bos=True)
    settings = [dict(temperature=0), dict(temperature=0, repetition_penalty=1.3)]
    for kw in settings:
        plain = tokens_of(eng, prompt, max_new_tokens=40, **kw).tokens
        for spec in (dict(lookup=2), dict(draft="small"), dict(draft="itself")):
            assert tokens_of(eng, prompt, max_new_tokens=40, **kw, **spec).tokens == plain, (kw, spec)
    # Comparison lanes mixing drafters (and none) drift to different positions in one batch.
    lanes = [SamplingParams(temperature=0, max_new_tokens=40, **spec)
             for spec in (dict(), dict(lookup=3), dict(draft="itself"), dict(draft="small"))]
    plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=40).tokens
    dones = [e for e in eng.generate_lanes(prompt, lanes) if isinstance(e, Done)]
    assert [d.tokens for d in sorted(dones, key=lambda d: d.lane)] == [plain] * 4
    # Different prompts side by side sit at different positions from the start.
    prompts = [prompt, tok.encode("Once upon a time there was", bos=True)]
    base = [tokens_of(eng, p, temperature=0, max_new_tokens=30).tokens for p in prompts]
    batch = [e for e in eng.generate_batch(prompts, SamplingParams(temperature=0, max_new_tokens=30, lookup=2))
             if isinstance(e, Done)]
    assert [d.tokens for d in sorted(batch, key=lambda d: d.lane)] == base


def test_context_limit_and_stop_token_inside_accepted_drafts(stories, pacing):
    tok = stories.tokenizer
    prompt = tok.encode(REPEAT, bos=True)
    eng = Engine(stories.model, tok, stop_ids=stories.stop_ids, max_context=len(prompt) + 23)
    eng.add_draft("itself", stories.model, tok)
    plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=200)
    assert plain.stop_reason == "context"
    for spec in (dict(lookup=2), dict(draft="itself")):
        d = tokens_of(eng, prompt, temperature=0, max_new_tokens=200, **spec)
        assert (d.tokens, d.stop_reason) == (plain.tokens, "context")
    # A stop token the drafts run over ends the reply right before it, as in plain decoding.
    eng = Engine(stories.model, tok, stop_ids={plain.tokens[9]})
    eng.add_draft("itself", stories.model, tok)
    plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=200)
    spec = tokens_of(eng, prompt, temperature=0, max_new_tokens=200, draft="itself")
    assert (spec.tokens, spec.stop_reason, spec.stop_token) == (plain.tokens, "eos", plain.stop_token)
    assert len(spec.tokens) < 10


# -- a branch (forced tokens) drafts as well ------------------------------------------

def reference_greedy(model, prompt, n, stop_ids=()):
    """Greedy by full forward passes, no cache: the slow obviously-right way."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            t = int(model(torch.tensor([ids]))[0, -1].argmax())
            if t in stop_ids:
                break
            ids.append(t)
    return ids[len(prompt):]


@pytest.mark.parametrize("which", ["fixture", "random"])
def test_a_branch_drafts_and_gives_the_plain_branch(stories, tiny, which, pacing):
    """A branch (the chosen alternative forced, the reply's prefix ending the prompt) with
    prompt lookup or a draft model: the forced tokens come first with the plain branch's
    log-probs and alternatives, the prefix comes from the KV cache (the speculative run
    before it remembered it), and what follows is greedy by full forward passes."""
    lm = stories if which == "fixture" else tiny
    tok = lm.tokenizer
    prompt = tok.encode(REPEAT, bos=True)
    small = random_model(lm.model.args.vocab_size, dim=16, layers=1, heads=2, kv=1, seed=5)
    i = 3
    for spec in (dict(lookup=2), dict(draft="itself"), dict(draft="small")):
        eng = Engine(lm.model, tok, stop_ids=lm.stop_ids)
        eng.add_draft("itself", lm.model, tok)
        eng.add_draft("small", small, tok)
        first = tokens_of(eng, prompt, temperature=0, max_new_tokens=12, **spec)
        with torch.no_grad():
            runner_up = int(lm.model(torch.tensor([prompt + first.tokens[:i]]))[0, -1].topk(2).indices[1])
        for forced in ([runner_up], [7, 11, 13]):  # several: more than one verification row
            params = SamplingParams(temperature=0, max_new_tokens=16, **spec)
            branch = list(eng.generate(prompt + first.tokens[:i], params, forced=forced, inspect=3))
            pre, done = branch[0], branch[-1]
            assert pre.cached_tokens == len(prompt) + i - 1, spec  # only the last prefix position ran
            assert done.stats.cached_tokens == pre.cached_tokens
            assert done.tokens[:len(forced)] == forced
            assert done.tokens[len(forced):] == reference_greedy(lm.model, prompt + first.tokens[:i] + forced,
                                                                 16 - len(forced), lm.stop_ids), (spec, forced)
            ref = list(Engine(lm.model, tok, stop_ids=lm.stop_ids).generate(
                prompt + first.tokens[:i], SamplingParams(temperature=0, max_new_tokens=16), forced=forced, inspect=3))
            assert ref[-1].tokens == done.tokens and ref[-1].stop_reason == done.stop_reason
            got = [e for e in branch if isinstance(e, Token)]
            want = [e for e in ref if isinstance(e, Token)]
            for g, w in zip(got, want):  # the same records as plain decoding, forced positions included
                assert (g.token_id, g.index) == (w.token_id, w.index)
                assert g.logprob == pytest.approx(w.logprob, abs=1e-4)
                assert [t for t, _ in g.top["raw"]] == [t for t, _ in w.top["raw"]]
                assert [t for t, _ in g.top["filtered"]] == [t for t, _ in w.top["filtered"]]
            # Run the original reply again so the next branch finds its prefix in the cache.
            tokens_of(eng, prompt, temperature=0, max_new_tokens=12, **spec)


def test_forced_tokens_in_lanes_past_max_new_tokens_and_with_stop_tokens(stories):
    """Comparison lanes that draft and lanes that do not all take the forced tokens; more
    forced tokens than max_new_tokens end on "length" after max_new_tokens of them; a
    forced stop token ends the reply, as in plain decoding."""
    tok = stories.tokenizer
    eng = Engine(stories.model, tok, stop_ids=stories.stop_ids)
    eng.add_draft("itself", stories.model, tok)
    prompt = tok.encode("Once upon a time", bos=True)
    forced = [tok.encode(" there", bos=False)[0], 9, 40]
    plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=30)
    ref = done_of(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=30), forced=forced))
    assert ref.tokens[:3] == forced and ref.tokens != plain.tokens
    lanes = [SamplingParams(temperature=0, max_new_tokens=30, **spec)
             for spec in (dict(), dict(lookup=1), dict(draft="itself"), dict(lookup=3))]
    dones = [e for e in eng.generate_lanes(prompt, lanes, forced=forced) if isinstance(e, Done)]
    assert [d.tokens for d in sorted(dones, key=lambda d: d.lane)] == [ref.tokens] * 4
    for spec in (dict(lookup=2), dict(draft="itself")):
        short = tokens_of(eng, prompt, temperature=0, max_new_tokens=2, **spec)
        d = done_of(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=2, **spec), forced=forced))
        assert (d.tokens, d.stop_reason) == (forced[:2], "length") and short.tokens != d.tokens
        stop = sorted(stories.stop_ids)[0]
        d = done_of(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8, **spec),
                                 forced=[forced[0], stop, 40]))
        assert (d.tokens, d.stop_reason, d.stop_token) == ([forced[0]], "eos", stop)
    # A forced position uses the lane's generator as plain decoding does (it draws, then
    # takes the forced token): the undrafted draw after it is the plain one, seed by seed.
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=2)
    plain = [done_of(eng.generate(prompt, SamplingParams(**kw, seed=s), forced=forced[:1])).tokens for s in range(12)]
    spec = [done_of(eng.generate(prompt, SamplingParams(**kw, seed=s, lookup=2), forced=forced[:1])).tokens
            for s in range(12)]
    assert spec == plain and len({t[1] for t in plain}) > 1


# -- sampling: the same distribution as plain sampling --------------------------------

def chi_square_p(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's goodness-of-fit p-value; cells expected below min_expected are pooled."""
    n = counts.sum()
    exp = probs.double() * n
    small = exp < min_expected
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().view(1)])
    exp = torch.cat([exp[~small], exp[small].sum().view(1)])
    if exp[-1] < min_expected:  # the pooled cell is too small too: fold it into the largest
        obs, exp = obs[:-1].clone(), exp[:-1].clone()
        obs[exp.argmax()] += counts[small].sum()
        exp[exp.argmax()] += probs.double()[small].sum() * n
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(exp) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A 30-token character tokenizer and two random models over it (target, draft)."""
    from core.tokenizer import load_tokenizer
    folder = tmp_path_factory.mktemp("tok30")
    n = write_tiny_tokenizer(folder)
    tok = load_tokenizer(folder / "tokenizer.json")
    return tok, random_model(n, seed=11, std=0.3), random_model(n, dim=16, layers=1, heads=2, kv=1, seed=12, std=0.3)


FILTERS = [dict(temperature=1.0, top_p=1.0), dict(temperature=1.4, top_p=0.9, repetition_penalty=1.3),
           dict(temperature=0.9, top_k=12, min_p=0.02, top_p=1.0)]


@pytest.mark.parametrize("kw", FILTERS)
def test_verified_first_token_is_distributed_as_plain_sampling(small_vocab, kw):
    """At a fixed prefix and fixed drafts, the first token verification emits follows the
    target's filtered distribution exactly, for a point-mass draft (prompt lookup) and a
    draft model's q; the plain reference draws pass the same test."""
    tok, target, draft = small_vocab
    params = SamplingParams(**kw)
    prefix = [1, 5, 9, 12, 5, 9]
    with torch.no_grad():
        p_logits = target(torch.tensor([prefix]))[0, -1]
        q_logits = draft(torch.tensor([prefix]))[0, -1]
    prev = torch.tensor(prefix)
    p = filter_logits(p_logits, params, prev).softmax(-1)
    q = filter_logits(q_logits, params, prev).softmax(-1)
    likely = int(p.argsort(descending=True)[1])  # a draft accepted about as often as not
    # n: the power check below needs it. Its bias moves p(likely) = a (0.15-0.20 in the
    # three settings) to a + a(1 - a); the chi-square noncentrality is n a(1 - a) >= 1500 *
    # 0.127 = 190, against 58.3 for p < 1e-3 at the most cells (30, df 29): 200 samples of
    # the biased draws at n = 1500 all gave p < 1e-19, at n = 1000 p < 1e-7 (4000 before).
    n = 1500
    counts = {"lookup": torch.zeros(len(p)), "model": torch.zeros(len(p)), "plain": torch.zeros(len(p))}
    for seed in range(n):
        g = torch.Generator().manual_seed(seed)
        # The second row (after the draft) is never reached when the draft is rejected,
        # and is irrelevant to the first token when it is accepted.
        rows = torch.stack([p_logits, p_logits])
        counts["lookup"][verify(rows, [likely], None, params, prefix, g)[0][0]] += 1
        d = int(torch.multinomial(q, 1, generator=g))
        counts["model"][verify(rows, [d], q.view(1, -1), params, prefix, g)[0][0]] += 1
        counts["plain"][int(torch.multinomial(p, 1, generator=g))] += 1
    for name, c in counts.items():
        assert chi_square_p(c, p) > 1e-3, name
    # The test has power: keeping the draft w.p. p(d) but drawing from p itself on a
    # rejection (no residual) over-weights the draft, and is caught at this n.
    wrong = p * (1 - p[likely])
    wrong[likely] += p[likely]
    biased = torch.bincount(torch.multinomial(wrong, n, replacement=True, generator=torch.Generator().manual_seed(0)),
                            minlength=len(p)).float()
    assert chi_square_p(biased, p) < 1e-3


def test_engine_samples_pairs_as_plain_decoding(small_vocab, monkeypatch):
    """End to end: the first two tokens of sampled replies (the second one verified after
    drafts) follow P(t1) P(t2 | t1) of the target, computed by full forward passes."""
    monkeypatch.setattr(speculative, "Pace", AlwaysDraft)
    tok, target, draft = small_vocab
    eng = Engine(target, tok, stop_ids=())
    eng.add_draft("small", draft, tok)
    # Every token occurs in the prompt, so prompt lookup always has a draft for the second.
    prompt = [1] + torch.randperm(30, generator=torch.Generator().manual_seed(0)).tolist() + [5, 9]
    # Three tokens, so the second can be verified against a draft (a step never drafts
    # past max_new_tokens); the first two are counted.
    kw = dict(temperature=1.2, top_p=0.95, repetition_penalty=1.2, max_new_tokens=3)
    V = target.args.vocab_size
    with torch.no_grad():
        first = filter_logits(target(torch.tensor([prompt]))[0, -1], SamplingParams(**kw), torch.tensor(prompt)).softmax(-1)
        seqs = torch.tensor([prompt + [t] for t in range(V)])
        nxt = target(seqs)[:, -1]
    joint = torch.stack([filter_logits(nxt[t], SamplingParams(**kw), seqs[t]).softmax(-1) * first[t]
                         for t in range(V)])
    for spec in (dict(lookup=1), dict(draft="small")):
        counts = torch.zeros(V * V)
        drafted = 0
        for call in range(200):  # 8 lanes a call: 1600 replies
            lanes = [SamplingParams(**kw, **spec, seed=call * 8 + i) for i in range(8)]
            for e in eng.generate_lanes(prompt, lanes):
                if isinstance(e, Done):
                    assert len(e.tokens) == 3
                    counts[e.tokens[0] * V + e.tokens[1]] += 1
                    drafted += e.stats.speculative["drafted"]
        assert drafted > 1500, spec  # the second tokens really went through verification
        assert chi_square_p(counts, joint.view(-1)) > 1e-3, spec


# -- cancel, errors, stats -------------------------------------------------------------

def test_cancel_is_honoured_at_the_next_step(stories):
    eng = Engine(stories.model, stories.tokenizer, stop_ids=())
    prompt = stories.tokenizer.encode(REPEAT, bos=True)
    for spec in (dict(lookup=2), dict(draft="itself")):
        eng.add_draft("itself", stories.model, stories.tokenizer)
        cancel = threading.Event()
        events = eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=400, **spec), cancel=cancel)
        seen = 0
        done = None
        for ev in events:
            if isinstance(ev, Token):
                seen += 1
                cancel.set()
            elif isinstance(ev, Done):
                done = ev
        assert done.stop_reason == "cancelled"
        assert len(done.tokens) <= 2 + LOOKUP_MAX_DRAFT  # the first token, then one step at most


def test_bad_settings_and_foreign_vocabularies_are_refused(stories, tiny):
    eng = Engine(stories.model, stories.tokenizer)
    prompt = [1, 403, 407]
    for bad in (dict(lookup=-1), dict(lookup=99), dict(lookup=2.5), dict(lookup=2, draft="x"),
                dict(lookup=2, num_beams=2), dict(draft=3)):
        with pytest.raises(SettingsError):
            eng.generate(prompt, SamplingParams(**bad))
    with pytest.raises(SettingsError, match="no draft model"):
        eng.generate(prompt, SamplingParams(draft="nowhere"))
    with pytest.raises(DraftModelError, match="vocabulary"):
        eng.add_draft("llama2", tiny.model, tiny.tokenizer)
    assert isinstance(DraftModelError("x"), SettingsError)  # the CLI and GUI show it as a setting
    # A loader that brings a foreign model fails the request before anything runs.
    eng.draft_loader = lambda name: eng.add_draft(name, tiny.model, tiny.tokenizer)
    with pytest.raises(DraftModelError):
        eng.generate(prompt, SamplingParams(draft="other"))
    assert "other" not in eng.drafts


# -- constraints: the mask applies at every drafted position ---------------------------

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}


def test_constrained_lanes_draft_and_stay_exact(stories, pacing):
    """Greedy constrained lanes give the plain constrained tokens with either drafter
    (drafts the grammar forbids are rejected, never emitted); sampled ones always match."""
    import json
    import re

    import jsonschema

    from core.engine.constraint import Constraint
    eng = Engine(stories.model, stories.tokenizer, stop_ids=stories.stop_ids)
    eng.add_draft("itself", stories.model, stories.tokenizer)
    eng.add_draft("random", random_model(stories.model.args.vocab_size, seed=3), stories.tokenizer)
    # The prompt holds a valid object, so prompt lookup has something to copy.
    prompt = stories.tokenizer.encode('{"name": "Max", "age": 7} {"name": "Lily", "age": 5} ', bos=True)
    schema = Constraint("json_schema", json.dumps(PERSON))
    regex = Constraint("regex", r"[A-Z][a-z]{2,6} (is|was) [0-9]{1,3}")
    for c in (schema, regex):
        plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=40, constraint=c)
        for spec in (dict(lookup=2), dict(draft="itself"), dict(draft="random")):
            d = tokens_of(eng, prompt, temperature=0, max_new_tokens=40, constraint=c, **spec)
            assert (d.tokens, d.stop_reason) == (plain.tokens, plain.stop_reason), (c.kind, spec)
    lanes = [SamplingParams(temperature=1.0, top_p=0.95, seed=s, max_new_tokens=40, constraint=schema,
                            **(dict(lookup=2) if s % 2 else dict(draft="random"))) for s in range(8)]
    dones = [e for e in eng.generate_lanes(prompt, lanes) if isinstance(e, Done)]
    assert len(dones) == 8 and sum(d.stats.speculative["drafted"] for d in dones) > 0
    for d in dones:
        assert d.stop_reason == "eos", (d.stop_reason, d.text)
        jsonschema.validate(json.loads(d.text), PERSON)
    lanes = [SamplingParams(temperature=1.0, seed=s, max_new_tokens=20, constraint=regex, lookup=1) for s in range(4)]
    for d in (e for e in eng.generate_lanes(prompt, lanes) if isinstance(e, Done)):
        assert re.fullmatch(r"[A-Z][a-z]{2,6} (is|was) [0-9]{1,3}", d.text), d.text


# -- what nothing accepted costs ----------------------------------------------------------

def test_an_undrafted_step_is_a_plain_decoding_step(stories, monkeypatch):
    """Lanes that may draft but do not at a step run exactly plain decoding's operations
    there (the same aten ops in the same order, one read from the device), whatever the
    drafter and sampler."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(speculative, "Pace", NeverDraft)
    eng = Engine(stories.model, stories.tokenizer, stop_ids=())
    eng.add_draft("itself", stories.model, stories.tokenizer)
    prompt = stories.tokenizer.encode(REPEAT, bos=True)
    kw = [dict(temperature=0), dict(temperature=0.9, top_p=0.9, top_k=40, seed=4, repetition_penalty=1.2)]

    def per_step(spec):
        lanes = [SamplingParams(max_new_tokens=8, **k, **spec) for k in kw]
        steps, seen, done = [], 0, []
        events = eng.generate_lanes(prompt, lanes)
        first = next(events)  # the prefill, outside the recording
        while True:
            with Ops() as rec:
                ev = next(events, None)
            if ev is None:
                break
            if isinstance(ev, Token) and ev.lane == 0:
                steps.append(rec.ops)
            elif isinstance(ev, Done):
                done.append(ev)
        assert isinstance(first, Prefilled) and len(steps) == 8
        return steps, sorted(done, key=lambda d: d.lane)

    plain, plain_done = per_step({})
    for spec in (dict(lookup=3), dict(draft="itself")):
        steps, dones = per_step(spec)
        assert [d.tokens for d in dones] == [d.tokens for d in plain_done]
        for a, b in zip(steps[1:], plain[1:]):  # the first step in both: the prefill's logits
            assert a == b, spec  # one loop: the very same ops in the same order
        assert all(d.stats.speculative["drafted"] == 0 for d in dones)


def test_pace_backs_off_and_prompt_lookup_waits_for_a_right_guess():
    look = Pace(8, guesses=True)
    assert look.probing and look.next() == 0  # nothing drafted before a right guess
    look.guessed(False)
    assert look.next() == 0
    look.guessed(True)
    assert look.next() == 4
    look.update(4, 4)
    assert look.next() == 6 and not look.probing
    look.update(6, 2)
    assert look.next() == 3
    look.update(3, 0)  # all rejected: back to guessing
    assert look.probing and [look.next() for _ in range(40)] == [0] * 40
    model = Pace(6)
    assert model.probing and model.next() == 3  # a draft model probes at once (DraftModel.propose checks)
    waits = []
    for _ in range(7):
        model.miss()
        n = 0
        while model.next() == 0:
            n += 1
        waits.append(n)
    assert waits == [1, 3, 7, 15, 31, 31, 31]
    model.update(3, 1)
    assert not model.probing and model.next() == 2


def test_a_drafter_that_is_never_right_costs_no_verification(stories, tiny):
    """A random draft model never gets a draft verified: its probes (the tokens it
    catches up on) disagree with the target, so every target step is one token wide, and
    the draft model runs a handful of times in 60 tokens. Prompt lookup on a random
    model's free text drafts only after it would have guessed right."""
    tok = stories.tokenizer
    eng = Engine(stories.model, tok, stop_ids=())
    draft = random_model(stories.model.args.vocab_size, seed=3)
    eng.add_draft("random", draft, tok)
    prompt = tok.encode("Once upon a time", bos=True)
    plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=60)
    widths, draft_calls = [], [0]
    real, real_draft = stories.model.forward, draft.forward

    def counting(x, *a, **kw):
        widths.append(x.shape[1])
        return real(x, *a, **kw)

    def counting_draft(x, *a, **kw):
        draft_calls[0] += 1
        return real_draft(x, *a, **kw)
    # Twice: the second time the draft model's cache holds the whole reply already, and
    # its probes still look at its choices for the reply's tokens.
    for _ in range(2):
        widths.clear()
        draft_calls[0] = 0
        stories.model.forward, draft.forward = counting, counting_draft
        try:
            spec = tokens_of(eng, prompt, temperature=0, max_new_tokens=60, draft="random")
        finally:
            del stories.model.forward, draft.forward
        assert spec.tokens == plain.tokens
        assert widths[1:] == [1] * 59 and spec.stats.speculative["drafted"] == 0
        assert 0 < draft_calls[0] <= 8  # probes after 1, 3, 7, 15, 31 steps (the first one two forwards)

    eng = Engine(tiny.model, tiny.tokenizer, stop_ids=())
    prompt = tiny.tokenizer.encode(REPEAT, bos=True)
    plain = tokens_of(eng, prompt, temperature=0, max_new_tokens=60)
    spec = tokens_of(eng, prompt, temperature=0, max_new_tokens=60, lookup=2)
    assert spec.tokens == plain.tokens
    # Each drafting round comes after a step whose token the lookup proposed first (a
    # right guess, or an accepted draft): replay the lookup over the reply to count them.
    idx, right = NgramIndex(2, prompt), 0
    for t in plain.tokens:
        guess = idx.propose(1)
        right += bool(guess) and guess[0] == t
        idx.extend([t])
    s = spec.stats.speculative
    rounds = round(s["drafted"] / s["mean_draft"]) if s["drafted"] else 0
    assert rounds <= right


def test_drafting_on_the_static_cache_step(stories, pacing):
    """An engine whose decode step is the fixed-shape static-cache one (what CUDA graphs
    replay; eager here) runs undrafted steps through it and verification forwards on the
    same cache: greedy tokens equal plain decoding, the capacity stays a power of two."""
    tok = stories.tokenizer
    prompt = tok.encode(REPEAT, bos=True)
    plain = tokens_of(Engine(stories.model, tok, stop_ids=stories.stop_ids), prompt, temperature=0,
                      max_new_tokens=60)
    eng = Engine(stories.model, tok, stop_ids=stories.stop_ids, static=True)
    eng.add_draft("itself", stories.model, tok)
    eng.add_draft("random", random_model(stories.model.args.vocab_size, seed=3), tok)
    for spec in (dict(lookup=2), dict(draft="itself"), dict(draft="random")):
        d = tokens_of(eng, prompt, temperature=0, max_new_tokens=60, **spec)
        assert d.tokens == plain.tokens, spec
    cap = eng.cache.capacity
    assert cap & (cap - 1) == 0


def test_lanes_that_draft_with_one_draft_model_draft_together(stories, pacing):
    """Comparison lanes (and side-by-side prompts, rows at different positions) drafting
    with the same draft model run its steps in one batched forward, and every lane still
    gives its plain greedy tokens; a twin of the target as draft is always right, which
    shows each row drafted from its own context and cache positions."""
    import copy
    tok = stories.tokenizer
    eng = Engine(stories.model, tok, stop_ids=stories.stop_ids)
    twin = copy.deepcopy(stories.model)
    eng.add_draft("twin", twin, tok)
    eng.add_draft("random", random_model(stories.model.args.vocab_size, seed=3), tok)
    batches = []
    real = twin.forward

    def counting(x, *a, **kw):
        batches.append(x.shape[0])
        return real(x, *a, **kw)
    twin.forward = counting
    prompt = tok.encode(REPEAT, bos=True)
    settings = [dict(temperature=0), dict(temperature=0, repetition_penalty=1.3), dict(temperature=0, top_k=3)]
    plain = [tokens_of(eng, prompt, max_new_tokens=40, **kw).tokens for kw in settings]
    lanes = [SamplingParams(max_new_tokens=40, draft="twin", **kw) for kw in settings]
    lanes += [SamplingParams(max_new_tokens=40, draft="random", temperature=0), SamplingParams(max_new_tokens=40, temperature=0)]
    dones = sorted((e for e in eng.generate_lanes(prompt, lanes) if isinstance(e, Done)), key=lambda d: d.lane)
    assert [d.tokens for d in dones] == plain + [plain[0], plain[0]]
    assert max(batches) >= 3  # the twin lanes' draft steps ran together
    for d in dones[:3]:
        assert d.stats.speculative["acceptance"] == 1.0 and d.stats.speculative["drafted"] > 20
    batches.clear()
    prompts = [prompt, tok.encode("Once upon a time there was", bos=True)]
    base = [tokens_of(eng, p, temperature=0, max_new_tokens=30).tokens for p in prompts]
    batch = [e for e in eng.generate_batch(prompts, SamplingParams(temperature=0, max_new_tokens=30, draft="twin"))
             if isinstance(e, Done)]
    assert [d.tokens for d in sorted(batch, key=lambda d: d.lane)] == base
    assert max(batches) == 2 and all(d.stats.speculative["acceptance"] == 1.0 for d in batch)


# -- one loop: drafting and plain requests in one continuous batch -----------------------

def test_serve_batches_drafting_and_plain_requests_together(stories, pacing):
    """Continuous batching takes any request: a plain one and one drafting by prompt
    lookup start together, one drafting with a draft model joins while they run; they
    share the loop's forwards (fewer than each alone, and verification forwards carry the
    plain lane) and each gives exactly its greedy tokens alone."""
    import copy
    tok = stories.tokenizer
    eng = Engine(stories.model, tok, stop_ids=())
    eng.add_draft("twin", copy.deepcopy(stories.model), tok)
    prompts = [tok.encode(t, bos=True) for t in ("Once upon a time", REPEAT, "Lily and Ben went to the park")]
    specs = [{}, dict(lookup=2), dict(draft="twin")]
    forwards = []
    real = stories.model.forward

    def counting(x, pos=0, cache=None, *a, **kw):
        if isinstance(cache, KVCache):  # decode and verification steps (a prefill runs on a row view)
            forwards.append(tuple(x.shape))
        return real(x, pos, cache, *a, **kw)

    def joining(i):
        return Joining(prompts[i], eng.check_request(prompts[i], [SamplingParams(temperature=0, max_new_tokens=40,
                                                                                 **specs[i])]))
    stories.model.forward = counting
    try:
        alone = []
        for p, s in zip(prompts, specs):
            forwards.clear()
            alone.append((tokens_of(eng, p, temperature=0, max_new_tokens=40, **s).tokens, len(forwards)))
        forwards.clear()
        queue = [[joining(0), joining(1)], [], [], [joining(2)]]
        dones = sorted((e for e in eng.serve(lambda free, nxt: queue.pop(0) if queue else [])
                        if isinstance(e, Done)), key=lambda d: d.lane)
    finally:
        del stories.model.forward
    assert [d.tokens for d in dones] == [a for a, _ in alone]
    assert [d.stats.speculative is not None for d in dones] == [False, True, True]
    for d in dones[1:]:  # each drafted, and its speed-up is against the measured plain step
        assert d.stats.speculative["accepted"] > 0 and d.stats.speculative["speedup"] > 0
    assert len(forwards) <= max(n for _, n in alone) + 3  # shared: about the longest alone, not the sum
    assert any(b >= 2 and t > 1 for b, t in forwards)  # drafts verified with the plain lane in the rows
    assert max(b for b, _ in forwards) == 3  # the draft-model request joined the running two
