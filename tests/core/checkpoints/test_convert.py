"""convert: any format -> HF (or Meta) folder that our loader and transformers both open."""
import json
import os
import stat

import pytest
import torch

from core.cli.main import main
from core.checkpoints import load
from core.checkpoints.convert import convert
from tests.core.checkpoints.util import (PROMPT, greedy, hf_greedy, random_model, write_gguf, write_llama3_gguf,
                                         write_tiny_tokenizer)
from tests.helpers import tiny_hf
from core.errors import CheckpointError


def hf_from(folder):
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_stories260k_to_hf_and_meta_identical(fixtures, tmp_path):
    src = fixtures / "stories260K.gguf"
    ref = load(src, device="cpu", dtype="float32")
    ref_ids, ref_lp = greedy(ref.model, PROMPT, 30)
    for fmt in ("hf", "meta"):
        out = convert(src, tmp_path / fmt, fmt=fmt)
        lm = load(out, device="cpu", dtype="float32")
        assert lm.info["format"] == fmt
        ids, lp = greedy(lm.model, PROMPT, 30)
        assert ids == ref_ids, fmt
        torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
        assert lm.tokenizer.encode("Once upon a time", bos=True) == PROMPT
        assert lm.stop_ids == ref.stop_ids
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["eos_token_id"] == 2
    # transformers opens the HF folder and decodes the same story
    hf_ids, hf_lp = hf_greedy(hf_from(tmp_path / "hf"), PROMPT, 30)
    assert hf_ids == ref_ids
    torch.testing.assert_close(hf_lp, ref_lp, atol=1e-4, rtol=0)


def test_quantized_gguf_to_hf_matches_in_transformers(tmp_path):
    f = tmp_path / "q.gguf"
    write_gguf(f, random_model(7), qtype="Q4_0")
    ours = load(f, device="cpu", dtype="float32")
    out = convert(f, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    ids = torch.randint(0, 280, (1, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf_from(out)(ids).logits, ours.model(ids), atol=1e-4, rtol=0)


def test_hf_roundtrip_keeps_bf16_scaling_and_tied(tmp_path):
    hf = tiny_hf(8, tie_word_embeddings=True, num_key_value_heads=2, rope_theta=500000.0,
                 max_position_embeddings=1024,
                 rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0,
                               "high_freq_factor": 8.0, "original_max_position_embeddings": 32})
    src = tmp_path / "src"
    hf.to(torch.bfloat16).save_pretrained(src)
    write_tiny_tokenizer(src)
    (src / "chat_template.jinja").write_text("[INST] <<SYS>> {{ x }} [/INST]")
    out = convert(src, tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16" and cfg["tie_word_embeddings"] is True
    assert cfg["rope_scaling"]["low_freq_factor"] == 2.0
    assert "chat_template" in json.loads((out / "tokenizer_config.json").read_text())
    again = load(out, device="cpu", dtype="float32")
    assert again.chat_format.name == "llama2"
    prompt = [1] + [3 + (i * 5) % 90 for i in range(50)]
    # the reference reads the bf16 files afresh (hf.to(bf16) also rounded its RoPE buffer)
    a_ids, a_lp = hf_greedy(hf_from(src), prompt, 12)
    b_ids, b_lp = hf_greedy(hf_from(out), prompt, 12)
    c_ids, c_lp = greedy(again.model, prompt, 12)
    assert a_ids == b_ids == c_ids
    torch.testing.assert_close(b_lp, a_lp, atol=1e-4, rtol=0)
    torch.testing.assert_close(c_lp, a_lp, atol=1e-4, rtol=0)


def test_gpt2_vocab_gguf_to_hf_tokenizer_json(tmp_path):
    src = tmp_path / "l3.gguf"
    write_llama3_gguf(src)
    a = load(src, device="cpu", dtype="float32")
    out = convert(src, tmp_path / "hf")
    assert (out / "tokenizer.json").is_file()
    b = load(out, device="cpu", dtype="float32")
    text = "hello world"
    assert b.tokenizer.encode(text, bos=True) == a.tokenizer.encode(text, bos=True)
    assert b.chat_format.name == "llama3" and b.stop_ids == a.stop_ids
    from transformers import AutoTokenizer
    t = AutoTokenizer.from_pretrained(out)
    assert t(text, add_special_tokens=False).input_ids == a.tokenizer.encode(text)


def test_cli_convert_and_info(fixtures, tmp_path, capsys):
    dst = tmp_path / "hf"
    assert main(["convert", str(fixtures / "stories260K.gguf"), str(dst), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == sorted(p.name for p in dst.iterdir())
    assert main(["convert", str(fixtures / "stories260K.gguf"), str(dst)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and len(err.strip().splitlines()) == 1
    q = tmp_path / "q.gguf"
    write_gguf(q, random_model(0), qtype="Q8_0")
    # Q8_0 linears stay packed under the default dtype (nothing dequantized); float32 dequantizes
    for model, fmt, dtype, dequant in ((q, "gguf", "auto", False), (q, "gguf", "float32", True),
                                       (dst, "hf", "auto", False)):
        assert main(["info", str(model), "--device", "cpu", "--dtype", dtype]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["format"] == fmt and info["dequantized"] is dequant
        assert info["chat_format"] == "raw" and "chat_template_source" in info
    assert info["tensor_types"] == ["float32"]


def test_convert_refuses_same_or_bad_destination(fixtures, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError):
        convert(fixtures / "stories260K.gguf", tmp_path / "file")


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_converted_files_get_the_usual_permissions(fixtures, tmp_path, umask):
    old = os.umask(umask)
    try:
        for fmt in ("hf", "meta"):
            dst = convert(fixtures / "stories260K.gguf", tmp_path / f"{fmt}-{umask:o}", fmt=fmt)
            assert stat.S_IMODE(dst.stat().st_mode) == 0o777 & ~umask
            files = list(dst.iterdir())
            assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask for f in files), \
                {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files}
    finally:
        os.umask(old)
