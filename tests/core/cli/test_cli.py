"""`python -m core`: subcommands, JSON contract, and the exit-2 error path."""
import json
import subprocess
import sys

import pytest
import torch

from core.cli.main import main
from tests.helpers import ROOT


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_generate_json_fields(capsys, tiny_meta_dir):
    rc, out, err = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "Hello world", "--max-new-tokens", "6",
                           "--temperature", "0", "--json", "--device", "cpu")
    assert rc == 0, err
    obj = json.loads(out.strip().splitlines()[-1])
    assert obj["prompt_tokens"] == [1, 15043, 3186]  # BOS + Llama 2 ids from the fixtures README
    assert len(obj["tokens"]) == len(obj["logprobs"]) == 6
    assert all(lp <= 0 for lp in obj["logprobs"])
    assert obj["stop_reason"] == "length"
    assert set(obj["timings"]) == {"load_s", "prefill_s", "decode_s", "prefill_tok_s", "decode_tok_s"}
    assert isinstance(obj["text"], str) and obj["text"]


def test_generate_streams_same_text_as_json(capsys, tiny_meta_dir):
    args = ["generate", tiny_meta_dir, "--prompt", "Hi", "--max-new-tokens", "8", "--seed", "4"]
    rc, streamed, _ = run_cli(capsys, *args)
    rc2, out, _ = run_cli(capsys, *args, "--json")
    assert rc == rc2 == 0
    assert streamed == json.loads(out)["text"] + "\n"


def test_empty_prompt_is_bos_alone(capsys, tiny_meta_dir):
    rc, out, _ = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "", "--max-new-tokens", "2", "--json")
    assert rc == 0 and json.loads(out)["prompt_tokens"] == [1]


def test_chat_uses_the_format(capsys, tiny_meta_dir):
    rc, out, _ = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "Hi", "--chat", "--chat-format", "llama2",
                         "--system", "Be brief.", "--max-new-tokens", "2", "--json")
    assert rc == 0
    ids = json.loads(out)["prompt_tokens"]
    from core.tokenizer import load_tokenizer
    tok = load_tokenizer(tiny_meta_dir / "tokenizer.model")
    assert ids == tok.encode("[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]", bos=True)


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
    assert rc == 0 and json.loads(out) == [15043, 3186]


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


def test_compare_json(capsys, tiny_meta_dir):
    rc, out, err = run_cli(capsys, "compare", tiny_meta_dir, "--prompt", "Hello", "--max-new-tokens", "5",
                           "--lane", "temperature=0", "--lane", "temperature=1.0,top_p=0.9,seed=7",
                           "--lane", "temperature=1.0,top_p=0.9,seed=7,max_new_tokens=3", "--json")
    assert rc == 0, err
    obj = json.loads(out)
    lanes = obj["lanes"]
    assert [len(l["tokens"]) for l in lanes] == [5, 5, 3]
    assert lanes[1]["tokens"][:3] == lanes[2]["tokens"]
    assert lanes[1]["settings"]["seed"] == 7 and lanes[1]["settings"]["top_p"] == 0.9
    assert set(obj["timings"]) >= {"prefill_s", "decode_s", "total_s"}
    assert all(set(l) >= {"settings", "text", "tokens", "logprobs", "stop_reason", "stats"} for l in lanes)


@pytest.mark.parametrize("argv,needle", [
    (["generate", "{m}", "--prompt", "x", "--temperature", "-0.5"], "temperature"),
    (["generate", "{m}", "--prompt", "x", "--top-p", "1.5"], "top_p"),
    (["generate", "{m}", "--prompt", "x", "--max-new-tokens", "0"], "max-new-tokens"),
    (["generate", "/nonexistent/model", "--prompt", "x"], "no such file"),
    (["generate", "{m}"], "--prompt"),
    (["compare", "{m}", "--prompt", "x", "--lane", "warmth=3"], "warmth"),
    (["info", "{m}/params.json"], "not a GGUF"),
    (["tokenize", "/nonexistent", "--text", "x"], "no such file"),
])
def test_user_errors_exit_2_with_one_line(capsys, tiny_meta_dir, argv, needle):
    rc, out, err = run_cli(capsys, *[a.replace("{m}", str(tiny_meta_dir)) for a in argv])
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert "Traceback" not in err


def test_broken_weights_exit_2_in_a_real_process(tmp_path, tiny_meta_dir):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("params.json", "tokenizer.model"):
        (bad / f).write_bytes((tiny_meta_dir / f).read_bytes())
    (bad / "consolidated.00.pth").write_bytes((tiny_meta_dir / "consolidated.00.pth").read_bytes()[:5000])
    p = subprocess.run([sys.executable, "-m", "core", "generate", str(bad), "--prompt", "x"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "consolidated.00.pth" in p.stderr
    assert "Traceback" not in p.stderr


def test_lookup_and_draft_give_plain_greedy_output(capsys, fixtures):
    model = fixtures / "stories260K.gguf"
    base = ["generate", model, "--prompt", "Once upon a time", "--max-new-tokens", "40", "--temperature", "0", "--json"]
    outs = []
    for extra in ([], ["--lookup", "2"], ["--draft", model]):
        rc, out, err = run_cli(capsys, *base, *extra)
        assert rc == 0, err
        outs.append(json.loads(out))
    assert outs[0]["tokens"] == outs[1]["tokens"] == outs[2]["tokens"]
    assert "speculative" not in outs[0]
    assert outs[1]["speculative"]["kind"] == "lookup" and outs[2]["speculative"]["kind"] == "draft"
    assert outs[2]["speculative"]["acceptance"] == 1.0  # the model drafting for itself
    # Compare: --lookup is every lane's default; a lane's own lookup= or draft= replaces it.
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once upon a time", "--max-new-tokens", "20",
                           "--lookup", "3", "--lane", "temperature=0", "--lane", "temperature=0,lookup=1",
                           "--lane", f"temperature=0,draft={model}", "--json")
    assert rc == 0, err
    lanes = json.loads(out)["lanes"]
    assert [ln["settings"]["lookup"] for ln in lanes] == [3, 1, 0]
    assert lanes[2]["settings"]["draft"] == str(model)
    assert [ln["tokens"] for ln in lanes] == [outs[0]["tokens"][:20]] * 3
    assert [ln["stats"]["speculative"]["kind"] for ln in lanes] == ["lookup", "lookup", "draft"]


@pytest.mark.parametrize("argv,needle", [
    (["--lookup", "9"], "lookup must be"),
    (["--lookup", "-1"], "lookup must be"),
    (["--lookup", "x"], "invalid int value"),
    (["--lookup", "2", "--draft", "{model}"], "not both"),
    (["--lookup", "2", "--num-beams", "2"], "beam search"),
    (["--draft", "/nonexistent/draft"], "no such file"),
    (["--draft", "{demo}"], "another vocabulary"),
    (["--draft", ""], "needs a draft model"),
])
def test_bad_speculative_settings_exit_2_with_one_line(capsys, fixtures, argv, needle):
    model = fixtures / "stories260K.gguf"
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    argv = [a.format(model=model, demo=demo) for a in argv]
    rc, out, err = run_cli(capsys, "generate", model, "--prompt", "Hi", "--max-new-tokens", "4", *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err
    rc, out, err = run_cli(capsys, "generate", "--server", "http://127.0.0.1:9", "--prompt", "Hi", "--lookup", "2")
    assert rc == 2 and "need a local model" in err and err.count("\n") == 1


def test_logit_bias_bans_and_favours_text_in_generate_and_compare(capsys, fixtures):
    from core.checkpoints import load
    model = fixtures / "stories260K.gguf"
    tok = load(model, device="cpu", dtype="float32").tokenizer
    girl = tok.encode("girl")
    base = ["--prompt", "Once upon a time", "--max-new-tokens", "16", "--temperature", "0", "--json"]
    rc, out, err = run_cli(capsys, "generate", model, *base)
    plain = json.loads(out)
    assert rc == 0 and set(girl) <= set(plain["tokens"]), err  # ", there was a little girl named Lily"
    rc, out, err = run_cli(capsys, "generate", model, *base, "--logit-bias", "girl=-inf")
    banned = json.loads(out)
    assert rc == 0, err
    assert not set(girl) & set(banned["tokens"]) and banned["text"] != plain["text"]
    # favour: +100 on " Lily" makes its tokens come first
    lily = tok.encode("Lily")
    rc, out, err = run_cli(capsys, "generate", model, *base, "--logit-bias", "Lily=+100")
    assert rc == 0 and json.loads(out)["tokens"][0] in lily, err
    # compare: every lane gets the bias (greedy and sampled), and the lanes still differ only by their settings
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once upon a time", "--max-new-tokens", "16",
                           "--lane", "temperature=0", "--lane", "temperature=1,seed=3", "--logit-bias", "girl=-inf",
                           "--json")
    assert rc == 0, err
    lanes = json.loads(out)["lanes"]
    assert lanes[0]["tokens"] == banned["tokens"]
    assert all(not set(girl) & set(ln["tokens"]) for ln in lanes)
    assert all(ln["settings"]["logit_bias"] == {str(t): "-inf" for t in girl} for ln in lanes)


def test_logit_bias_per_lane_in_compare(capsys, fixtures):
    """A lane's own logit_bias= items bias only that lane (after --logit-bias's), and
    --json carries them as text and as the ids this checkpoint's tokenizer gave."""
    from core.checkpoints import load
    model = fixtures / "stories260K.gguf"
    tok = load(model, device="cpu", dtype="float32").tokenizer
    girl, lily = tok.encode("girl"), tok.encode("Lily")
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once upon a time", "--max-new-tokens", "16",
                           "--lane", "temperature=0", "--lane", "temperature=0,logit_bias=girl=-inf",
                           "--lane", "temperature=0,logit_bias=girl=-inf,logit_bias=Lily=+100", "--json")
    assert rc == 0, err
    plain, banned, both = json.loads(out)["lanes"]
    assert set(girl) <= set(plain["tokens"]) and not set(girl) & set(banned["tokens"])
    assert plain["tokens"][:3] == banned["tokens"][:3] != both["tokens"][:3]  # the ban acts only where 'girl' came
    assert both["tokens"][0] in lily and not set(girl) & set(both["tokens"])
    assert plain["settings"]["logit_bias_text"] == [] and plain["settings"]["logit_bias"] == {}
    assert banned["settings"]["logit_bias_text"] == ["girl=-inf"]
    assert banned["settings"]["logit_bias"] == {str(t): "-inf" for t in girl}
    assert both["settings"]["logit_bias_text"] == ["girl=-inf", "Lily=+100"]
    # --logit-bias comes first in every lane; a lane's own item for the same text wins
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once upon a time", "--max-new-tokens", "8",
                           "--lane", "temperature=0", "--lane", "temperature=0,logit_bias=girl=0",
                           "--logit-bias", "girl=-inf", "--json")
    assert rc == 0, err
    lanes = json.loads(out)["lanes"]
    assert lanes[0]["settings"]["logit_bias"] == {str(t): "-inf" for t in girl}
    assert lanes[1]["settings"]["logit_bias_text"] == ["girl=-inf", "girl=0"]
    assert lanes[1]["settings"]["logit_bias"] == {str(t): 0.0 for t in girl}
    # the text header names a lane's bias
    rc, out, err = run_cli(capsys, "compare", model, "--prompt", "Once", "--max-new-tokens", "2",
                           "--lane", "temperature=0,logit_bias=girl=-inf")
    assert rc == 0 and "logit bias girl=-inf" in out, err


@pytest.mark.parametrize("lane,needle", [
    ("logit_bias=girl", "TEXT=BIAS"), ("logit_bias==5", "TEXT=BIAS"), ("logit_bias=girl=lots", "not a number"),
    ("temperature=0,logit_bias=girl=+500", "between"),
    # a LlamaDesk server takes a bias by text (test_lane_knobs.py); this one is not there
    ("logit_bias=girl=1,server=http://127.0.0.1:9", "cannot connect"),
])
def test_bad_lane_logit_bias_exits_2_with_one_line(capsys, fixtures, lane, needle):
    rc, out, err = run_cli(capsys, "compare", fixtures / "stories260K.gguf", "--prompt", "Hi", "--lane", lane)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("spec,needle", [
    ("girl", "TEXT=BIAS"), ("=5", "TEXT=BIAS"), ("girl=lots", "not a number"), ("girl=+500", "between"),
    ("girl=inf", "between"),
])
def test_bad_logit_bias_exits_2_with_one_line(capsys, fixtures, spec, needle):
    for cmd in (["generate"], ["compare", "--lane", "temperature=0"]):
        rc, out, err = run_cli(capsys, *cmd, fixtures / "stories260K.gguf", "--prompt", "Hi", "--logit-bias", spec)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err
    rc, out, err = run_cli(capsys, "generate", "--server", "http://127.0.0.1:9", "--prompt", "Hi",
                           "--logit-bias", "girl=1")
    assert rc == 2 and "--logit-bias needs a local model" in err and len(err.strip().splitlines()) == 1
