"""`python -m core pull` and `python -m core models` against the local fake Hub."""
from __future__ import annotations

import hashlib
import json
import socket

import pytest

from core.cli.main import main
from core.library.hub import HubClient
from tests.hubserver import GATED_REPO, GGUF_REPO, HF_REPO


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_pull_by_quant_then_list(capsys, data, hub_server):
    rc, out, err = run(capsys, "pull", GGUF_REPO, "--quant", "q8_0", "--endpoint", hub_server.url)
    assert rc == 0, err
    path = data / "models" / "llamadesk-test" / "stories260K-GGUF" / "tiny-Q8_0.gguf"
    assert out.strip() == str(path)
    spec = hub_server.repos[GGUF_REPO].files["tiny-Q8_0.gguf"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec.sha256
    assert "100%" in err and GGUF_REPO in err  # progress went to stderr
    rc, out, err = run(capsys, "models", "--json")
    assert rc == 0, err
    [entry] = json.loads(out)
    assert (entry["path"], entry["quant"], entry["source"], entry["format"]) == (str(path), "Q8_0", GGUF_REPO, "gguf")
    rc, out, _ = run(capsys, "models")
    header, row = out.strip().splitlines()
    assert header.split()[:3] == ["NAME", "FAMILY", "PARAMS"] and row.split()[0] == "tiny-Q8_0"


def test_pull_by_file_json_and_the_recommendation(capsys, data, hub_server):

    rc, out, err = run(capsys, "pull", GGUF_REPO, "--file", "stories260K.gguf", "--endpoint", hub_server.url, "--json")
    assert rc == 0, err
    obj = json.loads(out)
    assert obj["bytes"] == hub_server.repos[GGUF_REPO].files["stories260K.gguf"].size and obj["seconds"] > 0
    rc, out, err = run(capsys, "pull", GGUF_REPO, "--endpoint", hub_server.url)
    assert rc == 0, err
    client = HubClient(hub_server.url)
    want = client.recommend(client.repo_files(GGUF_REPO), context_length=4096, free_ram=1 << 40)
    assert out.strip().endswith("/" + want.path) and "recommended" in err


def test_pull_a_safetensors_folder(capsys, data, hub_server):
    rc, out, err = run(capsys, "pull", HF_REPO, "--endpoint", hub_server.url)
    assert rc == 0, err
    assert out.strip() == str(data / "models" / "llamadesk-test" / "tiny-llama-hf")
    rc, out, _ = run(capsys, "models", "--json")
    assert [e["format"] for e in json.loads(out)] == ["hf"]


def test_gated_pull_with_a_token(capsys, data, hub_server):
    rc, out, err = run(capsys, "pull", GATED_REPO, "--endpoint", hub_server.url)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and "gated" in err and "HF_TOKEN" in err
    rc, out, err = run(capsys, "pull", GATED_REPO, "--endpoint", hub_server.url, "--token", hub_server.token)
    assert rc == 0, err
    assert out.strip().endswith("stories260K-gated.gguf")


@pytest.mark.parametrize("argv, words", [
    (["pull", "noslash"], "not a repository name"),
    (["pull", GGUF_REPO, "--quant", "Q9_X"], "has no Q9_X file"),
    (["pull", GGUF_REPO, "--file", "nope.gguf"], "no loadable file"),
    (["pull", GGUF_REPO, "--file", "a", "--quant", "b"], "not allowed with"),
    (["pull", "llamadesk-test/gone"], "does not exist"),
    (["pull", GGUF_REPO, "--context", "0"], "--context"),
    (["models", "--folder", "/no/such/folder"], "no such folder"),
    (["pull", GGUF_REPO, "--endpoint", "ftp://x"], "not a Hub address"),
])
def test_bad_input_exits_2_with_one_line(capsys, data, hub_server, argv, words):
    if argv[0] == "pull" and "--endpoint" not in argv:
        argv = argv + ["--endpoint", hub_server.url]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err


def test_no_network_exits_2(capsys, data):

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out, err = run(capsys, "pull", GGUF_REPO, "--endpoint", f"http://127.0.0.1:{port}")
    assert rc == 2 and err.count("\n") == 1 and "cannot reach" in err, err
