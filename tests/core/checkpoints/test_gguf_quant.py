"""Quantized GGUF tensors stay packed: forward against the dequantized-float path."""
import struct
import sys

import pytest
import torch
import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from core.checkpoints import load
from core.errors import CheckpointError
from core.model.kernels import ops as kernel_ops
from tests.core.checkpoints.util import random_model, write_gguf
from tests import forked
from tests.helpers import ROOT, greedy
from core.checkpoints.gguf_write import gguf_tensor_bytes
from tests.core.checkpoints.util import q6_k_blocks

PROMPT = [1, 403, 407, 261, 378]  # BOS + "Once upon a time"
IDS = torch.randint(3, 280, (2, 48), generator=torch.Generator().manual_seed(5))


def teacher_forced_agreement(model, ref, ids):
    """Share of positions where model's argmax equals ref's along ref's own greedy tokens."""
    with torch.no_grad():
        return (model(ids).argmax(-1) == ref(ids).argmax(-1)).float().mean().item()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K"])
def test_packed_forward_matches_dequantized_forward(tmp_path, qtype, monkeypatch):
    monkeypatch.setenv("LLAMADESK_KERNELS", "0")  # the packed path (tests/core/model/kernels: the kernels')
    k_quant = qtype.endswith("_K")
    dim = 256 if k_quant else 128  # K-quants need 256-wide rows
    m = random_model(4, dim=dim, n_heads=4, n_kv_heads=2, hidden_dim=dim * 3 // 2 if not k_quant else 512)
    f = tmp_path / f"m-{qtype}.gguf"
    write_gguf(f, m, qtype=qtype)
    packed = load(f, device="cpu")  # auto: quantized linears stay packed
    floats = load(f, device="cpu", dtype="float32")  # today's path: dequantized to float32
    path = {"Q8_0": "int4x2-packed", "Q5_0": "int4x2-packed", "Q5_1": "int4x2-packed", "Q5_K": "int4x2-packed",
            "Q6_K": "int4x2-requantized"}.get(qtype, "int4-packed")
    assert packed.info["linear_paths"] == {f"{qtype} {path}": 15, f"{qtype} embedding-blocks": 1}
    assert packed.info["tensor_paths"][qtype] == sorted(["embedding-blocks", path])
    assert floats.info["linear_paths"] == {"float": 15}
    # the embedding kept as blocks decodes rows exactly as gguf does (the float path's rows)
    torch.testing.assert_close(packed.model.tok_embeddings(IDS), floats.model.tok_embeddings(IDS), atol=0, rtol=0)
    with torch.no_grad():
        a, b = packed.model(IDS), floats.model(IDS)
    # The packed path differs by bf16 activations/outputs in each linear and bf16 scales:
    # stated tolerance 4% of the logits' range on these deliberately wide random models.
    # Q6_K also rounds one 16-weight sub-block of each pair (core.model.quant): 8%, and under half
    # of what Q6_K's own quantization moves the logits (measured 6.3% against 25%).
    tol = 0.08 if qtype == "Q6_K" else 0.04
    assert (a - b).abs().max() <= tol * b.abs().max(), ((a - b).abs().max(), b.abs().max())
    if qtype == "Q6_K":
        with torch.no_grad():
            original = m.float()(IDS)
        assert (a - b).abs().max() <= 0.5 * (b - original).abs().max()
    ids, _ = greedy(packed.model, [1, 5, 6], 64)
    seq = torch.tensor([[1, 5, 6] + ids[:-1]])
    assert teacher_forced_agreement(packed.model, floats.model, seq) >= 0.9
    # memory: within 1.25x of the file's tensor bytes (bf16 scale+zero per 32 weights, 64-row
    # padding); the 5- and 6-bit types take two 4-bit planes (10 bits a weight against the
    # file's 5.5-6.6), under 0.4x of the float32 they replace (norms and the embedding included).
    limit = {"Q5_0": 1.9, "Q5_1": 1.75, "Q5_K": 1.9, "Q6_K": 1.6}.get(qtype, 1.25)
    assert packed.info["memory_bytes"] <= limit * gguf_tensor_bytes(f)
    assert packed.info["memory_bytes"] < 0.4 * floats.info["memory_bytes"]


def test_fallback_types_are_dequantized_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMADESK_KERNELS", "0")  # Q4_K packed, not multiplied by the kernels
    m = random_model(2, dim=256, n_heads=4, n_kv_heads=2, hidden_dim=256, n_layers=1)
    qtypes = {n: ("Q3_K" if "feed_forward" in n else "Q4_K") for n in m.state_dict()}
    f = tmp_path / "k.gguf"
    write_gguf(f, m, qtypes=qtypes)
    lm = load(f, device="cpu")
    assert lm.info["tensor_paths"]["Q3_K"] == ["dequantized (Q3_K has no packed kernel)"]
    assert lm.info["linear_paths"] == {"Q4_K int4-packed": 5, "float": 3, "Q4_K embedding-blocks": 1}
    assert lm.info["dequantized"] is True


@pytest.mark.parametrize("path", ["kernel", "int4x2-packed"])
def test_stories260k_q8_0_packed_keeps_its_greedy_text(fixtures, tmp_path, monkeypatch, path):
    """The real model requantized to Q8_0 by gguf's quantizer (w2's 172-wide rows cannot be
    blocked and stay F32): the kernel's and packed paths give the dequantized path's 64 greedy
    tokens."""
    if path == "kernel" and kernel_ops.kernels() is None:
        pytest.skip("no compiled kernels here")
    if path != "kernel":
        monkeypatch.setenv("LLAMADESK_KERNELS", "0")
    src = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    qtypes = {n: ("F32" if n.endswith("w2.weight") else "Q8_0") for n in src.model.state_dict()}
    src.model.args = src.args
    f = tmp_path / "s-q8.gguf"
    write_gguf(f, src.model, qtypes=qtypes, vocab=_vocab(src.tokenizer))
    packed = load(f, device="cpu")
    floats = load(f, device="cpu", dtype="float32")
    assert packed.info["linear_paths"] == {f"Q8_0 {path}": 31, "float": 5, "Q8_0 embedding-blocks": 1}
    a, _ = greedy(packed.model, PROMPT, 64)
    b, _ = greedy(floats.model, PROMPT, 64)
    assert a == b
    assert packed.tokenizer.decode(a).startswith(", there was a little girl named Lily")


def _vocab(tok):
    n = tok.vocab_size
    return ([tok.processor.id_to_piece(i) for i in range(n)], [tok.processor.get_score(i) for i in range(n)],
            [1] * n) if hasattr(tok, "processor") else None


def _patch_first_dim(path, tensor: str, new: int):
    """Rewrite the first dimension in a tensor's header entry (a corrupt file)."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    assert n_dims == 2
    struct.pack_into("<Q", data, at + 4, new)
    path.write_bytes(bytes(data))


def test_corrupt_quantized_tensors_name_file_and_tensor(tmp_path):
    m = random_model(3, dim=128, n_heads=4, n_kv_heads=2, hidden_dim=192)
    f = tmp_path / "bad.gguf"
    write_gguf(f, m, qtype="Q4_0")
    _patch_first_dim(f, "blk.0.attn_q.weight", 48)  # rows of 48 weights: not whole 32-blocks
    with pytest.raises(CheckpointError) as e:
        load(f, device="cpu")
    assert e.value.tensor == "blk.0.attn_q.weight" and e.value.file == str(f)
    assert "block size 32" in str(e.value)
    g = tmp_path / "cut.gguf"
    write_gguf(g, m, qtype="Q8_0")
    g.write_bytes(g.read_bytes()[:-1000])
    with pytest.raises(CheckpointError) as e:
        load(g, device="cpu")
    assert e.value.tensor and "truncated" in str(e.value) and e.value.file == str(g)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_non_finite_block_scale_is_refused(tmp_path, qtype):
    m = random_model(3, dim=128, n_heads=4, n_kv_heads=2, hidden_dim=192)
    f = tmp_path / "nan.gguf"
    write_gguf(f, m, qtype=qtype)
    t = next(t for t in gguf.GGUFReader(f).tensors if t.name == "blk.1.ffn_up.weight")
    with open(f, "r+b") as fh:  # both types start a block with its fp16 scale
        fh.seek(t.data_offset + 5 * t.data.reshape(-1).view("uint8").shape[0] // t.shape[1])
        fh.write(struct.pack("<e", float("nan")))
    with pytest.raises(CheckpointError) as e:
        load(f, device="cpu")
    assert e.value.tensor == "blk.1.ffn_up.weight" and e.value.file == str(f)
    assert "NaN or infinite" in str(e.value)


def test_the_tests_q6_k_writer_round_trips_through_gguf():
    """q6_k_blocks (test data: gguf has no Q6_K quantizer) lays blocks out as gguf reads them."""
    x = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    y = dequantize(q6_k_blocks(x), Q.Q6_K).reshape(x.shape)
    assert np.sqrt(((y - x) ** 2).mean() / (x ** 2).mean()) < 0.03  # a 6-bit quantizer's error


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_tied_quantized_embeddings_stay_packed(tmp_path, qtype):
    """A tied model's quantized token_embd serves lookups as blocks and the output layer as a
    packed copy: no float matrix is held, and the logits match the dequantized-float path."""
    m = random_model(4, dim=128, n_heads=4, n_kv_heads=2, hidden_dim=192, tie_word_embeddings=True)
    f = tmp_path / f"tied-{qtype}.gguf"
    write_gguf(f, m, qtype=qtype)
    packed = load(f, device="cpu")
    floats = load(f, device="cpu", dtype="float32")
    on_kernel = qtype == "Q8_0" and kernel_ops.kernels() is not None  # the output: the embedding's own bytes
    path = "kernel" if on_kernel else "int4x2-packed" if qtype == "Q8_0" else "int4-packed"
    assert packed.info["linear_paths"] == {f"{qtype} {path}": 15, f"{qtype} embedding-blocks": 1}
    assert not any(p.dim() == 2 and p.numel() >= 128 * 288 for p in packed.model.parameters())
    assert packed.info["parameters"] == floats.info["parameters"]  # the tied matrix counted once
    torch.testing.assert_close(packed.model.tok_embeddings(IDS), floats.model.tok_embeddings(IDS), atol=0, rtol=0)
    with torch.no_grad():
        a, b = packed.model(IDS), floats.model(IDS)
    assert (a - b).abs().max() <= 0.04 * b.abs().max(), ((a - b).abs().max(), b.abs().max())
    ids, _ = greedy(packed.model, [1, 5, 6], 64)
    assert teacher_forced_agreement(packed.model, floats.model, torch.tensor([[1, 5, 6] + ids[:-1]])) >= 0.9
    assert packed.info["memory_bytes"] < 0.4 * floats.info["memory_bytes"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_resident_memory_after_load_stays_near_the_packed_bytes(tmp_path):
    """The load's transient copies (decoding, packing) are handed back to the OS: resident
    memory grows by about the packed weights (1.16x this Q8_0 file's tensor bytes: two 4-bit
    planes with bf16 scale and zero, 10 bits a weight against 8.5; 1.04-1.07x measured).
    Without returning freed heap (core.model.memory.release_freed_heap) it grew by
    2.8-3.3x here (two layers; four cost twice the CPU and gave 1.11x and 2.1-2.4x)."""
    m = random_model(0, dim=1024, n_layers=2, n_heads=8, n_kv_heads=4, hidden_dim=2816, vocab_size=4096)
    f, tiny = tmp_path / "m-Q8_0.gguf", tmp_path / "tiny-Q8_0.gguf"
    write_gguf(f, m, qtype="Q8_0")
    write_gguf(tiny, random_model(1), qtype="Q8_0")
    # a tiny file first, so the imports and probes a load makes are not counted
    code = ("import sys\nfrom core.checkpoints import load\n"
            "def rss():\n    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS:')).split()[1])\n"
            "load(sys.argv[2], device='cpu')\nbefore = rss()\nlm = load(sys.argv[1], device='cpu')\n"
            "print((rss() - before) * 1024, lm.info['memory_bytes'])")
    # a process of its own, forked from tests/forked.py's server rather than started (its
    # Python and torch start-up, ~2.5 s of CPU, happened once there)
    script = tmp_path / "rss.py"
    script.write_text(code)
    out = forked.run(forked.script, str(script), [str(f), str(tiny)], cwd=ROOT)
    assert out.returncode == 0, out.stderr
    grown, packed = map(int, out.stdout.split())
    tensor = gguf_tensor_bytes(f)
    assert packed <= 1.2 * tensor
    assert grown <= 1.35 * tensor, grown / tensor
