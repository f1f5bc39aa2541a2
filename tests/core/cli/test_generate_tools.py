"""generate --tools FILE.json: the reply's calls in --json, held to their schemas; bad tool
input is exit 2 with one line. The demo model, its context widened to hold the Llama 3.1
tool prompt (a copy of its params.json; the weights are linked)."""
import json
import shutil

import jsonschema
import pytest

from tests.core.cli.helpers import run_cli
from tests.helpers import ROOT

DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "required": ["city"], "properties": {"city": {"type": "string", "maxLength": 8}}}}}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    d = tmp_path_factory.mktemp("wide_demo")
    for f in DEMO.iterdir():
        if f.name != "params.json":
            (d / f.name).symlink_to(f)
    params = json.loads((DEMO / "params.json").read_text())
    (d / "params.json").write_text(json.dumps({**params, "max_seq_len": 2048}))
    tools = d / "tools.json"
    tools.write_text(json.dumps({"tools": [WEATHER]}))
    return d, tools


def test_json_output_lists_the_calls(capsys, wide):
    model, tools = wide
    rc, out, err = run_cli(capsys, "generate", model, "--chat", "--prompt", "Weather in Rome?", "--tools", tools,
                           "--tool-choice", "required", "--max-new-tokens", "60", "--seed", "1", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["stop_reason"] == "tool_calls"
    [call] = r["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_") and "error" not in call
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])


@pytest.mark.parametrize("argv, words", [
    (["--prompt", "x", "--tools", "TOOLS"], "--tools needs --chat"),
    (["--chat", "--prompt", "x", "--tools", "TOOLS", "--tool-choice", "nope"], "not a declared tool"),
    (["--chat", "--prompt", "x", "--tool-choice", "required"], "needs --tools"),
    (["--chat", "--prompt", "x", "--tools", "BAD"], "tools must be a list"),
    (["--chat", "--prompt", "x", "--tools", "MISSING"], "MISSING"),
])
def test_bad_tool_input_is_exit_2_and_one_line(capsys, wide, tmp_path, argv, words):
    model, tools = wide
    bad = tmp_path / "bad.json"
    bad.write_text('{"tools": 5}')
    argv = [{"TOOLS": str(tools), "BAD": str(bad), "MISSING": str(tmp_path / "MISSING.json")}.get(a, a) for a in argv]
    rc, out, err = run_cli(capsys, "generate", model, *argv)
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err
