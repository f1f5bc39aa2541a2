"""The byte-level CPU packer (core/model/pack_cpu.py) against torch's own int4 packer."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from core.model import pack, pack_cpu
from tests.core.model.test_quant import as_raw, gguf_blocks

CPU = torch.device("cpu")
K = 512


def through_torch(raw, kind, n, k, monkeypatch):
    """The general path: blocks decoded to integers, packed by torch._convert_weight_to_int4pack_for_cpu."""
    with monkeypatch.context() as m:
        m.setattr(pack_cpu, "layout_matches", lambda: False)
        return pack.pack_gguf(raw, kind, n, k, CPU)


def test_the_direct_layout_is_torchs_on_this_cpu():
    assert pack_cpu.layout_matches()  # else the fast path is off and these tests say nothing
    q = torch.randint(0, 16, (192, 96), dtype=torch.int32, generator=torch.Generator().manual_seed(3))
    ref = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    assert torch.equal(pack_cpu.one_plane(q.to(torch.uint8)).view(ref.shape), ref)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("n", [192, 200])  # 200: the last 64-row block is padded
def test_fast_packing_is_bit_for_bit_the_general_path(kind, n, monkeypatch):
    raw = as_raw(gguf_blocks(kind, n=n, k=K, seed=n))
    fast = pack.pack_gguf(raw, kind, n, K, CPU)
    ref = through_torch(raw, kind, n, K, monkeypatch)
    assert fast.packed.shape == ref.packed.shape and fast.planes == ref.planes
    assert torch.equal(fast.scale_zeros, ref.scale_zeros)
    # padding rows hold other nibbles under scale and zero 0: compare the real rows' values
    assert torch.equal(fast.dequantize(), ref.dequantize())
    if n % 64 == 0:
        assert torch.equal(fast.packed, ref.packed)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1))
    assert torch.equal(fast(x), ref(x))


@pytest.mark.parametrize("kind", ["Q4_K", "Q8_0"])
def test_packing_in_small_steps_equals_one_step(kind, monkeypatch):
    raw = as_raw(gguf_blocks(kind, n=200, k=K))
    whole = pack.pack_gguf(raw, kind, 200, K, CPU)
    monkeypatch.setattr(pack_cpu, "STEP_WEIGHTS", 64 * K)  # 64 rows a step, the last one padded
    steps = pack.pack_gguf(raw, kind, 200, K, CPU)
    assert torch.equal(steps.packed, whole.packed) and torch.equal(steps.scale_zeros, whole.scale_zeros)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0"])
def test_a_non_finite_block_scale_is_refused(kind):
    data = gguf_blocks(kind, n=64, k=K).copy()
    at = {"Q4_K": 0, "Q8_0": 0, "Q6_K": 208}[kind]  # where the first block's fp16 d sits
    data[5, at:at + 2] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="NaN or infinite"):
        pack.pack_gguf(as_raw(data), kind, 64, K, CPU)
    with pytest.raises(ValueError, match="bytes"):
        pack.pack_gguf(as_raw(data)[:-K], kind, 64, K, CPU)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_K"])
def test_cpu_packing_never_widens_values_for_torchs_packer(kind, monkeypatch):
    """Every GGUF type's bytes reach the kernel's layout without torch's int32 packer (the
    largest single cost of opening a file before)."""
    pack_cpu.layout_matches()  # the layout probe packs one small matrix through torch, once per process
    monkeypatch.setattr(torch, "_convert_weight_to_int4pack_for_cpu",
                        lambda *a: pytest.fail("packed through torch's int32 packer"))
    layer = pack.pack_gguf(as_raw(gguf_blocks(kind, n=64, k=K)), kind, 64, K, CPU)
    assert layer.packed.shape == (64, layer.planes * K // 2)


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def test_steps_shared_with_a_helper_thread_give_the_same_layer(two_threads, monkeypatch):
    raw = as_raw(gguf_blocks("Q6_K", n=512, k=K))
    monkeypatch.setattr(pack_cpu, "STEP_WEIGHTS", 64 * K)  # 8 steps: 4 here, 4 on the helper
    shared = pack.pack_gguf(raw, "Q6_K", 512, K, CPU)
    assert torch.get_num_threads() == 2  # the caller's torch threads are restored
    torch.set_num_threads(1)  # every step on the calling thread
    alone = pack.pack_gguf(raw, "Q6_K", 512, K, CPU)
    assert torch.equal(shared.packed, alone.packed) and torch.equal(shared.scale_zeros, alone.scale_zeros)


def test_a_helper_threads_error_reaches_the_caller(two_threads, monkeypatch):
    data = gguf_blocks("Q8_0", n=256, k=K).copy()
    data[64 + 5, 0:2] = np.array([np.nan], np.float16).view(np.uint8)  # in step 1: the helper's
    monkeypatch.setattr(pack_cpu, "STEP_WEIGHTS", 64 * K)
    with pytest.raises(ValueError, match="NaN or infinite"):
        pack.pack_gguf(as_raw(data), "Q8_0", 256, K, CPU)
    assert torch.get_num_threads() == 2


_OTHER_CAPABILITY = """
import sys, torch
from core.model import pack, pack_cpu, quant
assert quant.cpu_layout().name == sys.argv[1] and pack_cpu.layout_matches(), quant.cpu_layout()
CPU, K, g = torch.device("cpu"), 256, torch.Generator().manual_seed(0)
direct = pack_cpu.layout_matches
q = torch.randint(0, 16, (192, 96), dtype=torch.int32, generator=g)
assert torch.equal(pack_cpu.one_plane(q.to(torch.uint8)).view(192, 48),
                   torch._convert_weight_to_int4pack_for_cpu(q, 1))
for kind, at, scales in (("Q4_K", 0, 2), ("Q6_K", 208, 1), ("Q8_0", 0, 1)):
    block, size, _ = pack_cpu.KINDS[kind]
    for n in (128, 72):  # 72: the last 64-row block is padded
        b = torch.randint(0, 256, (n, K // block, size), dtype=torch.uint8, generator=g)
        d = torch.empty(n, K // block, scales).uniform_(1e-4, 3e-2, generator=g).half()
        b[..., at:at + 2 * scales] = d.view(torch.uint8)
        fast = pack.pack_gguf(b.view(-1), kind, n, K, CPU)
        pack_cpu.layout_matches = lambda: False  # the reference: torch's own packer
        ref = pack.pack_gguf(b.view(-1), kind, n, K, CPU)
        pack_cpu.layout_matches = direct
        assert torch.equal(fast.scale_zeros, ref.scale_zeros), kind
        assert torch.equal(fast.dequantize(), ref.dequantize()), (kind, n)
        assert n % 64 or torch.equal(fast.packed, ref.packed), kind
        x = torch.randn(3, K, generator=g)
        assert torch.equal(fast(x), ref(x)), kind
"""


@pytest.mark.parametrize("capability,layout", [("avx2", "avx2"), ("default", "scalar")])
def test_direct_packing_writes_the_layout_of_the_cpu_torch_runs_on(capability, layout):
    """Most desktop CPUs have no AVX-512: torch's packer then writes 32-row blocks (AVX2) or
    neighbouring rows (scalar), and loads there took torch's 3x slower packer. The direct
    packer writes each layout bit for bit as torch does. A fresh interpreter, since torch
    picks the capability at start."""
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", _OTHER_CAPABILITY, layout], env=env, cwd=root,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
