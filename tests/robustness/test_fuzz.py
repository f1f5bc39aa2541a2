"""Property-based fuzzing of every parser through the public loader API: whatever the
bytes, a load ends in a model or one core.errors exception with a plain one-line message
(issue 12). Example counts are bounded so the normal test run stays fast."""
import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.checkpoints import load
from core.errors import LlamaDeskError
from core.tokenizer import load_tokenizer
from tools.badseeds import write_gguf
import base64

pytestmark = pytest.mark.timeout(300)
FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

values = st.one_of(st.integers(-2**64, 2**64), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                   st.booleans(), st.text(max_size=4), st.lists(st.integers(-3, 10**6), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
small_ints = st.one_of(st.integers(-5, 5000), st.sampled_from([2**31, 2**63 - 1, 10**9]))


def loads_or_refuses(path, **kw):
    try:
        load(path, device="cpu", dtype="float32", **kw)
    except LlamaDeskError as e:
        msg = str(e)
        assert msg and "\n" not in msg and "\x1b" not in msg and "Traceback" not in msg


def fresh(seed, tmp_path, name):
    d = tmp_path / name
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(seed, d)
    return d


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(["dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                                                 "multiple_of", "ffn_dim_multiplier", "norm_eps", "rope_theta",
                                                 "max_seq_len", "use_scaled_rope", "hidden_dim", "head_dim",
                                                 "tie_word_embeddings"]),
                               st.one_of(values, small_ints), min_size=1, max_size=3))
def test_params_json(seeds, tmp_path, changes):
    d = fresh(seeds["meta"], tmp_path, "meta")
    params = json.loads((d / "params.json").read_text())
    params.update(changes)
    (d / "params.json").write_text(json.dumps(params))
    loads_or_refuses(d)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(["hidden_size", "num_hidden_layers", "num_attention_heads",
                                                 "num_key_value_heads", "vocab_size", "intermediate_size",
                                                 "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
                                                 "max_position_embeddings", "tie_word_embeddings", "model_type",
                                                 "eos_token_id", "rope_parameters"]),
                               st.one_of(values, small_ints), min_size=1, max_size=3),
       gen=st.dictionaries(st.sampled_from(["eos_token_id", "bos_token_id"]), values, max_size=2))
def test_config_and_generation_config(seeds, tmp_path, changes, gen):
    d = fresh(seeds["hf"], tmp_path, "hf")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "generation_config.json").write_text(json.dumps(gen))
    loads_or_refuses(d)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(["llama.block_count", "llama.embedding_length",
                                                 "llama.feed_forward_length", "llama.attention.head_count",
                                                 "llama.attention.head_count_kv", "llama.context_length",
                                                 "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base",
                                                 "llama.attention.key_length", "llama.vocab_size",
                                                 "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                                 "tokenizer.ggml.model", "general.alignment"]),
                               st.one_of(st.integers(-2**31, 2**32 - 1), st.floats(width=32), st.text(max_size=3),
                                         st.sampled_from([0, 1, 7, 2**40, 10**9])),
                               min_size=1, max_size=2))
def test_gguf_metadata(seeds, tmp_path, changes):
    f = tmp_path / "m.gguf"
    try:
        write_gguf(seeds["gguf"], f, set_kv=changes)
    except Exception:  # noqa: BLE001 — gguf's writer refuses some values itself
        return
    loads_or_refuses(f)


@FUZZ
@given(data=st.data())
def test_gguf_bytes(seeds, tmp_path, data):
    raw = bytearray(seeds["gguf"].read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, min(len(raw) - 1, 20000)))  # the header and metadata
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    f = tmp_path / "b.gguf"
    f.write_bytes(bytes(raw[:cut] if cut is not None else raw))
    loads_or_refuses(f)


@FUZZ
@given(header=st.one_of(
    st.binary(max_size=64),
    st.dictionaries(st.text(max_size=8), st.one_of(values, st.fixed_dictionaries(
        {"dtype": st.sampled_from(["F32", "F16", "I64", "X"]), "shape": st.lists(st.integers(-1, 10**6), max_size=3),
         "data_offsets": st.lists(st.integers(-1, 10**9), max_size=3)})), max_size=3).map(
        lambda d: json.dumps(d).encode())))
def test_safetensors_header(seeds, tmp_path, header):
    d = fresh(seeds["hf"], tmp_path, "hf")
    raw = (d / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n:])
    loads_or_refuses(d)


def tokenizer_refuses_or_loads(path):
    try:
        tok = load_tokenizer(path)
    except LlamaDeskError as e:
        assert "\n" not in str(e)
        return
    try:
        tok.encode("hello world \ud800")
    except LlamaDeskError:
        pass


@FUZZ
@given(data=st.data())
def test_sentencepiece_model_bytes(seeds, tmp_path, data):
    raw = bytearray(seeds["tokenizer.model"].read_bytes())
    for _ in range(data.draw(st.integers(1, 16))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    f = tmp_path / "t.model"
    f.write_bytes(bytes(raw[: data.draw(st.integers(1, len(raw)))]))
    tokenizer_refuses_or_loads(f)


@FUZZ
@given(edit=st.dictionaries(st.sampled_from(["model", "added_tokens", "normalizer", "pre_tokenizer", "decoder",
                                             "post_processor", "version"]),
                            st.recursive(values, lambda inner: st.one_of(
                                st.lists(inner, max_size=3), st.dictionaries(
                                    st.sampled_from(["type", "vocab", "merges", "id", "content", "pattern"]),
                                    inner, max_size=3)), max_leaves=6), min_size=1, max_size=2))
def test_tokenizer_json(seeds, tmp_path, edit):
    doc = json.loads(seeds["tokenizer.json"].read_text())
    doc.update(edit)
    f = tmp_path / "tokenizer.json"
    f.write_text(json.dumps(doc))
    tokenizer_refuses_or_loads(f)


@FUZZ
@given(lines=st.lists(st.tuples(st.binary(min_size=0, max_size=4), st.integers(-3, 2**70)), min_size=1, max_size=40))
def test_tiktoken_ranks(tmp_path, lines):
    f = tmp_path / "ranks.model"
    f.write_bytes(b"".join(base64.b64encode(b) + b" " + str(r).encode() + b"\n" for b, r in lines if b))
    if f.stat().st_size:
        tokenizer_refuses_or_loads(f)
