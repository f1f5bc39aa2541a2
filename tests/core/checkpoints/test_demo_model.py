"""The bundled demo model (assets/models/llamadesk-demo) works through the app's own code path."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.checkpoints import detect, load
from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.settings import SamplingParams

DEMO = Path(__file__).resolve().parents[3] / "assets" / "models" / "llamadesk-demo"


@pytest.fixture(scope="module")
def demo():
    torch.set_num_threads(1)
    return load(DEMO, device="cpu", dtype="float32")


def reply(lm, text: str, params: SamplingParams) -> Done:
    prompt = lm.chat_format.encode_dialog([{"role": "user", "content": text}])
    engine = Engine(lm.model, lm.tokenizer, stop_ids=sorted(lm.stop_ids))
    return [ev for ev in engine.generate(prompt, params) if isinstance(ev, Done)][0]


def test_folder_is_a_small_meta_checkpoint_with_a_model_card():
    assert detect(DEMO) == "meta"
    names = {p.name for p in DEMO.iterdir()}
    assert names >= {"params.json", "consolidated.00.pth", "tokenizer.model", "README.md"}
    assert sum(p.stat().st_size for p in DEMO.iterdir()) <= 30 * 1024 * 1024
    assert json.loads((DEMO / "params.json").read_text())["dim"] > 0


def test_loads_with_llama3_chat_format(demo):
    assert demo.chat_format.name == "llama3"
    assert demo.model.num_parameters() < 5_000_000
    eot = demo.tokenizer.special_id("<|eot_id|>")
    assert eot in demo.stop_ids
    # A user cannot type the end-of-turn marker: it is a control symbol.
    assert eot not in demo.tokenizer.encode("<|eot_id|><|start_header_id|>assistant")


# Both topics are in the held-out split: no story about them was in the training data.
def test_greedy_reply_ends_its_turn_and_stays_on_topic(demo):
    d = reply(demo, "Tell me a story about a dog named Rosie.", SamplingParams(temperature=0.0, max_new_tokens=400))
    assert d.stop_reason == "eos"
    assert d.stop_token == demo.tokenizer.special_id("<|eot_id|>")
    assert "Rosie" in d.text and "dog" in d.text and len(d.text) >= 200


def test_seeded_reply_ends_its_turn_and_stays_on_topic(demo):
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_new_tokens=400)
    d = reply(demo, "Write a short story about a red train.", params)
    assert d.stop_reason == "eos"
    assert "train" in d.text.lower()
    # Same seed, same reply; another temperature, another reply.
    assert reply(demo, "Write a short story about a red train.", params).text == d.text
    hot = reply(demo, "Write a short story about a red train.",
                SamplingParams(temperature=1.2, top_p=1.0, seed=1, max_new_tokens=400))
    assert hot.text != d.text


def test_model_card_states_what_eval_json_measured():
    card = (DEMO / "README.md").read_text(encoding="utf-8")
    ev = json.loads((DEMO / "eval.json").read_text())
    rows, n = ev["replies"], ev["summary"]["prompts"]
    assert n == len(rows) and n > 0
    counts = {
        "at least 200 characters": sum(r["chars"] >= 200 for r in rows),
        "ended with `<|eot_id|>`": sum(r["stop_reason"] == "eos" for r in rows),
        "mentions the requested name or object": sum(r["on_topic"] for r in rows),
        "at least 90% dictionary words": sum(r["english"] >= 0.9 for r in rows),
    }
    for check, k in counts.items():
        line = next(line for line in card.splitlines() if line.startswith(f"| {check}"))
        assert f"| {k} / {n} " in line, (check, line)
    prose = " ".join(card.split())
    assert f"{n} held-out topics" in prose
    assert f"held-out loss is {ev['summary']['heldout_loss']:.3f}" in prose
