"""Shared by the comparison window's tests: the prompt and lanes they run, fixtures for a
history, the real bridge and the stories260K fixture model, and a few helpers.

Scenarios run as coroutines on a qasync loop (``run(loop, coro)``) and wait with asyncio
sleeps, never a nested Qt event loop inside a coroutine.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

from core.checkpoints import load
from core.engine.events import Done, Prefilled, Stats, Token
from core.engine.settings import SamplingParams
from core.history.store import History
from core.worker.protocol import Prompted
from gui.bridge import Bridge, Chunk
from tests.gui.ui_helpers import run, until

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "artifacts"

LANES = [
    {"temperature": 0.0, "max_new_tokens": 48},  # greedy baseline
    {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 7, "max_new_tokens": 48},
    {"temperature": 1.3, "top_p": 0.95, "repetition_penalty": 1.15, "seed": 11, "max_new_tokens": 48},
]
PROMPT = "Once upon a time"


@pytest.fixture
def history(tmp_path):
    h = History(tmp_path / "history.sqlite3")
    yield h
    h.close()


@pytest.fixture
def bridge(loop):
    b = Bridge(torch_threads=1)
    yield b
    loop.run_until_complete(b.shutdown())
    b.deleteLater()


@pytest.fixture(scope="module")
def story(fixtures):
    """The fixture model loaded directly, for the tokenizer and reference logits."""
    return load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")


class FakeBridge:
    """Enough bridge for layout tests that never run."""

    def compare(self, request):  # pragma: no cover - not reached
        raise AssertionError("no runs in this test")

    def cancel(self):
        pass


def load_and_run(loop, bridge, fixtures, view, timeout: float = 60) -> None:
    """Load the fixture model, then run every lane of ``view`` until all have finished."""
    async def scenario():
        await bridge.load(str(fixtures / "stories260K.gguf"), device="cpu", dtype="float32")
        view.run()
        await until(lambda: not view.running, timeout, "the comparison to finish")
    run(loop, scenario(), timeout + 30)


def snapshot(widget, name: str, *, in_coroutine: bool = False) -> Path:
    """Save a PNG under artifacts/. Inside a coroutine no events are processed: a nested
    processEvents() there can re-enter another task's step, which asyncio refuses, and
    that task then never wakes again."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    if not in_coroutine:
        QApplication.processEvents()
    widget.grab().save(str(path))
    return path


def token_text_of(tok):
    return lambda i: tok.token_bytes(i).decode("utf-8", errors="replace")


async def three_words(request, stream):
    """Each lane streams three words (" a b c", lane 1 differs at the second) in one Chunk."""
    yield Prompted(1, 0, 256)
    yield Prefilled(5, 0, 0.0)
    for lane, p in enumerate(request.lanes):
        seed = p.seed if p.seed is not None else 1000 + lane
        words = [" a", " b", " c"] if lane == 0 else [" a", " x", " c"]
        toks = [Token(lane, i, 10 + i + (lane and i == 1) * 50, w, w, -0.5, None) for i, w in enumerate(words)]
        yield Chunk(lane, "".join(words), toks)
        await asyncio.sleep(0)
        yield Done(lane, "length", [t.token_id for t in toks], "".join(words).strip(), [-0.5] * 3,
                   SamplingParams.from_dict({**p.to_dict(), "seed": seed}), Stats(generated_tokens=3, decode_s=0.2))
