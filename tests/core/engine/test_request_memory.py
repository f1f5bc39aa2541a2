"""A request whose KV cache cannot fit is refused up front, with the figure, wherever it
comes from: the CLI, the engine (serve), beams (issue 22, item 25)."""
from __future__ import annotations

import json
import shutil

import pytest

from core import limits
from core.checkpoints import load
from core.cli.main import main
from core.engine.engine import Engine
from core.engine.settings import SamplingParams
from core.errors import ResourceError
from tests.helpers import ROOT

DEMO = ROOT / "assets" / "models" / "llamadesk-demo"
HUGE = 10 ** 7
FREE = 1 << 30  # what the machine is said to have free in these tests


def huge_context_copy(folder):
    """The demo model with params.json claiming a context of 10^7 tokens."""
    folder.mkdir()
    for name in ("consolidated.00.pth", "tokenizer.model"):
        shutil.copy(DEMO / name, folder / name)
    params = json.loads((DEMO / "params.json").read_text())
    (folder / "params.json").write_text(json.dumps({**params, "max_seq_len": HUGE}))
    return folder, params


def cache_bytes(params, tokens, rows=1):
    """K and V, float32, every layer: the reference count of what a request holds."""
    return 2 * params["n_layers"] * params["n_kv_heads"] * params["head_dim"] * 4 * tokens * rows


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    return huge_context_copy(tmp_path_factory.mktemp("huge") / "demo-10M")


@pytest.fixture(scope="module")
def engine(huge):
    lm = load(huge[0], device="cpu", dtype="float32")
    return Engine(lm.model, lm.tokenizer, stop_ids=lm.stop_ids), lm


def test_cli_generate_refuses_a_request_the_memory_cannot_hold(huge, capsys, monkeypatch):
    folder, params = huge
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: FREE)
    # --stop " " ends the reply at its first word: before the check it ran, and exited 0
    rc = main(["generate", str(folder), "--prompt", "Once", "--max-new-tokens", str(HUGE), "--stop", " ",
               "--device", "cpu", "--dtype", "float32"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    prompt = len(load(folder, device="cpu").tokenizer.encode("Once", bos=True))
    # the context caps the request: 10^7 positions, not prompt + 10^7
    need = cache_bytes(params, min(prompt + HUGE, HUGE))
    assert err.count("\n") == 1 and err.startswith("error: a request of 10000000 tokens")
    assert f"needs {limits.human(need)} of memory" in err and f"only {limits.human(FREE)}" in err


def test_the_engine_refuses_before_any_event_and_runs_what_fits(engine, monkeypatch):
    eng, lm = engine
    monkeypatch.setattr(limits, "available_bytes", lambda device=None: FREE)
    prompt = lm.tokenizer.encode("Once", bos=True)
    params = json.loads((DEMO / "params.json").read_text())
    for lanes in ([SamplingParams(max_new_tokens=HUGE)],
                  [SamplingParams(max_new_tokens=200_000, seed=i) for i in range(3)]):
        with pytest.raises(ResourceError) as err:
            eng.check_request(prompt, lanes)
        rows = len(lanes)
        assert err.value.needed == cache_bytes(params, min(len(prompt) + lanes[0].max_new_tokens, HUGE), rows)
        assert err.value.available == FREE
        with pytest.raises(ResourceError):  # generate refuses as it is called, before any event
            eng.generate_lanes(prompt, lanes)
    with pytest.raises(ResourceError, match="x 4 rows"):  # beams hold a row each
        eng.generate(prompt, SamplingParams(max_new_tokens=200_000, num_beams=4, temperature=0))
    # A request that fits runs: 8 new tokens need a few KiB.
    events = list(eng.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0)))
    assert events[-1].stop_reason == "length" and len(events[-1].tokens) == 8
