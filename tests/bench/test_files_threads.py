"""bench_files' LlamaDesk child runs at the thread count the bench asked for."""
from __future__ import annotations

import torch

from bench import bench_files


def test_the_child_takes_llamadesk_threads(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("LLAMADESK_THREADS", "1")
        assert bench_files.apply_threads() == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("LLAMADESK_THREADS", "x")  # not a count: left as it was
        assert bench_files.apply_threads() == 1
    finally:
        torch.set_num_threads(before)
