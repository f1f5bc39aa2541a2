"""`python -m core tokenize` and `info`: token ids and what a model is."""
import json

import torch

from tests.core.cli.helpers import run_cli
from tests.generated import hello_world_ids


def test_tokenize_llama3_chat_matches_meta(capsys, meta_fixtures):
    rc, out, _ = run_cli(capsys, "tokenize", meta_fixtures / "llama3-tokenizer.model", "--text",
                         "This is a test sentence.", "--chat")
    assert rc == 0
    assert json.loads(out) == [128000, 128006, 882, 128007, 271, 2028, 374, 264, 1296, 11914, 13, 128009,
                               128006, 78191, 128007, 271]
    rc, out, _ = run_cli(capsys, "tokenize", meta_fixtures / "llama3-tokenizer.model", "--text",
                         "This is a test sentence.", "--bos", "--eos")
    assert json.loads(out) == [128000, 2028, 374, 264, 1296, 11914, 13, 128001]


def test_tokenize_model_folder(capsys, tiny_meta_dir):
    rc, out, _ = run_cli(capsys, "tokenize", tiny_meta_dir, "--text", "Hello world")
    assert rc == 0 and json.loads(out) == hello_world_ids(tiny_meta_dir)


def test_info(capsys, tiny_meta_dir):
    rc, out, _ = run_cli(capsys, "info", tiny_meta_dir)
    info = json.loads(out)
    assert rc == 0
    assert info["format"] == "meta" and info["vocab_size"] == 32000 and info["n_kv_heads"] == 2
    assert info["parameters"] > 0 and info["context_length"] > 0 and info["chat_format"] in ("raw", "llama2", "llama3")


def test_info_and_generate_say_which_decode_path_runs(capsys, tiny_meta_dir, monkeypatch):
    rc, out, _ = run_cli(capsys, "info", tiny_meta_dir)
    assert rc == 0 and json.loads(out)["decode"] == "eager: compile is off"
    rc, out, _ = run_cli(capsys, "info", tiny_meta_dir, "--compile")
    assert rc == 0 and json.loads(out)["decode"] == "compiles at the first decode step (inductor)"
    rc, out, _ = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "Hello", "--max-new-tokens", "6",
                         "--temperature", "0", "--json")
    plain = json.loads(out)
    assert rc == 0 and "decode" not in plain

    def no_compiler(fn, **kw):  # as where no C++ compiler is installed
        def compiled(*a, **k):
            raise RuntimeError("no C++ compiler here")
        return compiled
    monkeypatch.setattr(torch, "compile", no_compiler)
    rc, out, _ = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "Hello", "--max-new-tokens", "6",
                         "--temperature", "0", "--json", "--compile")
    fell_back = json.loads(out)
    assert rc == 0 and fell_back["decode"].startswith("eager: compiling failed (RuntimeError: no C++ compiler")
    assert fell_back["tokens"] == plain["tokens"] and len(plain["tokens"]) == 6
