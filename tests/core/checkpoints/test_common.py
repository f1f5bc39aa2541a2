"""Device and dtype choice."""
import pytest
import torch

from core.checkpoints import common
from core.errors import SettingsError
from core.model import tuning
from core.model.args import ModelArgs

LLAMA3_8B = ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, hidden_dim=14336)
LLAMA32_1B = ModelArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, hidden_dim=8192,
                       tie_word_embeddings=True)


def test_cpu_auto_is_float32_while_it_fits_else_bfloat16(monkeypatch):
    monkeypatch.setattr(common, "total_memory_bytes", lambda: 24 * 2**30)
    cpu = torch.device("cpu")
    assert common.resolve_dtype("auto", cpu, LLAMA32_1B) == torch.float32  # 1.2B x 4 B = 5 GB
    assert common.resolve_dtype("auto", cpu, LLAMA3_8B) == torch.bfloat16  # 8B x 4 B = 32 GB
    assert common.resolve_dtype("auto", cpu) == torch.float32
    monkeypatch.setattr(common, "total_memory_bytes", lambda: None)
    assert common.resolve_dtype("auto", cpu, LLAMA3_8B) == torch.float32


def test_cpu_auto_takes_float32_for_a_small_model_whatever_the_probe_says(monkeypatch):
    """A model whose float32 weights sit in the CPU's caches computes in float32 even where
    the probe (a 64 MB weight) found bfloat16 faster: its products cost their calls."""
    monkeypatch.setenv(tuning.DTYPE_ENV, "bfloat16")
    cpu = torch.device("cpu")
    stories260k = ModelArgs(dim=64, n_layers=5, n_heads=8, n_kv_heads=4, vocab_size=512, hidden_dim=172)
    dtype, why = common.auto_dtype(cpu, stories260k)
    assert dtype == torch.float32 and "small model" in why
    assert common.resolve_dtype("auto", cpu, LLAMA32_1B) == torch.bfloat16  # the probe decides
    assert common.resolve_dtype("auto", cpu) == torch.bfloat16  # size unknown: the probe too


def test_explicit_dtypes_and_errors():
    cpu = torch.device("cpu")
    assert common.resolve_dtype("bfloat16", cpu, LLAMA3_8B) == torch.bfloat16
    assert common.resolve_dtype("float16", cpu) == torch.float16
    with pytest.raises(SettingsError, match="dtype"):
        common.resolve_dtype("int3", cpu)
    # int8/int4 quantize linear weights; the rest computes in what 'auto' picks
    assert common.resolve_dtype("int4", cpu) == common.resolve_dtype("auto", cpu)
    assert common.resolve_device("cpu") == cpu
    with pytest.raises(SettingsError, match="device"):
        common.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(SettingsError, match="CUDA"):
            common.resolve_device("cuda")
