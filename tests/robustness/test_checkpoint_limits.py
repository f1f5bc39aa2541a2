"""Every header number is range-checked and the memory need computed before any tensor
exists; files are read bounded; silently wrong checkpoints are refused (issue 12)."""
import json
import os
import socket
import time

import numpy as np
import pytest
import torch

from core import limits
from core.checkpoints import load
from core.errors import CheckpointError, LlamaDeskError, ResourceError, plain_text
from core.cli.main import main
from core.engine.engine import Engine
from core.engine.events import Token
from core.engine.settings import SamplingParams
from tests.core.checkpoints.util import random_model, sp_vocab, write_gguf as write_model_gguf
from tools.badseeds import write_gguf
import gguf
import shutil

pytestmark = pytest.mark.timeout(60)


def edit_json(file, **changes):
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


@pytest.mark.parametrize("kind,file,key,value", [
    ("meta", "params.json", "n_layers", 10**9),
    ("meta", "params.json", "n_heads", 0),
    ("meta", "params.json", "dim", -64),
    ("meta", "params.json", "max_seq_len", 10**12),
    ("meta", "params.json", "norm_eps", -1e-5),
    ("meta", "params.json", "n_kv_heads", "four"),
    ("hf", "config.json", "num_hidden_layers", 10**9),
    ("hf", "config.json", "num_attention_heads", 0),
    ("hf", "config.json", "max_position_embeddings", 10**12),
    ("hf", "config.json", "rms_norm_eps", -1e-5),
    ("hf", "config.json", "intermediate_size", [1, 2]),
    ("hf", "config.json", "rope_scaling", 3),
])
def test_folder_fields_out_of_range_name_file_and_field(seeds, clone, kind, file, key, value):
    d = clone(seeds[kind])
    edit_json(d / file, **{key: value})
    t0 = time.monotonic()
    with pytest.raises(CheckpointError) as e:
        load(d, device="cpu")
    msg = str(e.value)
    assert f"'{key}'" in msg and file in msg, msg
    assert time.monotonic() - t0 < 30  # not a 90 s climb to 7.7 GB before refusing


@pytest.mark.parametrize("key,value", [
    ("llama.block_count", 10**9), ("llama.attention.head_count", 0), ("llama.context_length", 2**40),
    ("llama.embedding_length", "x"), ("llama.attention.layer_norm_rms_epsilon", -1e-5),
    ("llama.attention.head_count_kv", 3), ("tokenizer.ggml.eos_token_id", 10**6),
])
def test_gguf_metadata_out_of_range_names_the_key(seeds, tmp_path, key, value):
    f = tmp_path / "m.gguf"
    write_gguf(seeds["gguf"], f, set_kv={key: value})
    with pytest.raises(CheckpointError) as e:
        load(f, device="cpu")
    short = key.split(".")[-1]
    assert short in str(e.value) or key in str(e.value), str(e.value)


def test_memory_budget_refuses_before_allocating(seeds, monkeypatch):
    args = {k: load(seeds[k], device="cpu", dtype="float32").args for k in ("gguf", "meta", "hf")}
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: 100_000)
    for kind, a in args.items():
        with pytest.raises(ResourceError) as e:
            load(seeds[kind], device="cpu", dtype="float32")
        assert e.value.needed == limits.model_bytes(a, 4) and e.value.available == 100_000
        assert f"needs {limits.human(e.value.needed)} of memory" in str(e.value)


def test_budget_counts_parameters_like_the_model_does(seeds):
    lm = load(seeds["gguf"], device="cpu", dtype="float32")
    assert limits.param_count(lm.args) == sum(p.numel() for p in lm.model.parameters())
    tied = limits.param_count(type(lm.args)(**{**lm.args.__dict__, "tie_word_embeddings": True}))
    assert tied == limits.param_count(lm.args) - lm.args.vocab_size * lm.args.dim


@pytest.mark.parametrize("target", ["params.json", "consolidated.00.pth", "tokenizer.model"])
def test_fifo_and_devices_are_refused_without_blocking(seeds, clone, target):
    for make in ("fifo", "zero", "socket"):
        d = clone(seeds["meta"])
        (d / target).unlink()
        if make == "fifo":
            os.mkfifo(d / target)
        elif make == "zero":
            os.symlink("/dev/zero", d / target)
        else:
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(d / target))
            s.close()
        with pytest.raises(LlamaDeskError, match="only regular files"):
            load(d, device="cpu")


def test_json_nesting_and_size_are_bounded(seeds, clone):
    d = clone(seeds["hf"])
    (d / "config.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(CheckpointError, match="nested 100001 levels"):
        load(d, device="cpu")
    (d / "config.json").write_text(" " * (limits.MAX_CONFIG_BYTES + 1) + "{}")
    with pytest.raises(CheckpointError, match="more than the 4.0 MiB allowed"):
        load(d, device="cpu")


def test_json_depth_ignores_brackets_in_strings():
    assert limits.json_depth(b'{"a": "[[[[{{{", "b": [1, {"c": "]]"}]}') == 3
    assert limits.json_depth(b'"\\"[["') == 0


def _first_float(t):
    return t.view(-1)


def test_non_finite_weights_are_refused_in_every_format(seeds, clone, tmp_path):
    from safetensors.torch import load_file, save_file
    r = gguf.GGUFReader(seeds["gguf"])
    t = next(t for t in r.tensors if t.name == "blk.2.ffn_up.weight")
    arr = np.array(t.data, dtype=np.float32)
    arr.reshape(-1)[123] = np.inf
    f = tmp_path / "inf.gguf"
    write_gguf(seeds["gguf"], f, tensors={t.name: arr})
    with pytest.raises(CheckpointError, match=r"NaN or infinite.*index 123.*blk\.2\.ffn_up\.weight"):
        load(f, device="cpu")
    d = clone(seeds["hf"])
    sd = load_file(d / "model.safetensors")
    sd["model.layers.1.self_attn.v_proj.weight"].view(-1)[7] = float("nan")
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="NaN or infinite.*v_proj"):
        load(d, device="cpu")
    d = clone(seeds["meta"])
    sd = torch.load(d / "consolidated.00.pth", weights_only=True)
    sd["norm.weight"][0] = -float("inf")
    torch.save(sd, d / "consolidated.00.pth")
    with pytest.raises(CheckpointError, match="NaN or infinite.*norm.weight"):
        load(d, device="cpu")


def test_retyped_and_misaligned_gguf_tensors_are_refused(seeds, tmp_path):
    f = tmp_path / "retyped.gguf"
    write_gguf(seeds["gguf"], f, retype={"blk.1.attn_k.weight": "F16"})
    with pytest.raises(CheckpointError, match="does not match the data"):
        load(f, device="cpu")
    f = tmp_path / "grown.gguf"  # F32 data read as... a wider type would overlap its neighbour
    write_gguf(seeds["gguf"], f, retype={"output_norm.weight": "F16"})
    with pytest.raises(CheckpointError, match="does not match the data"):
        load(f, device="cpu")
    f = tmp_path / "shifted.gguf"
    write_gguf(seeds["gguf"], f, shift={"blk.0.ffn_down.weight": 4})
    with pytest.raises(CheckpointError, match="alignment"):
        load(f, device="cpu")


def test_duplicate_safetensors_key_is_refused(seeds, clone):
    d = clone(seeds["hf"])
    raw = (d / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    name = "model.layers.0.self_attn.k_proj.weight"
    other = next(k for k in header if k not in ("__metadata__", name) and header[k]["shape"] == header[name]["shape"])
    text = json.dumps(header)[:-1] + f', "{name}": {json.dumps(header[other])}' + "}"
    new = text.encode() + b" " * (-len(text) % 8)
    (d / "model.safetensors").write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n:])
    with pytest.raises(CheckpointError, match=f"stated twice.*{name}"):
        load(d, device="cpu")


@pytest.mark.parametrize("kind", ["meta", "hf"])
def test_folders_whose_names_are_not_utf8_load(seeds, tmp_path, kind):
    d = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9-\xff-" + kind.encode())
    shutil.copytree(seeds[kind], d)
    lm = load(d, device="cpu", dtype="float32")
    ref = load(seeds[kind], device="cpu", dtype="float32")
    ids = torch.tensor([[1, 5, 9, 200]])
    torch.testing.assert_close(lm.model(ids), ref.model(ids), rtol=0, atol=0)


def test_messages_are_one_plain_line_cut_at_a_word():
    evil = "bad \x1b[31mred\x1b[0m \x1b]0;title\x07 value\nsecond line\r\x00" + " word" * 300
    msg = plain_text(evil)
    assert "\x1b" not in msg and "\n" not in msg and "\x00" not in msg and "\x07" not in msg
    assert msg.startswith("bad red value second line word")
    assert msg.endswith(" …") and msg[:-2].endswith("word") and len(msg) <= 602
    assert plain_text("x" * 10) == "x" * 10
    assert "\ufffd" in plain_text(os.fsdecode(b"caf\xe9"))
    e = CheckpointError("\x1b[2Jcleared", file=os.fsdecode(b"/tmp/\xff"))
    assert str(e).startswith("cleared — in /tmp/\ufffd")


def test_embedding_larger_than_tokenizer_is_reported_and_never_sampled(tmp_path):
    m = random_model(3)  # vocab 288; the tokenizer below has 279 tokens
    with torch.no_grad():
        m.output.weight[279:] = m.output.weight[279:] * 0 + 50.0  # the padded rows would always win
    f = tmp_path / "padded.gguf"
    write_model_gguf(f, m, vocab=sp_vocab(20))
    lm = load(f, device="cpu", dtype="float32")
    assert lm.tokenizer.vocab_size == 279 and lm.args.vocab_size == 288
    assert lm.info["tokenizer_vocab_size"] == 279 and "never sampled" in lm.info["warnings"][0]
    eng = Engine(lm.model, lm.tokenizer, stop_ids=set())
    for params in (SamplingParams(temperature=0, max_new_tokens=12), SamplingParams(temperature=1.5, max_new_tokens=12, seed=1)):
        evs = list(eng.generate([1, 270, 271], params))
        toks = [e.token_id for e in evs if isinstance(e, Token)]
        assert len(toks) == 12 and max(toks) < 279
        assert evs[-1].stop_reason == "length"


def test_symlinked_files_load_and_info_reports_them(seeds, tmp_path, capsys):
    d = tmp_path / "linked"
    d.mkdir()
    for f in seeds["meta"].iterdir():
        os.symlink(f, d / f.name)
    assert main(["info", str(d), "--device", "cpu"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["symlinks"][str(d / "params.json")] == str((seeds["meta"] / "params.json").resolve())


def test_tokenize_reads_only_the_magic_of_a_huge_file(tmp_path, capsys):
    f = tmp_path / "huge.model"
    with open(f, "wb") as fh:
        fh.write(b"\x0a\x05junk")
        fh.truncate(limits.MAX_TOKENIZER_BYTES + 1)  # sparse: nothing is really stored
    assert main(["tokenize", str(f), "--text", "x"]) == 2
    assert "more than the 256.0 MiB allowed" in capsys.readouterr().err
