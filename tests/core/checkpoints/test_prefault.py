"""Weights are read during load, not by the first reply (memory-mapped files pre-faulted)."""
import sys

import pytest
import torch

from core.checkpoints import load
from core.model.transformer import Transformer
from core.model.args import ModelArgs
from tests.core.checkpoints.util import write_gguf


def mapped_rss(path) -> int:
    """Bytes of ``path``'s mappings resident in this process (Linux smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_memory_mapped_weights_are_resident_when_load_returns(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=300, hidden_dim=1024))
    path = tmp_path / "f32.gguf"
    write_gguf(path, model, qtype="F32")
    lm = load(path, device="cpu", dtype="float32")
    weights = sum(p.numel() * 4 for p in lm.model.parameters())
    # The float32 tensors are views of the file's map (no copies) ...
    assert lm.model.layers[0].feed_forward.w1.weight.untyped_storage().nbytes() < weights
    # ... and every page of them was read before load returned.
    assert mapped_rss(path) >= 0.95 * weights
