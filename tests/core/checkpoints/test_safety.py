"""Nothing pickled runs; broken files fail with a typed error naming the file and tensor."""
import json
import os
import pathlib

import pytest
import torch

from core.checkpoints import detect, load
from core.errors import CheckpointError
from core.checkpoints.gguf_vocab import sentencepiece_from_vocab
from tests.core.checkpoints.util import random_model, sp_vocab, write_gguf, write_json, write_tiny_tokenizer
from tests.helpers import tiny_hf


class Evil:
    """Unpickling this calls Path.touch(marker): proof that pickled code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def evil_file(file, marker):
    torch.save({"tok_embeddings.weight": torch.zeros(2, 2), "payload": Evil(marker)}, file)


def test_malicious_pickle_would_run_unsafely(tmp_path):
    """Guards the tests below: this payload does run when loaded the unsafe way."""
    marker = tmp_path / "ran"
    evil_file(tmp_path / "x.pth", marker)
    torch.load(tmp_path / "x.pth", weights_only=False)
    assert marker.exists()


def test_malicious_meta_pth_refused(tmp_path):
    marker = tmp_path / "ran"
    folder = tmp_path / "meta"
    folder.mkdir()
    write_json(folder / "params.json", {"dim": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 96})
    evil_file(folder / "consolidated.00.pth", marker)
    tok = sentencepiece_from_vocab(*sp_vocab(), bos_id=1, eos_id=2, unk_id=0)
    (folder / "tokenizer.model").write_bytes(tok.processor.serialized_model_proto())
    with pytest.raises(CheckpointError) as e:
        load(folder, device="cpu")
    assert not marker.exists()
    assert "consolidated.00.pth" in str(e.value)


def test_malicious_pytorch_model_bin_refused(tmp_path):
    marker = tmp_path / "ran"
    folder = tmp_path / "hf"
    tiny_hf().config.save_pretrained(folder)
    write_tiny_tokenizer(folder)
    evil_file(folder / "pytorch_model.bin", marker)
    with pytest.raises(CheckpointError, match="refused") as e:
        load(folder, device="cpu")
    assert not marker.exists()
    assert "pytorch_model.bin" in str(e.value)


@pytest.fixture
def hf_folder(tmp_path):
    folder = tmp_path / "hf"
    tiny_hf(num_key_value_heads=2).save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return folder


def rewrite_safetensors(folder, edit):
    from safetensors.torch import load_file, save_file
    f = folder / "model.safetensors"
    sd = load_file(f)
    edit(sd)
    save_file(sd, f, metadata={"format": "pt"})


def test_hf_missing_tensor(hf_folder):
    rewrite_safetensors(hf_folder, lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="missing") as e:
        load(hf_folder, device="cpu")
    assert e.value.tensor == "model.layers.1.mlp.up_proj.weight"
    assert "model.layers.1.mlp.up_proj.weight" in str(e.value) and str(hf_folder) in str(e.value)


def test_hf_wrong_shape(hf_folder):
    def edit(sd):
        sd["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(64, 64)
    rewrite_safetensors(hf_folder, edit)
    with pytest.raises(CheckpointError, match="shape") as e:
        load(hf_folder, device="cpu")
    assert e.value.tensor == "model.layers.0.self_attn.k_proj.weight"
    assert e.value.file.endswith("model.safetensors")


def test_hf_unexpected_tensor(hf_folder):
    rewrite_safetensors(hf_folder, lambda sd: sd.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="unexpected") as e:
        load(hf_folder, device="cpu")
    assert e.value.tensor == "model.layers.0.mlp.extra.weight"


def test_hf_truncated_safetensors(hf_folder):
    f = hf_folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated") as e:
        load(hf_folder, device="cpu")
    assert e.value.file == str(f)


def test_hf_garbage_safetensors(hf_folder):
    (hf_folder / "model.safetensors").write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError) as e:
        load(hf_folder, device="cpu")
    assert "model.safetensors" in str(e.value)


def test_hf_tokenizer_larger_than_embedding(hf_folder):
    cfg = json.loads((hf_folder / "config.json").read_text())
    cfg["vocab_size"] = 20
    write_json(hf_folder / "config.json", cfg)
    with pytest.raises(CheckpointError, match="30 tokens but the embedding only 20") as e:
        load(hf_folder, device="cpu")
    assert e.value.file.endswith("tokenizer.json") and e.value.tensor == "model.embed_tokens.weight"


def test_hf_other_model_type(hf_folder):
    cfg = json.loads((hf_folder / "config.json").read_text())
    cfg["model_type"] = "mistral"
    write_json(hf_folder / "config.json", cfg)
    with pytest.raises(CheckpointError, match="'mistral'"):
        load(hf_folder, device="cpu")


def test_hf_broken_config(hf_folder):
    (hf_folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load(hf_folder, device="cpu")


def test_hf_missing_shard(tmp_path):
    folder = tmp_path / "sharded"
    tiny_hf().save_pretrained(folder, max_shard_size="50KB")
    write_tiny_tokenizer(folder)
    sorted(folder.glob("model-*.safetensors"))[-1].unlink()
    with pytest.raises(CheckpointError, match="missing") as e:
        load(folder, device="cpu")
    assert "model.safetensors.index.json" in str(e.value)


@pytest.fixture
def gguf_file(tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(f, random_model(0), qtype="Q8_0")
    return f


def test_gguf_truncated(gguf_file):
    data = gguf_file.read_bytes()
    gguf_file.write_bytes(data[: len(data) - 5000])
    with pytest.raises(CheckpointError, match="truncated") as e:
        load(gguf_file, device="cpu")
    assert e.value.file == str(gguf_file) and e.value.tensor == "output.weight"


def test_gguf_corrupt_header(gguf_file):
    data = bytearray(gguf_file.read_bytes())
    data[8:24] = b"\xff" * 16  # tensor and key counts
    gguf_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="GGUF") as e:
        load(gguf_file, device="cpu")
    assert str(gguf_file) in str(e.value)


def test_gguf_other_architecture(tmp_path):
    f = tmp_path / "q.gguf"
    write_gguf(f, random_model(0), arch="qwen2")
    with pytest.raises(CheckpointError, match="architecture 'qwen2' is not supported"):
        load(f, device="cpu")


def test_gguf_missing_tensor(tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(f, random_model(0), skip=("layers.1.feed_forward.w3.weight",))
    with pytest.raises(CheckpointError, match="missing") as e:
        load(f, device="cpu")
    assert e.value.tensor == "blk.1.ffn_up.weight" and e.value.file == str(f)


def test_gguf_wrong_shape(tmp_path):
    m = random_model(0)
    f = tmp_path / "m.gguf"
    write_gguf(f, m, extra={"llama.feed_forward_length": (128, __import__("gguf").GGUFValueType.UINT32)})
    with pytest.raises(CheckpointError, match="shape") as e:
        load(f, device="cpu")
    assert e.value.tensor.startswith("blk.0.ffn_") and e.value.file == str(f)


def test_gguf_vocab_larger_than_embedding(tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(f, random_model(0, vocab_size=200))
    with pytest.raises(CheckpointError, match="279 tokens but the embedding only 200") as e:
        load(f, device="cpu")
    assert e.value.tensor == "token_embd.weight"


def test_nothing_recognisable(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError) as e:
        detect(tmp_path)
    for looked_for in ("params.json", "config.json", "safetensors", ".gguf"):
        assert looked_for in str(e.value)
    (tmp_path / "x.bin").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="GGUF"):
        load(tmp_path / "x.bin")
