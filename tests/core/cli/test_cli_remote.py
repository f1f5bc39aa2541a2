"""``generate``/``compare --server`` against a real ``python -m core serve`` process.

The served model is the same file the local runs load, so a greedy or seeded remote
reply must equal the local one token for token.
"""
import json

import pytest

from core.cli.main import main
from tests.helpers import ROOT, ServeProcess, free_port

DEMO = str(ROOT / "assets" / "models" / "llamadesk-demo")
KEY = "cli-test-key"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(fixtures):
    """``python -m core serve`` on an ephemeral loopback port; yields its URL, then stops it."""
    with ServeProcess(fixtures / "stories260K.gguf", key=KEY, extra=("--max-batch", "8")) as s:
        assert s.url.startswith("http://127.0.0.1:"), s.url
        yield s.url


def run_json(capsys, argv):
    capsys.readouterr()
    assert main(argv + ([] if "--json" in argv else ["--json"])) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_generate_on_a_server_prints_the_same_json_as_local(capsys, server, fixtures):
    model = str(fixtures / "stories260K.gguf")
    args = ["--prompt", "Once upon a time", "--max-new-tokens", "16", "--temperature", "0.9", "--top-k", "20",
            "--seed", "11", "--stop", "park", "--json"]
    local = run_json(capsys, ["generate", model, *args])
    remote = run_json(capsys, ["generate", "--server", server, "--api-key", KEY, "--model", "stories260K", *args])
    assert set(local) <= set(remote) and remote["server"] == server and remote["model"] == "stories260K"
    for key in ("text", "tokens", "prompt_tokens", "stop_reason", "seed"):
        assert remote[key] == local[key], key
    assert remote["logprobs"] == pytest.approx(local["logprobs"], abs=1e-4)
    assert len(remote["tokens"]) > 0 and remote["timings"]["decode_tok_s"] > 0


def test_streamed_text_on_a_server_equals_local(capsys, server, fixtures):
    args = ["--prompt", "Once upon a time", "--max-new-tokens", "12", "--temperature", "0"]
    assert main(["generate", str(fixtures / "stories260K.gguf"), *args]) == 0
    local = capsys.readouterr().out
    assert main(["generate", "--server", server, "--api-key", KEY, *args]) == 0
    assert capsys.readouterr().out == local and local.startswith(", there was a little girl named Lily.")


def test_compare_with_one_local_and_one_remote_lane(capsys, server, fixtures):
    model = str(fixtures / "stories260K.gguf")
    out = run_json(capsys, ["compare", model, "--prompt", "Once upon a time", "--max-new-tokens", "12", "--api-key", KEY,
                            "--lane", "temperature=1.0,seed=5",
                            "--lane", f"server={server},temperature=1.0,seed=5",
                            "--lane", f"server={server},temperature=0"])
    local, remote, greedy = out["lanes"]
    assert local["server"] is None and remote["server"] == server and local["model"] == remote["model"] == "stories260K"
    assert remote["text"] == local["text"] and remote["tokens"] == local["tokens"]
    assert remote["logprobs"] == pytest.approx(local["logprobs"], abs=1e-4)
    assert greedy["text"].startswith(", there was a little girl named Lily.")
    assert out["tokenizers_match"] is True and out["prompt_tokens"] == [1, 403, 407, 261, 378]


def test_compare_across_models_says_their_tokenizers_differ(capsys, server):
    out = run_json(capsys, ["compare", DEMO, "--prompt", "Tell me a story.", "--chat", "--max-new-tokens", "8",
                            "--api-key", KEY, "--lane", "temperature=0", "--lane", f"server={server},temperature=0"])
    assert [l["model"] for l in out["lanes"]] == ["llamadesk-demo", "stories260K"]
    assert out["tokenizers_match"] is False
    assert all(l["stats"]["generated_tokens"] == len(l["tokens"]) for l in out["lanes"])


def test_compare_on_a_server_equals_local_lanes(capsys, server, fixtures):
    lanes = ["--lane", "temperature=0.8,top_p=0.9,seed=1", "--lane", "temperature=1.2,min_p=0.05,seed=2"]
    args = ["--prompt", "Once upon a time", "--max-new-tokens", "10", *lanes]
    local = run_json(capsys, ["compare", str(fixtures / "stories260K.gguf"), *args])
    remote = run_json(capsys, ["compare", "--server", server, "--api-key", KEY, *args])
    assert [l["text"] for l in remote["lanes"]] == [l["text"] for l in local["lanes"]]
    assert [l["settings"] for l in remote["lanes"]] == [l["settings"] for l in local["lanes"]]


def test_remote_errors_exit_2_with_one_line(capsys, server):
    assert main(["generate", "--server", server, "--api-key", "wrong", "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "401" in err and "API key" in err and "\n" not in err
    assert main(["generate", "--server", server, "--api-key", KEY, "--prompt", "Hi", "--top-p", "2"]) == 2
    assert "top_p" in capsys.readouterr().err  # refused locally, before any request
    assert main(["generate", "--server", server, "--api-key", KEY, "--model", "nope", "--prompt", "Hi"]) == 2
    assert "no model 'nope'" in capsys.readouterr().err
    assert main(["generate", "--server", server, "--api-key", KEY, "--prompt", "Hi", "--num-beams", "2"]) == 2
    assert "--num-beams needs a local model" in capsys.readouterr().err


def test_unreachable_server_exits_2(capsys):
    assert main(["generate", "--server", f"http://127.0.0.1:{free_port()}", "--prompt", "Hi"]) == 2
    assert "cannot connect" in capsys.readouterr().err


def test_serve_refuses_another_address_without_a_key(capsys, monkeypatch, fixtures):
    monkeypatch.delenv("LLAMADESK_API_KEY", raising=False)
    assert main(["serve", str(fixtures / "stories260K.gguf"), "--host", "0.0.0.0"]) == 2
    assert "needs --api-key" in capsys.readouterr().err


def test_a_grounded_question_on_a_server_keeps_its_documents_in_json(capsys, server, tmp_path):
    """--attach grounds the prompt before it goes to the server; --json says how, as locally."""
    notes = tmp_path / "notes.md"
    notes.write_text("# Lily\n\nLily had a red ball in the park.\n")
    out = run_json(capsys, ["generate", "--server", server, "--api-key", KEY, "--model", "stories260K",
                            "--prompt", "What did Lily have?", "--attach", str(notes), "--max-new-tokens", "4"])
    assert out["server"] == server and out["model"] == "stories260K"
    assert out["documents"]["sources"][0]["source"].endswith("notes.md"), out.get("documents")
