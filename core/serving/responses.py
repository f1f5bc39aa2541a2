"""Replies shaped as OpenAI's: whole responses, streamed chunks, usage, and this server's
extensions (vLLM's ``stop_reason`` and ``return_token_ids``, each token's id beside its
logprob, speculative decoding's statistics)."""
from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

from core.engine.events import Done, Token
from core.serving.protocol import APIError, constraint_from_request
from core.serving.scheduler import Job
from core.serving.tools_api import CallStream
from core.serving.state import ServerState

HOLE = "\x00text\x00"  # stands for a token's text in a chunk's template
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "abort",
          "tool_calls": "tool_calls"}


class Reply:
    """Builds one request's response objects (whole or as chunks) from engine events."""

    def __init__(self, server: ServerState, body: dict, chat: bool, job: Job, top: int | None):
        self.server, self.chat, self.job, self.body = server, chat, job, body
        self.top = top  # None: no logprobs; k: the chosen token plus the k most likely
        self.token_ids = bool(body.get("return_token_ids"))
        self.keep_stop = bool(body.get("include_stop_str_in_output"))  # vLLM's: the stop string stays in the text
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.offsets = [0] * len(job.lanes)
        self.counted = False
        # vLLM's stop_reason names a stop token id the request gave; the model's own end
        # of text or of turn is null
        asked = body.get("stop_token_ids")
        self.asked_stops = frozenset(asked) if isinstance(asked, list) else frozenset()
        self.own_stops = frozenset(server.loaded.stop_ids) | frozenset(server.loaded.chat_format.stop_ids())
        # Each choice's stream of calls (a chat whose lanes may call tools), else None.
        self.calls = ([CallStream(job.tools is not None and q.tool_choice != "none") for q in job.lanes]
                      if chat and job.tools is not None else None)
        # A plain stream's token chunk differs from the next only in its text: each
        # choice's chunk is JSON-encoded once, around a hole the text goes in (token_texts).
        self.plain = self.calls is None and self.top is None and not self.token_ids
        self._templates: dict[int, list[str]] = {}

    def cut_by_shutdown(self, done: Done | None = None) -> bool:
        """Whether the server's shutdown ended this choice (``done``) or any choice early."""
        return self.server.draining and any(d is not None and d.stop_reason == "cancelled"
                                            for d in ([done] if done is not None else self.job.done))

    def count_tokens(self) -> None:
        """Add this request's tokens to the server's metrics, once."""
        if not self.counted:
            self.counted = True
            self.server.metrics.tokens(self.job.prompt_tokens, sum(len(d.tokens) for d in self.job.done if d is not None))

    def head(self) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.server.model_id,
                "system_fingerprint": self.server.fingerprint}

    def _entry(self, tok: Token) -> dict:
        # "id" (an extension) names each token by id, as a branch at an alternative needs:
        # two tokens may spell the same text.
        # A reply whose leading space is dropped from its text drops it from its first
        # token (and that token's alternatives) too: the tokens spell the content.
        strip = self.job.strip_leading_space and tok.index == 0

        def one(piece: str, lp: float, tid: int) -> dict:
            piece = piece[1:] if strip and piece.startswith(" ") else piece
            return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8")), "id": tid}
        e = one(tok.piece, tok.logprob, tok.token_id)
        alts = []
        if self.top and tok.top:
            names = tok.top["pieces"]
            alts = [(names[i], math.log(p), i) for i, p in tok.top["raw"][: self.top]]
        e["top_logprobs"] = [one(p, lp, i) for p, lp, i in alts]
        return e

    def logprobs(self, toks: list[Token], choice: int) -> dict | None:
        if self.top is None:
            return None
        entries = [self._entry(t) for t in toks]
        if self.chat:
            return {"content": entries}
        offsets = []
        for t in toks:
            offsets.append(self.offsets[choice])
            self.offsets[choice] += len(t.piece)
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries]
                if self.top else None, "text_offset": offsets,
                # an extension: the alternatives' ids, in top_logprobs' order (a dict keyed by text cannot hold them)
                **({"top_token_ids": [[a["id"] for a in e["top_logprobs"]] for e in entries]} if self.top else {})}

    def stop_reason(self, d: Done):
        """vLLM's stop_reason: the stop string or the request's stop token id that ended
        the choice; null at the model's own end of text or of turn."""
        if d.stop_reason == "eos":
            return d.stop_token if d.stop_token in self.asked_stops and d.stop_token not in self.own_stops else None
        if d.stop_reason == "stop":
            text = self.server.tokenizer.decode(d.tokens)
            hits = [(text.find(s), s) for s in d.params.stop if s in text]
            return min(hits)[1] if hits else None
        return None

    def stop_text(self, d: Done) -> str:
        """What follows a finished choice's text: the stop string that ended it, when the
        request asked to keep it (include_stop_str_in_output), else nothing."""
        return (self.stop_reason(d) or "") if self.keep_stop and d.stop_reason == "stop" else ""

    def failure(self, done: Done | None = None) -> APIError | None:
        """The error a choice that stopped on one (``done``, else the first such) answers
        with: a constraint that went past the grammar engine's limits mid-reply is a 400
        naming the request's constraint field; anything else (NaN logits) a 500."""
        failed = [d for d in ([done] if done is not None else self.job.done) if d is not None and d.stop_reason == "error"]
        if not failed:
            return None
        d = failed[0]
        msg = d.error or "the reply stopped on an error"
        if d.params.constraint is not None:
            field = constraint_from_request(self.body)[1]
            return APIError(400, f"{field}: {msg}", param=field)
        return APIError(500, f"generation failed: {msg}", type="server_error")

    def usage(self) -> dict:
        done = [d for d in self.job.done if d is not None]
        # the tokens the reply reports (text, logprobs, token_ids); the stop token is not one
        completion = sum(len(d.tokens) for d in done)
        out = {"prompt_tokens": self.job.prompt_tokens, "completion_tokens": completion,
               "total_tokens": self.job.prompt_tokens + completion}
        if done and done[0].stats is not None:  # OpenAI's field: prompt tokens the KV cache held
            out["prompt_tokens_details"] = {"cached_tokens": done[0].stats.cached_tokens}
        spec = [s for s in (speculative_stats(d) for d in done) if s is not None]
        if spec:  # all choices together; each choice's own are on the choice
            drafted, accepted = sum(s["drafted"] for s in spec), sum(s["accepted"] for s in spec)
            out["speculative"] = {"kind": spec[0]["kind"], "lookup": spec[0]["lookup"], "draft": spec[0]["draft"],
                                  "drafted": drafted, "accepted": accepted,
                                  "acceptance_rate": accepted / drafted if drafted else 0.0,
                                  "forwards": sum(s["forwards"] for s in spec)}
        return out

    def whole(self, tokens: list[list[Token]]) -> dict:
        choices = []
        for i, d in enumerate(self.job.done):
            c: dict[str, Any] = {"index": i}
            if self.chat and d.tool_calls:  # OpenAI: no content beside the calls
                c["message"] = {"role": "assistant", "content": None,
                                "tool_calls": [tc.to_openai() for tc in d.tool_calls]}
            elif self.chat:
                c["message"] = {"role": "assistant", "content": d.text + self.stop_text(d)}
            else:
                c["text"] = d.text + self.stop_text(d)
            c["logprobs"] = self.logprobs(tokens[i], i)
            c["finish_reason"] = FINISH[d.stop_reason]
            c["stop_reason"] = self.stop_reason(d)
            if d.stop_token is not None:  # an extension: the token that ended it, even where stop_reason is null
                c["stop_token_id"] = d.stop_token
            if (spec := speculative_stats(d)) is not None:
                c["speculative"] = spec
            if self.token_ids:
                c["token_ids"] = list(d.tokens)
                c["prompt_token_ids"] = list(self.job.prompt_of(i))
            choices.append(c)
        return {**self.head(), "choices": choices, "usage": self.usage()}

    def token_texts(self, choice: int, tok: Token, first: bool) -> list[str]:
        """:meth:`token_chunks` as JSON texts, byte for byte ``json.dumps`` of them."""
        if not self.plain or (first and self.chat):
            return [json.dumps(c) for c in self.token_chunks(choice, tok, first)]
        if not tok.text:
            return []
        if (t := self._templates.get(choice)) is None:
            t = self._templates[choice] = json.dumps(self.chunk(choice, text=HOLE, tok=tok)).split(json.dumps(HOLE))
        if len(t) != 2:  # the hole's text is in the head too (a model named so): no template
            return [json.dumps(self.chunk(choice, text=tok.text, tok=tok))]
        return [t[0] + json.dumps(tok.text) + t[1]]

    def token_chunks(self, choice: int, tok: Token, first: bool) -> list[dict]:
        """The chunks one streamed token makes: its text as content, or where the choice
        may call tools, content or tool_calls deltas (:class:`CallStream`); none for a
        token that adds nothing the client asked for."""
        if self.calls is None:
            if tok.text or self.top is not None or self.token_ids:
                return [self.chunk(choice, text=tok.text, tok=tok, first=first)]
            return []
        deltas = self.calls[choice].push(tok.text)
        if not deltas:
            return [self.chunk(choice, tok=tok, first=first, delta={})] if self.top is not None or self.token_ids else []
        return [self.chunk(choice, tok=tok if k == 0 else None, first=first and k == 0, delta=d)
                for k, d in enumerate(deltas)]

    def done_chunks(self, choice: int, done: Done, first: bool) -> list[dict]:
        """A finished choice's last chunks: what its call stream held back, then the end."""
        held = self.calls[choice].finish(done.tool_calls) if self.calls is not None else []
        return [*(self.chunk(choice, first=first and k == 0, delta=d) for k, d in enumerate(held)),
                self.chunk(choice, done=done, first=first and not held)]

    def chunk(self, choice: int, *, text: str = "", tok: Token | None = None, done: Done | None = None,
              first: bool = False, delta: dict | None = None) -> dict:
        c: dict[str, Any] = {"index": choice}
        if done is not None:
            text = self.stop_text(done)
        if self.chat:
            d: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if delta is not None:
                d = {**({"role": "assistant"} if first else {}), **delta}
            elif tok is not None or text:
                d["content"] = text
            c["delta"] = d
        else:
            c["text"] = text
        c["logprobs"] = self.logprobs([tok], choice) if tok is not None else None
        c["finish_reason"] = FINISH[done.stop_reason] if done is not None else None
        if done is not None:
            c["stop_reason"] = self.stop_reason(done)
            if done.stop_token is not None:
                c["stop_token_id"] = done.stop_token
            if (spec := speculative_stats(done)) is not None:
                c["speculative"] = spec
        if self.token_ids:
            c["token_ids"] = [tok.token_id] if tok is not None else []
            if first:
                c["prompt_token_ids"] = list(self.job.prompt_of(choice))
        return {**self.head(), "object": self.object + ".chunk" if self.chat else self.object, "choices": [c]}


def speculative_stats(d: Done) -> dict | None:
    """How one choice's drafting went (None when it did not draft): the kind (lookup or
    draft), drafted and accepted tokens, the acceptance rate, verification forwards and
    the engine's speed-up estimate."""
    sp = d.stats.speculative if d.stats is not None else None
    if not sp:
        return None
    return {"kind": sp["kind"], "lookup": sp["lookup"], "draft": sp["draft"] or None, "drafted": sp["drafted"],
            "accepted": sp["accepted"], "acceptance_rate": sp["acceptance"], "mean_draft": sp["mean_draft"],
            "forwards": sp["forwards"], "speedup": sp["speedup"]}
