"""The fidelity bench's own Q4_K writer and Q4_K_M mix (gguf has no Q4_K quantizer)."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from bench.bench_fidelity import more_bits, q4_k_blocks, tensor_type


def test_q4_k_blocks_round_trip_through_gguf_within_a_step():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 512)).astype(np.float32) * 0.02
    x[3] += 0.05  # an all-positive row: its minimum clamps to 0
    back = dequantize(q4_k_blocks(x), Q.Q4_K).reshape(x.shape)
    step = (x.reshape(-1, 32).max(1) - np.minimum(x.reshape(-1, 32).min(1), 0)) / 15
    err = np.abs(back - x).reshape(-1, 32).max(1)
    # half a step of rounding, plus the 6-bit scale's and min's own rounding
    assert np.all(err <= 0.75 * step + 1e-6), float((err / step).max())
    assert np.corrcoef(back.ravel(), x.ravel())[0, 1] > 0.99


def test_q4_k_m_mix_gives_half_the_ffn_down_layers_q6_k():
    n = 16
    down = [tensor_type("Q4_K_M", f"blk.{i}.ffn_down.weight", n) for i in range(n)]
    assert down.count("Q6_K") == 8 and [i for i in range(n) if more_bits(i, n)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert tensor_type("Q4_K_M", "token_embd.weight", n) == "Q6_K"
    assert tensor_type("Q4_K_M", "blk.2.attn_q.weight", n) == "Q4_K"
    assert tensor_type("F16", "blk.0.attn_v.weight", n) == "F16"
