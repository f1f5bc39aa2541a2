"""The Batch of one decode loop on its own: compaction moves surviving lanes down (their
cache rows and whatever follows a row), and what the rows hold is remembered for reuse."""
import threading
from unittest import mock

import torch

from core.engine.batch import Batch, Lane, finish
from core.engine.cpu_rows import finite_rows
from core.engine.settings import SamplingParams
from core.model.kv_cache import KVCache


class _Decoder:
    def push(self, tok):
        return f"<{tok}>"

    def flush(self):
        return ""


def lanes_batch(n: int) -> tuple[Batch, KVCache]:
    cache = KVCache(n_layers=1, n_kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu", batch=n, capacity=8)
    batch = Batch(cache, piece=str, sample_limit=None, max_context=8)
    for i in range(n):
        batch.add(Lane(i, SamplingParams(temperature=0), torch.Generator(), _Decoder(), [1, 2]), 2)
        cache.tokens[i] = [1, 2]
        cache.k[0][i] = float(i)  # each row's keys say which lane wrote them
    batch.start(range(n), torch.zeros(5))
    return batch, cache


def test_compact_moves_the_surviving_lanes_to_the_lowest_rows():
    batch, cache = lanes_batch(3)
    batch.lanes[1].done = finish(batch.lanes[1], "length")
    moves = []
    assert batch.compact(lambda old, new: moves.append((old, new)))
    assert batch.rows == [0, 2] and moves == [(2, 1)]
    assert float(cache.k[0][1, 0, 0, 0]) == 2.0  # lane 2's keys now in row 1
    for li in (0, 2):
        batch.lanes[li].done = finish(batch.lanes[li], "eos")
    assert not batch.compact() and batch.rows == []
    assert cache.tokens == [[1, 2], [1, 2], []]  # what the rows hold, for the next request


def test_settle_ends_a_lane_at_the_context_or_on_cancel_with_its_stats():
    batch, _ = lanes_batch(2)
    batch.positions[0] = 8
    done = batch.settle(0)
    assert done.stop_reason == "context" and done.stats is batch.stats[0]
    batch.lanes[1].cancel = ev = threading.Event()
    assert batch.settle(1) is None
    ev.set()
    assert batch.settle(1).stop_reason == "cancelled"


def test_rows_with_nan_or_inf_are_flagged_and_zeroed_healthy_rows_untouched():
    """Batch.choose's check (core.engine.cpu_rows.finite_rows): a row is finite when every
    entry is; non-finite entries become 0 (the sampler never sees them), on the numpy
    path (CPU float32) and torch's (float64) alike."""
    g = torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(5, 64, generator=g, dtype=dtype)
        x[1, 3], x[2, 0], x[3, 63] = float("nan"), float("inf"), float("-inf")
        want_flags, want = torch.isfinite(x).all(-1), torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        got = x.clone()
        assert finite_rows(got).tolist() == want_flags.tolist() == [True, False, False, False, True]
        assert torch.equal(got, want)
    healthy = torch.randn(3, 64, generator=g)
    with mock.patch.object(torch, "nan_to_num_", side_effect=AssertionError("zeroed a healthy batch")):
        before = healthy.clone()
        assert finite_rows(healthy).all() and torch.equal(healthy, before)
