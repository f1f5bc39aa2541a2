"""Requests joining a served batch (Engine.serve): a burst's prefills, its first tokens
chosen together in batched passes, and requests that arrive while others join."""
import pytest

from core.checkpoints import load
from core.engine import batch as batch_module
from core.engine.engine import Engine, Joining
from core.engine.events import Prefilled, Token
from core.engine.settings import SamplingParams

TEXTS = ("Hi", "Once upon a time", "Numbers: 1 2 3", "The cat")


@pytest.fixture(scope="module")
def lm(fixtures):
    return load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")


@pytest.fixture
def engine(lm):
    return Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids)


def _alone(engine, prompts, q):
    out = []
    for p in prompts:
        engine.cache.reset()  # (a prefix the cache holds would be prefilled in other pieces)
        out.append([e.token_id for e in engine.generate_lanes(p, [q]) if isinstance(e, Token)])
    return out


def _served(engine, lm, monkeypatch, due: bool):
    """Serve one burst of TEXTS with choices due (or never due) before each prefill:
    (events, rows of every batched choice)."""
    prompts = [lm.tokenizer.encode(t, bos=True) for t in TEXTS]
    q = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_new_tokens=4)
    choices = []
    real = batch_module.Batch.choose
    monkeypatch.setattr(batch_module.Batch, "choose", lambda self, rows: choices.append(len(rows)) or real(self, rows))
    monkeypatch.setattr(engine, "_choice_due", lambda waited: due)
    pending = [[Joining(p, [q]) for p in prompts]]
    engine.cache.reset()
    evs = list(engine.serve(lambda free, nxt: pending.pop() if pending else [], max_rows=8))
    monkeypatch.undo()
    got = [[e.token_id for e in evs if isinstance(e, Token) and e.lane == lane] for lane in range(len(prompts))]
    assert got == _alone(engine, prompts, q)  # whichever rows share a choice
    return evs, choices


def test_a_burst_of_joiners_gets_its_first_tokens_in_one_batched_choice(engine, lm, monkeypatch):
    """Where prefills are quicker than a choice, the burst's first tokens wait for one
    batched pass after its prefills instead of paying one pass each."""
    evs, choices = _served(engine, lm, monkeypatch, due=False)
    assert choices[0] == len(TEXTS) and choices[1:] == [len(TEXTS)] * 3
    last_prefill = max(i for i, e in enumerate(evs) if isinstance(e, Prefilled))
    assert all(i > last_prefill for i, e in enumerate(evs) if isinstance(e, Token))


def test_joiners_that_waited_a_choice_long_get_their_token_before_the_next_prefill(engine, lm, monkeypatch):
    """Where a prefill takes longer than a choice, each joiner's first token comes right
    after its own prefill (sent with the next on_step), not after the whole burst's."""
    evs, choices = _served(engine, lm, monkeypatch, due=True)
    assert choices[: len(TEXTS)] == [1] * len(TEXTS)
    kinds = [(type(e).__name__, e.lanes if isinstance(e, Prefilled) else getattr(e, "lane", None)) for e in evs]
    prefilled = [i for i, (k, _) in enumerate(kinds) if k == "Prefilled"]
    firsts = [kinds.index(("Token", lane)) for lane in range(len(TEXTS))]
    assert all(firsts[k] < prefilled[k + 1] for k in range(len(TEXTS) - 1))


def test_a_request_that_arrives_while_others_join_joins_before_the_next_decode_step(engine, lm, monkeypatch):
    """admit is asked again once a burst has joined: a request that came meanwhile does
    not wait for a decode step of the rows that joined before it."""
    prompts = [lm.tokenizer.encode(t, bos=True) for t in TEXTS[:2]]
    q = SamplingParams(temperature=0, max_new_tokens=3)
    arrivals = [[Joining(prompts[0], [q])], [Joining(prompts[1], [q])]]
    forwards, asked = [0], []
    real = engine.decode
    monkeypatch.setattr(engine, "decode", lambda x, pos: forwards.__setitem__(0, forwards[0] + 1) or real(x, pos))

    def admit(free, nxt):
        asked.append(forwards[0])
        return arrivals.pop(0) if arrivals else []
    evs = list(engine.serve(admit, max_rows=4))
    assert asked[:3] == [0, 0, 0]  # the second request joined before any decode step
    got = [[e.token_id for e in evs if isinstance(e, Token) and e.lane == lane] for lane in range(2)]
    monkeypatch.undo()
    assert got == _alone(engine, prompts, q)


def test_a_burst_grows_the_cache_once_for_all_its_rows(engine, lm, monkeypatch):
    """The joiners' rows are allocated together before their prefills, not one growth (a
    reallocation of every layer's keys and values) per joiner."""
    grown = []
    real = type(engine.cache).ensure

    def ensure(cache, rows, capacity):
        if rows > cache.batch:
            grown.append(rows)
        return real(cache, rows, capacity)
    monkeypatch.setattr(type(engine.cache), "ensure", ensure)
    engine.cache.reset()
    engine.cache.ensure(1, 0)
    burst = [[Joining(lm.tokenizer.encode(t, bos=True), [SamplingParams(temperature=0, max_new_tokens=2)])
              for t in TEXTS]]
    list(engine.serve(lambda free, nxt: burst.pop() if burst else [], max_rows=8))
    assert grown == [len(TEXTS)]
