"""The demo-model training tool: its data rules, and a seconds-long run of every stage."""
from __future__ import annotations

import json

import pytest
import torch

from tools import demo_data as dd
from tools import train_demo as td


def test_heldout_split_is_by_topic_and_stable():
    rng = __import__("random").Random(0)
    keys = {dd.topic_key(dd.draw_topic(rng)["slots"]) for _ in range(2000)}
    held = {k for k in keys if dd.is_heldout(k, 5.0)}
    # Roughly the asked share, decided by the topic alone (same answer every time).
    assert 0.02 < len(held) / len(keys) < 0.09
    assert held == {k for k in keys if dd.is_heldout(k, 5.0)}


def test_topics_requests_and_openings_name_the_topic():
    rng = __import__("random").Random(1)
    for _ in range(200):
        t = dd.draw_topic(rng)
        for w in dd.topic_words(t["slots"]):
            assert w in t["opening"] and w in t["request"]


def test_story_filter():
    cfg = td.Config()
    slots = {"type": "character", "kind": "dog", "name": "Max"}
    story = "Max ran to the park. " * 12
    assert dd.keep_story(cfg, slots, story, "eos")
    assert not dd.keep_story(cfg, slots, story, "length")  # unfinished: never taught
    assert not dd.keep_story(cfg, slots, "Tom ran to the park. " * 12, "eos")  # off topic
    assert not dd.keep_story(cfg, slots, "Max ran.", "eos")  # too short


def test_batch_masks_everything_but_the_reply():
    items = [([1, 5, 6, 7, 8, 9], 3), ([1, 5, 6, 7], 2)]
    x, y, n = dd.make_batch(items)
    assert x.tolist() == [[1, 5, 6, 7, 8], [1, 5, 6, 0, 0]]
    # Position p predicts ids[p+1]; only the reply's ids (from `start`) are targets.
    assert y.tolist() == [[-100, -100, 7, 8, 9], [-100, 6, 7, -100, -100]]
    assert n == 8


def test_lr_schedule_warms_up_then_decays_to_min():
    cfg = td.Config(lr=1e-3, min_lr=1e-4, warmup=10)
    assert td.lr_at(cfg, 0, 0.0) == pytest.approx(1e-4)
    assert td.lr_at(cfg, 10, 0.0) == pytest.approx(1e-3)
    assert td.lr_at(cfg, 500, 0.5) == pytest.approx(5.5e-4)
    assert td.lr_at(cfg, 999, 1.0) == pytest.approx(1e-4)


def test_tiny_run_end_to_end(tmp_path):
    from core.checkpoints import load
    from core.engine.engine import Engine
    from core.engine.events import Done
    from core.engine.settings import SamplingParams

    work, out = tmp_path / "work", tmp_path / "model"
    threads = torch.get_num_threads()
    assert td.main(["all", "--tiny", "--work", str(work), "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads
    assert {p.name for p in out.iterdir()} >= {"params.json", "consolidated.00.pth", "tokenizer.model"}
    assert (work / "ckpt.pt").exists() and (work / "eval.json").exists()
    assert "heldout_loss" in json.loads((work / "eval.json").read_text())["summary"]

    lm = load(out, device="cpu", dtype="float32")
    assert lm.chat_format.name == "llama3"
    tok = lm.tokenizer
    # The chat markers are control symbols: the chat format inserts them, text never does.
    eot = tok.special_id("<|eot_id|>")
    assert eot is not None and eot in lm.stop_ids
    assert eot not in tok.encode("user typed <|eot_id|> here")
    assert tok.bos_id == 1 and tok.eos_id == 2
    prompt = lm.chat_format.encode_dialog([{"role": "user", "content": "Tell me a story about a dog."}])
    events = list(Engine(lm.model, tok, stop_ids=sorted(lm.stop_ids)).generate(
        prompt, SamplingParams(temperature=0.0, max_new_tokens=8)))
    assert isinstance(events[-1], Done) and events[-1].stop_reason in ("eos", "length")

    # Resuming a finished run trains no further and keeps the weights.
    before = torch.load(work / "ckpt.pt", weights_only=False)["step"]
    assert td.main(["train", "--tiny", "--work", str(work), "--resume"]) == 0
    assert torch.load(work / "ckpt.pt", weights_only=False)["step"] == before
