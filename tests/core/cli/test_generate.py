"""`python -m core generate`: the JSON contract, streaming, chat, speculative decoding, logit bias."""
import json

import pytest

from core.checkpoints import load
from core.tokenizer import load_tokenizer
from tests.core.cli.helpers import run_cli
from tests.generated import hello_world_ids
from tests.helpers import ROOT


def test_generate_json_fields(capsys, tiny_meta_dir):
    rc, out, err = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "Hello world", "--max-new-tokens", "6",
                           "--temperature", "0", "--json", "--device", "cpu")
    assert rc == 0, err
    obj = json.loads(out.strip().splitlines()[-1])
    assert obj["prompt_tokens"] == [1, *hello_world_ids(tiny_meta_dir)]
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


def test_beam_search_json_lists_every_beam_best_first(capsys, tiny_meta_dir):
    rc, out, err = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "Hello world", "--max-new-tokens", "5",
                           "--num-beams", "3", "--json", "--device", "cpu")
    assert rc == 0, err
    obj = json.loads(out)
    beams = obj["beams"]
    assert len(beams) == 3 and len({tuple(b["tokens"]) for b in beams}) == 3
    assert (beams[0]["text"], beams[0]["tokens"], beams[0]["logprobs"]) == (obj["text"], obj["tokens"], obj["logprobs"])
    assert [b["score"] for b in beams] == sorted((b["score"] for b in beams), reverse=True)
    tok = load_tokenizer(tiny_meta_dir / "tokenizer.model")
    assert all(b["text"] == tok.decode(obj["prompt_tokens"] + b["tokens"])[len("Hello world"):] for b in beams)


def test_empty_prompt_is_bos_alone(capsys, tiny_meta_dir):
    rc, out, _ = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "", "--max-new-tokens", "2", "--json")
    assert rc == 0 and json.loads(out)["prompt_tokens"] == [1]


def test_chat_uses_the_format(capsys, tiny_meta_dir):
    rc, out, _ = run_cli(capsys, "generate", tiny_meta_dir, "--prompt", "Hi", "--chat", "--chat-format", "llama2",
                         "--system", "Be brief.", "--max-new-tokens", "2", "--json")
    assert rc == 0
    ids = json.loads(out)["prompt_tokens"]
    tok = load_tokenizer(tiny_meta_dir / "tokenizer.model")
    assert ids == tok.encode("[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]", bos=True)


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
