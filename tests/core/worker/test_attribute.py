"""AttributeRequest: characters of the chat to tokens, and the worker's answer."""
from __future__ import annotations

import pytest

from core import checkpoints
from core.engine.attribution import attribute
from core.prompt.chat_format import chat_format_for
from core.worker.attribute import token_range, token_spans
from core.worker.protocol import AttributeRequest, Attributed, Error
from tests.helpers import loaded_ok

P1 = "Lily had a big red ball in the park."
P2 = "Tom ate a small cake at home."
CONTENT = f"  Sources:\n[1] {P1}\n[2] {P2}\n\nWhat did Lily have?"
REPLY = "Lily had a red ball. Tom was sad."


def request(**kw) -> AttributeRequest:
    c1, c2 = CONTENT.index(P1), CONTENT.index(P2)
    base = dict(messages=[{"role": "user", "content": CONTENT}], chat_format="llama2", reply=REPLY,
                span=(0, REPLY.index(".") + 1), passages=[(c1, c1 + len(P1)), (c2, c2 + len(P2))])
    return AttributeRequest(**{**base, **kw})


@pytest.fixture(scope="module")
def stories(fixtures):
    return checkpoints.load(fixtures / "stories260K.gguf")


def test_token_range_edges():
    starts = [0, 0, 3, 5, 9]  # a special (no bytes), then tokens of 3, 2, 4 and 1 bytes
    assert token_range(starts, 10, 0, 3) == (1, 2)
    assert token_range(starts, 10, 4, 6) == (2, 4)
    assert token_range(starts, 10, 9, 10) == (4, 5)
    assert token_range(starts, 10, 5, 5) == (0, 0)


def test_passages_and_span_cover_exactly_their_text(stories):
    tok = stories.tokenizer
    fmt = chat_format_for(tok, override="llama2")
    req = request()
    prompt = fmt.encode_dialog(req.messages)
    reply_ids = tok.encode(REPLY)
    (a, b), passages = token_spans(tok, prompt, reply_ids, req)
    ids = prompt + reply_ids
    for (pa, pb), text in zip(passages, (P1, P2)):
        assert text in tok.decode(ids[pa:pb])
        assert text not in tok.decode(ids[pa + 1:pb]) and text not in tok.decode(ids[pa:pb - 1])
    assert tok.decode(ids[a:b]).strip() == "Lily had a red ball."


def test_worker_answers_with_the_engines_shares(make_worker, fixtures, stories):
    w, col = make_worker()
    loaded_ok(col, w.load(fixtures / "stories260K.gguf"))
    rid = w.attribute(request())
    got = col.wait(lambda evs: [e for e in evs if e.request_id == rid and isinstance(e, (Attributed, Error))])[0]
    assert isinstance(got, Attributed), got
    tok = stories.tokenizer
    prompt = chat_format_for(tok, override="llama2").encode_dialog(request().messages)
    span, passages = token_spans(tok, prompt, tok.encode(REPLY), request())
    want = attribute(stories.model, prompt + tok.encode(REPLY), span, passages)
    assert got.shares == pytest.approx(want.shares, abs=1e-6)
    assert got.none + sum(got.shares) == pytest.approx(1.0)
    assert 0 < got.shares[0] < 1 and got.tokens == span[1] - span[0]


def test_worker_refuses_what_it_cannot_place(make_worker, fixtures):
    w, col = make_worker()
    rid = w.attribute(request())
    assert "no model" in col.wait(lambda evs: [e for e in evs if e.request_id == rid])[0].message
    loaded_ok(col, w.load(fixtures / "stories260K.gguf"))
    for bad in (request(span=(3, 3)), request(reply="not what was said", reply_ids=[5, 6]),
                request(source_message=4)):
        rid = w.attribute(bad)
        ev = col.wait(lambda evs: [e for e in evs if e.request_id == rid])[0]
        assert isinstance(ev, Error) and "\n" not in ev.message and not ev.cancelled
