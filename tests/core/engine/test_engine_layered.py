"""Layered prefill of CPU-packed models (core.engine.prefill.Prefill.layered): a long prompt runs one
layer at a time over all its chunks, each layer's packed weights dequantized to bfloat16
once; the logits match one full forward, cancel lands between a layer's chunks."""
import threading

import pytest
import torch

from core.engine import prefill as prefill_mod
from core.model import quant
from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.settings import SamplingParams
from tests.core.checkpoints.util import random_model, write_gguf
from tests.helpers import greedy


@pytest.fixture(scope="module", params=["Q4_0", "Q8_0"])
def files(tmp_path_factory, request):
    m = random_model(3, dim=128, n_layers=3, n_heads=4, n_kv_heads=2, hidden_dim=192, max_seq_len=1024)
    f = tmp_path_factory.mktemp("layered") / f"m-{request.param}.gguf"
    write_gguf(f, m, qtype=request.param)
    return f


@pytest.fixture
def packed(files):
    return load(files, device="cpu")  # auto: linears stay packed


def long_prompt():
    """Long enough to take the layered path, in ~10 chunks of prefill_chunk=32."""
    g = torch.Generator().manual_seed(11)
    prompt = [1] + torch.randint(3, 280, (299,), generator=g).tolist()
    assert len(prompt) >= quant.DENSE_ROWS
    return prompt


def spy_layers(model, calls, after=None):
    """Record (layer index, tokens) of every layer call; ``after(calls)`` runs after each."""
    for i, layer in enumerate(model.layers):
        def forward(x, *a, _i=i, _f=layer.forward, **k):
            out = _f(x, *a, **k)
            calls.append((_i, x.shape[1]))
            if after is not None:
                after(calls)
            return out
        layer.forward = forward


def test_layered_prefill_logits_match_one_full_forward(files, packed):
    prompt = long_prompt()
    eng = Engine(packed.model, packed.tokenizer, stop_ids=(), prefill_chunk=32)
    calls = []
    spy_layers(packed.model, calls)
    eng.cache.ensure(1, len(prompt) + 1)
    with torch.inference_mode():
        logits, reuse = eng.prefill_row(0, prompt, None)
    n_layers = packed.model.args.n_layers
    # every layer ran all its chunks before the next layer began, none over 32 tokens
    assert [i for i, _ in calls] == sorted(i for i, _ in calls)
    assert all(t <= 32 for _, t in calls) and len(calls) >= n_layers * (len(prompt) // 32)
    assert sum(t for i, t in calls if i == 0) == len(prompt)
    del calls[:]
    with torch.no_grad():
        whole = packed.model(torch.tensor([prompt]))[0, -1]  # one pass, dense per call
    # same bf16 weights, only the chunking differs
    assert (logits - whole).abs().max() <= 1e-2 * whole.abs().max()
    floats = load(files, device="cpu", dtype="float32")  # the float32 reference path
    with torch.no_grad():
        ref = floats.model(torch.tensor([prompt]))[0, -1]
    # bfloat16 compute over a 300-token prompt: 8% of the logits' range (4% for the packed
    # forward of a 48-token prompt in test_gguf_quant), and no further off than one full
    # packed forward is
    err, err_whole = (logits - ref).abs().max(), (whole - ref).abs().max()
    assert err <= 0.08 * ref.abs().max() and err <= 1.25 * err_whole
    assert int(logits.argmax()) == int(ref.argmax())
    # the cache it left decodes on as a whole-prompt prefill does
    done = next(ev for ev in eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8))
                if isinstance(ev, Done))
    assert done.stats.cached_tokens == len(prompt) - 1
    fresh = Engine(packed.model, packed.tokenizer, stop_ids=(), prefill_chunk=32)
    again = next(ev for ev in fresh.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8))
                 if isinstance(ev, Done))
    assert again.tokens == done.tokens
    want = greedy(packed.model, prompt, 8)[0]
    if done.tokens != want:
        # bf16 over 32-token chunks and over one 300-row forward round differently (which
        # GEMM kernel runs depends on the CPU): only a near-tie under the float32 reference
        # may flip, and the reply must be that reference's argmax up to its rounding
        i = next(k for k, (a, b) in enumerate(zip(done.tokens, want)) if a != b)
        with torch.no_grad():
            at = floats.model(torch.tensor([prompt + done.tokens[:i]]))[0, -1]
        assert float(at.max() - at[done.tokens[i]]) <= 0.02 * float(at.abs().max()), (i, done.tokens, want)


def test_each_layer_is_dequantized_once_per_prompt(packed, monkeypatch):
    count, trims = [], []
    # Q4_0 packed; Q8_0 on the compiled kernels where they build, else packed
    kind = type(packed.model.layers[0].attention.wq)
    orig = kind.dequantize
    monkeypatch.setattr(kind, "dequantize", lambda self, *a: count.append(self) or orig(self, *a))
    # and the freed copies are handed back to the OS after each layer (glibc keeps them)
    monkeypatch.setattr(prefill_mod, "release_freed_heap", lambda: trims.append(len(count)))
    eng = Engine(packed.model, packed.tokenizer, stop_ids=(), prefill_chunk=32)
    list(eng.generate(long_prompt(), SamplingParams(temperature=0, max_new_tokens=2)))
    in_layers = [m for m in packed.model.layers.modules() if isinstance(m, kind)]
    assert len(in_layers) == 7 * packed.model.args.n_layers
    assert sorted(map(id, count)) == sorted(map(id, in_layers))  # each once, though ~10 chunks ran
    assert trims == [7 * (i + 1) for i in range(packed.model.args.n_layers)]
    assert all(m.dense is None for m in in_layers)  # freed when its layer was done
    del count[:]
    short = long_prompt()[:quant.DENSE_ROWS - 1]
    list(eng.generate(short, SamplingParams(temperature=0, max_new_tokens=2)))
    assert count == []  # a short prompt stays on the packed kernels, chunk by chunk


def test_cancel_lands_between_a_layers_chunks(packed):
    prompt = long_prompt()
    eng = Engine(packed.model, packed.tokenizer, stop_ids=(), prefill_chunk=32)
    cancel = threading.Event()
    calls = []
    # cancelled while layer 1 runs its second chunk
    spy_layers(packed.model, calls, after=lambda c: [i for i, _ in c].count(1) == 2 and cancel.set())
    evs = list(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=4), cancel=cancel))
    assert evs[-1].stop_reason == "cancelled" and evs[-1].tokens == []
    assert calls[-1][0] == 1 and [i for i, _ in calls].count(1) == 2  # nothing ran after that chunk
    assert all(m.dense is None for m in packed.model.modules() if isinstance(m, quant.QuantLinear))
    assert eng.cache.tokens[0] == []  # the partly written positions are not taken as cached
    done = next(ev for ev in eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=4))
                if isinstance(ev, Done))
    assert done.stats.cached_tokens == 0 and done.tokens == greedy(packed.model, prompt, 4)[0]
