"""The decode-step profile: its parts add up to the step and name the layers that ran."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import bench_decode_profile as prof
from core.checkpoints import load
from core.engine.engine import Engine

DEMO = Path(__file__).resolve().parents[2] / "assets" / "models" / "llamadesk-demo"


@pytest.fixture(scope="module")
def engine():
    lm = load(DEMO, device="cpu", dtype="int4")
    return Engine(lm.model, lm.tokenizer, stop_ids=())


def test_a_two_row_step_is_split_into_its_packed_layers_attention_and_the_rest(engine):
    r = prof.profile(engine, rows=2, steps=2, threads=1)
    parts = r["parts"]
    assert prof.REST in parts and prof.ATTENTION in parts
    assert any(k.startswith("gate int4 ") for k in parts), sorted(parts)
    assert sum(parts.values()) == pytest.approx(r["step_s"])
    assert all(v >= 0 for k, v in parts.items() if k != prof.REST)
    args = engine.model.args
    # every layer's q projection is counted: packed bytes of n_layers [dim, dim] int4 weights
    q = next(k for k in r["bytes"] if k.startswith("q int4 "))
    assert r["kernel_weights"][q] == args.n_layers * args.dim * args.n_heads * args.head_dim
    assert r["bytes"][q] >= r["kernel_weights"][q] // 2
    md = prof.table(r, bandwidth=10.0)
    assert md.splitlines()[-1].startswith("| **step, 2 row(s)**")
    # the hooks are gone and the model is back to its default
    assert engine.model.invariant
    assert not any(m._forward_hooks for m in engine.model.modules())
    assert torch.nn.functional.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"
    assert prof.kernel_ops.attn_decode.__name__ == "attn_decode"


def test_f16_layers_count_their_float16_bytes():
    """A Float16Linear has no ``weight`` (its float16 matrix is ``weight16``): it raised."""
    from core.model.f16 import Float16Linear
    m = Float16Linear(torch.zeros(24, 2 * 4096, dtype=torch.float16))  # also when kept in column blocks
    assert prof.layer_bytes(m) == 2 * 24 * 8192
    assert prof.shape_of(m) == (24, 8192)
