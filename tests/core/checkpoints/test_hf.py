"""Hugging Face folders written by transformers load and match transformers' own outputs."""
import json
import shutil

import pytest
import torch

from core.checkpoints import detect, load
from tests.core.checkpoints.util import greedy, hf_greedy, write_json, write_tiny_tokenizer
from tests.generated import hello_world_ids
from tests.helpers import tiny_hf

SCALED = dict(rope_theta=500000.0, max_position_embeddings=1024,
              rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0,
                            "high_freq_factor": 8.0, "original_max_position_embeddings": 32})
CONFIGS = {
    "gqa": dict(num_key_value_heads=2),
    "tied": dict(tie_word_embeddings=True),
    "llama3_scaled": dict(num_key_value_heads=2, **SCALED),
    "head_dim32": dict(head_dim=32, num_key_value_heads=1),
}


def save(hf, folder, **kw):
    hf.save_pretrained(folder, **kw)
    write_tiny_tokenizer(folder)
    return folder


def assert_matches(hf, lm, prompt, n=20):
    ref_ids, ref_lp = hf_greedy(hf, prompt, n)
    got_ids, got_lp = greedy(lm.model, prompt, n)
    assert got_ids == ref_ids
    torch.testing.assert_close(got_lp, ref_lp, atol=1e-4, rtol=0)


PROMPT = [1] + [3 + (i * 7) % 90 for i in range(60)]  # long enough to pass 32 positions


@pytest.mark.parametrize("name", list(CONFIGS))
def test_save_pretrained_folder_matches_transformers(tmp_path, name):
    hf = tiny_hf(**CONFIGS[name])
    folder = save(hf, tmp_path / name)
    assert detect(folder) == "hf"
    lm = load(folder, device="cpu", dtype="float32")
    if name == "llama3_scaled":
        assert lm.args.rope_scaling == {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                                        "original_max_position_embeddings": 32}
    assert lm.args.tie_word_embeddings == (name == "tied")
    assert_matches(hf, lm, PROMPT)
    assert lm.info["format"] == "hf" and lm.info["tensor_types"] == ["float32"]
    assert lm.info["dequantized"] is False


def test_sharded_safetensors(tmp_path):
    hf = tiny_hf(1, num_key_value_heads=2)
    folder = save(hf, tmp_path / "sharded", max_shard_size="50KB")
    assert (folder / "model.safetensors.index.json").is_file()
    lm = load(folder, device="cpu", dtype="float32")
    assert len(lm.info["files"]) > 2
    assert_matches(hf, lm, PROMPT[:20])


def test_legacy_config_keys(tmp_path):
    """Hub files say rope_theta + rope_scaling (transformers 5 writes rope_parameters)."""
    hf = tiny_hf(2, **SCALED)
    folder = save(hf, tmp_path / "legacy")
    cfg = json.loads((folder / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    write_json(folder / "config.json", cfg)
    lm = load(folder, device="cpu", dtype="float32")
    assert lm.args.rope_theta == 500000.0 and lm.args.rope_scaling["factor"] == 4.0
    assert_matches(hf, lm, PROMPT)


def test_pytorch_model_bin_weights_only(tmp_path):
    hf = tiny_hf(3, num_key_value_heads=2)
    folder = tmp_path / "bin"
    save(hf, folder)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save(sd, folder / "pytorch_model.bin")
    lm = load(folder, device="cpu", dtype="float32")
    assert_matches(hf, lm, PROMPT[:20])


def test_stop_ids_and_chat_template(tmp_path):
    hf = tiny_hf(4)
    folder = save(hf, tmp_path / "chat")
    write_json(folder / "generation_config.json", {"bos_token_id": 1, "eos_token_id": [2, 5, 7]})
    llama2 = "{% for m in messages %}[INST] <<SYS>>{{ m['content'] }} [/INST]{% endfor %}"
    write_json(folder / "tokenizer_config.json", {"bos_token": "<s>", "eos_token": {"content": "</s>"},
                                                  "chat_template": llama2})
    lm = load(folder, device="cpu", dtype="float32")
    assert {2, 5, 7} <= lm.stop_ids
    assert lm.chat_format.name == "llama2"
    assert lm.info["chat_format"] == "llama2" and lm.info["chat_template_source"] == "tokenizer_config"
    assert lm.chat_template == llama2


def test_chat_template_jinja_side_file(tmp_path):
    hf = tiny_hf(4)
    folder = save(hf, tmp_path / "jinja")
    (folder / "chat_template.jinja").write_text("[INST] <<SYS>> {{ x }} [/INST]")
    lm = load(folder, device="cpu", dtype="float32")
    assert lm.chat_format.name == "llama2" and lm.info["chat_template_source"] == "tokenizer_config"


def test_sentencepiece_tokenizer_model(tmp_path, llama2_kind_tokenizer):
    hf = tiny_hf(5, vocab_size=32000)
    folder = tmp_path / "sp"
    hf.save_pretrained(folder)
    shutil.copy(llama2_kind_tokenizer, folder / "tokenizer.model")  # Meta's where present
    lm = load(folder, device="cpu", dtype="float32")
    assert lm.tokenizer.kind == "sentencepiece"
    assert lm.tokenizer.encode("Hello world") == hello_world_ids(folder)
    assert 2 in lm.stop_ids
    assert_matches(hf, lm, [1, 15043, 3186, 29892], n=8)
