"""Helpers shared by test modules: tiny random reference models (transformers'
LlamaForCausalLM) and their Meta twins, stored-chat builders, the worker seen from outside."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from core.checkpoints.hf import args_from_config, meta_name, to_meta_tensor
from core.engine.events import Done, Token
from core.model.kv_cache import KVCache
from core.model.transformer import Transformer
from core.engine.settings import SamplingParams
from core.worker.protocol import Error, GenerateRequest, Loaded
from core.engine.events import Reply
from tests import forked

ROOT = Path(__file__).resolve().parent.parent  # the repository

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)


# The tiny_meta_dir fixture's model: tiny_hf(**TINY_META) is its transformers twin.
TINY_META = dict(seed=7, vocab_size=32000, hidden_size=32, intermediate_size=64,
                 num_attention_heads=4, num_key_value_heads=2)


def tiny_hf(seed: int = 0, **overrides):
    """A random transformers LlamaForCausalLM in float32, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**{**BASE, **overrides})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    return widen_weights(model)


def widen_weights(model):
    """Default init (std 0.02) gives near-uniform logits; widen so greedy choices are clear."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0, 0.15)
    return model


def meta_from_hf(hf_model) -> Transformer:
    """Our Transformer holding the HF model's weights (Q/K un-permuted)."""
    cfg = hf_model.config.to_dict()
    args = args_from_config(cfg)
    model = Transformer(args)
    sd = {}
    for k, v in hf_model.state_dict().items():
        name = meta_name(k)
        if name is None or (args.tie_word_embeddings and name == "output.weight"):
            continue
        sd[name] = to_meta_tensor(name, v.detach().clone(), args)
    model.load_state_dict(sd, strict=not args.tie_word_embeddings)
    if args.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    return model.eval()


def greedy(model, prompt, n):
    """Our greedy ids and log-probs, decoding through a KV cache one token at a time."""
    cache = KVCache.for_model(model, capacity=len(prompt) + n)
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), 0, cache, last_only=True)[0, -1]
        toks, lps, pos = [], [], len(prompt)
        for _ in range(n):
            t = int(logits.argmax())
            toks.append(t)
            lps.append(float(torch.log_softmax(logits, -1)[t]))
            logits = model(torch.tensor([[t]]), pos, cache)[0, -1]
            pos += 1
    return toks, torch.tensor(lps)


def hf_greedy(hf, prompt, n):
    """transformers' greedy ids and log-probs: a full forward per step, no generate() processors."""
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
            t = int(logits.argmax())
            lps.append(float(torch.log_softmax(logits, -1)[t]))
            ids.append(t)
    return ids[len(prompt):], torch.tensor(lps)


def texts(msgs):
    """The texts of a list of stored messages."""
    return [m.text for m in msgs]


def greetings_chat(h):
    """user → assistant(v1, v2) in History ``h``; the second version is on screen."""
    c = h.create_conversation("Greetings")
    u = h.add_message(c.id, role="user", text="Hello there")
    a1 = h.add_message(c.id, role="assistant", text="Hi! v1", parent_id=u.id,
                       settings={"temperature": 0.7, "top_p": 0.9}, seed=11, model_id="tiny",
                       stats={"tokens": 4, "tokens_per_s": 12.5}, stop_reason="eos")
    a2 = h.add_message(c.id, role="assistant", text="Hi! v2", parent_id=u.id, seed=12)
    return c, u, a1, a2


def gguf_vocab(path):
    """The vocabulary arrays of a GGUF file read with the gguf package: tokens, scores,
    token types and the bos/eos/unknown ids."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def array(name, convert):
        field = reader.fields[name]
        return [convert(field.parts[i]) for i in field.data]

    def scalar(name):
        field = reader.fields[name]
        return int(field.parts[field.data[0]][0])

    return (
        array("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8")),
        array("tokenizer.ggml.scores", lambda p: float(p[0])),
        array("tokenizer.ggml.token_type", lambda p: int(p[0])),
        {k: scalar(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "unknown")},
    )


# -- the worker thread, seen from outside --------------------------------------------------

PROMPT = "Once upon a time"  # the completion prompt of the worker tests


def inner(ev):
    """A worker event with the engine's event taken out of its Reply wrapper."""
    return ev.event if isinstance(ev, Reply) else ev


def is_token(ev, rid=None, index=None) -> bool:
    """ev is a Reply carrying a Token (of request rid, with that index, when given)."""
    return (isinstance(ev, Reply) and isinstance(ev.event, Token) and (rid is None or ev.request_id == rid)
            and (index is None or ev.event.index == index))


class Collector:
    """Records worker events (from the worker thread) and waits for conditions."""

    def __init__(self, hook=None):
        self.events: list = []
        self.hook = hook
        self._cond = threading.Condition()

    def __call__(self, ev) -> None:
        if self.hook is not None:
            self.hook(ev)
        with self._cond:
            self.events.append(ev)
            self._cond.notify_all()

    def wait(self, pred, timeout: float = 20.0):
        """Wait until pred(events) is truthy; return its value. pred may also read state that
        no event announces (a server's lane count), so it is re-checked every few ms, not
        only when an event arrives: else such a wait lasts the whole timeout and then passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (ok := pred(self.events)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.02))
        assert ok, f"timed out; events: {[type(e).__name__ for e in self.events][-20:]}"
        return ok

    def finished(self, rid: int, lanes: int = 1):
        """Wait for the terminal events of request rid (one Done per lane, or an Error);
        returns its events with the engine's own unwrapped."""
        def done(evs):
            mine = [inner(e) for e in evs if e.request_id == rid]
            if any(isinstance(e, Error) for e in mine):
                return mine
            return mine if sum(isinstance(e, Done) for e in mine) >= lanes else None
        return self.wait(done)

    def of(self, rid: int) -> list:
        with self._cond:
            return [inner(e) for e in self.events if e.request_id == rid]


def completion(max_new=30, seed=7, temperature=0.8, prompt=PROMPT, **kw) -> GenerateRequest:
    return GenerateRequest(mode="completion", prompt=prompt,
                           params=SamplingParams(temperature=temperature, max_new_tokens=max_new, seed=seed), **kw)


def loaded_ok(col, rid):
    evs = col.wait(lambda evs: [e for e in evs if e.request_id == rid and isinstance(e, (Loaded, Error))])
    assert isinstance(evs[-1], Loaded), evs[-1]
    return evs[-1]


# -- ``python -m core serve`` in a child process -------------------------------------------------

class ServeProcess:
    """``python -m core serve MODEL`` on loopback in a child process; ``url`` once it listens.

    ``port`` 0 takes a free one; a server started again with ``port=old.port`` (after
    :meth:`kill`) serves at the same URL. Use as a context manager, or call :meth:`stop`.
    """

    def __init__(self, model, *, key: str | None = None, port: int = 0, extra: tuple = ()):
        import os
        import subprocess
        import sys
        env = {**os.environ}
        env.pop("LLAMADESK_API_KEY", None)
        if key:
            env["LLAMADESK_API_KEY"] = key
        argv = ["serve", str(model), "--port", str(port), *extra]
        if sys.platform == "linux":  # forked from an interpreter with torch imported: ~2.5 s less CPU
            self.proc = forked.Popen(forked.cli, argv, cwd=ROOT, env=env, pipe_stderr=True)
        else:
            self.proc = subprocess.Popen([sys.executable, "-m", "core", *argv], cwd=ROOT, stderr=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, text=True, env=env)
        line = self.proc.stderr.readline()  # "serving NAME at URL (...)" once it listens
        if " at http://" not in line:
            self.stop()
            raise RuntimeError(f"the server did not start: {line!r}")
        self.url = line.split(" at ")[1].split()[0]
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, as a crash or a pulled plug would."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        import subprocess
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def free_port() -> int:
    """A loopback port nothing listens on (connection refused)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lacking(app):
    """ASGI middleware for core.serving.run.RunningServer(wrap=...): a server that refuses seed
    and silently ignores top_k, repetition_penalty and n, as some real servers do."""
    import json

    from starlette.responses import JSONResponse

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        body = json.loads(await read_body(receive))
        if "seed" in body:
            err = {"error": {"message": "Unrecognized request argument supplied: seed", "type": "invalid_request_error"}}
            return await JSONResponse(err, status_code=400)(scope, receive, send)
        for key in ("top_k", "repetition_penalty", "n"):
            body.pop(key, None)
        return await app(scope, replaying(json.dumps(body).encode(), receive), send)
    return wrapped


async def read_body(receive) -> bytes:
    """The whole request body of an ASGI request (test middlewares that rewrite it)."""
    raw = b""
    while True:
        m = await receive()
        raw += m.get("body", b"")
        if not m.get("more_body"):
            return raw


def replaying(data: bytes, receive):
    """An ASGI ``receive`` that gives ``data`` as the body once, then the client's own
    messages (its disconnect, which serve waits for)."""
    sent = []

    async def again():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": data, "more_body": False}
        return await receive()
    return again
