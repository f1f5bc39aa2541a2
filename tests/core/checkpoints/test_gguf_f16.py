"""F16 GGUF files keep their float16 weights and stay as close to the file as llama.cpp.

The reference is the issue's "exact": the file's weights as the ``gguf`` package reads them,
a plain float32 forward, float64 log-softmax. llama.cpp on F16 files measured a mean
|Δ log-prob| of 0.005 and 100% argmax agreement; computing in bfloat16 gave 0.080 and 94%.
"""
from __future__ import annotations

import copy

import pytest
import torch

from core.checkpoints import load
from core.model import f16
from core.model.kernels import build as kernel_build, ops as kernel_ops
from core.model.f16 import DENSE_ROWS, Float16Embedding, Float16Linear
from core.model.args import ModelArgs
from core.model.kv_cache import KVCache
from core.model.quant import swap_linear
from core.model.transformer import Linear, Transformer
from core.model.tuning import DTYPE_ENV
from tests.core.checkpoints.util import random_model, reference_model, write_gguf

LLAMA_CPP_MEAN = 0.005  # llama.cpp's mean |Δ log-prob| on F16 files (issue 24)
STEPS = 16


@pytest.fixture
def torch_path(monkeypatch):
    """Loads take the torch path (no compiled kernels), as on a machine without a compiler."""
    monkeypatch.setenv(kernel_build.ENV, "0")


@pytest.fixture(params=["kernels", "torch"])
def either_path(request, monkeypatch):
    """Each of the two paths an F16 file can take (the kernels' skipped where none build)."""
    if request.param == "torch":
        monkeypatch.setenv(kernel_build.ENV, "0")
    elif kernel_ops.kernels() is None:
        pytest.skip(f"no compiled kernels here: {kernel_build.reason()}")
    return request.param


@pytest.fixture(scope="module")
def peaked_f16(tmp_path_factory):
    """A small model whose next-token distributions are peaked like a trained model's (its
    final norm scaled up: the top token holds ~85% on average), written F16 with tied
    embeddings; (file, exact float32 model, a teacher-forced token sequence)."""
    torch.manual_seed(0)
    m = Transformer(ModelArgs(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=512, hidden_dim=768,
                              max_seq_len=256, tie_word_embeddings=True)).eval()
    with torch.no_grad():
        m.norm.weight.mul_(5.0)
    f = tmp_path_factory.mktemp("f16") / "peaked-F16.gguf"
    held = write_gguf(f, m, qtype="F16")
    exact = reference_model(m.args, held)
    seq = [1] + torch.randint(3, 512, (STEPS,), generator=torch.Generator().manual_seed(2)).tolist()
    return f, exact, seq


class _Float16Inputs(torch.nn.Module):
    """llama.cpp's arithmetic on F16 weights: activations rounded to float16, float32 sums
    and outputs (its KV cache, also float16, left exact here: a kinder reference)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return torch.nn.functional.linear(x.half().float(), self.weight)


def _llama_cpp_arithmetic(exact):
    m = copy.deepcopy(exact)
    for name, mod in list(m.named_modules()):
        if isinstance(mod, Linear):
            swap_linear(m, name + ".weight", _Float16Inputs(mod.weight))
    return m


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.double(), -1)


def _decode_logits(model, seq: list[int]) -> torch.Tensor:
    """Teacher-forced through the decode path: one token at a time against a KV cache."""
    cache = KVCache.for_model(model, capacity=len(seq))
    out = [model(torch.tensor([[t]]), i, cache)[0, -1] for i, t in enumerate(seq[:-1])]
    return torch.stack(out)


def _fidelity(logits: torch.Tensor, exact_logits: torch.Tensor, seq: list[int]) -> tuple[float, float]:
    """(mean |Δ log-prob| of the exact model's first choice at each position, share of
    positions whose argmax agrees)."""
    tgt = exact_logits.argmax(-1)
    lp, ref = _logprobs(logits), _logprobs(exact_logits)
    delta = (lp.gather(1, tgt[:, None]) - ref.gather(1, tgt[:, None])).abs().mean().item()
    agree = (logits.argmax(-1) == exact_logits.argmax(-1)).double().mean().item()
    return delta, agree


def test_auto_keeps_f16_weights_and_matches_the_exact_forward_like_llama_cpp(peaked_f16, monkeypatch, either_path):
    f, exact, seq = peaked_f16
    # the probe's choice on CPUs where bfloat16 is faster (AMX): before, F16 files then ran in bf16
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    lm = load(f, device="cpu", dtype="auto")
    assert lm.info["dtype"] == "float32" and "F16" in lm.info["dtype_reason"]
    kept = [m for m in lm.model.modules() if isinstance(m, Float16Linear)]
    assert len(kept) == 7 * lm.args.n_layers + 1  # every matrix and the tied output
    assert isinstance(lm.model.tok_embeddings, Float16Embedding)
    assert lm.model.output.weight16.data_ptr() == lm.model.tok_embeddings.weight16.data_ptr()  # tied: one copy
    assert lm.info["tensor_paths"]["F16"] == ["float16-kept"]
    assert all((m.kernels is not None) == (either_path == "kernels") for m in kept)
    # the tied matrix counted once: the F16 matrices' 2 bytes and the norms' 4
    f16 = sum(m.weight16.numel() for m in kept if m is not lm.model.output) + lm.model.output.weight16.numel()
    norms = sum(p.numel() for p in lm.model.parameters())
    assert lm.info["memory_bytes"] == 2 * f16 + 4 * norms
    with torch.no_grad():
        ref = exact(torch.tensor([seq[:-1]]))[0]
        got = _decode_logits(lm.model, seq)
        full = lm.model(torch.tensor([seq[:-1]]))[0]  # many rows: the widened float32 path
        peer = _decode_logits(_llama_cpp_arithmetic(exact), seq)
        bf = _decode_logits(load(f, device="cpu", dtype="bfloat16").model, seq)  # what auto chose before
    delta, agree = _fidelity(got, ref, seq)
    peer_delta, _ = _fidelity(peer, ref, seq)
    bf_delta, _ = _fidelity(bf, ref, seq)
    # float16 logits alone made it 3.3x the peer's distance (before the output layer refined them)
    assert agree == 1.0 and delta <= LLAMA_CPP_MEAN and delta <= 1.5 * peer_delta, (delta, peer_delta)
    assert bf_delta > 5 * delta, (bf_delta, delta)
    delta_full, agree_full = _fidelity(full, ref, seq)  # prefill: widened to float32, exact
    assert agree_full == 1.0 and delta_full < 1e-5, (delta_full, agree_full)


def test_float16_linear_sums_in_float32_and_falls_back_on_overflow():
    torch.manual_seed(0)
    w = (torch.randn(96, 512) * 0.05).half()
    layer = Float16Linear(w)
    x = torch.randn(1, 3, 512)
    want = x.double() @ w.double().T
    for rows in (x[:, :1], x):  # one-row kernel, a few rows
        y = layer(rows)
        assert y.dtype == torch.float32
        # float32 sums: only the float16 rounding of x and of y is left (float16 sums err ~1e-2)
        assert torch.allclose(y.double(), want[:, :rows.shape[1]], rtol=2e-3, atol=2e-3)
    # float32 sums of 512 * 300 * 0.5 = 76800: past float16's 65504, so recomputed in float32
    assert torch.equal(Float16Linear(torch.full((4, 512), 0.5).half())(torch.full((1, 1, 512), 300.0)),
                       torch.full((1, 1, 4), 76800.0))


def test_float16_linear_rows_are_batch_invariant_and_dense_rows_exact():
    torch.manual_seed(1)
    layer = Float16Linear((torch.randn(64, 256) * 0.05).half(), refine=4)  # refined rows too
    layer.invariant = True
    x = torch.randn(5, 1, 256)
    alone = torch.cat([layer(x[i:i + 1]) for i in range(5)])
    assert torch.equal(layer(x), alone)
    many = torch.randn(1, DENSE_ROWS, 256)
    assert torch.allclose(layer(many).double(), many.double() @ layer.weight16.double().T, rtol=0, atol=1e-5)


def test_a_weight_past_split_k_inputs_is_kept_in_column_blocks_and_multiplies_alike():
    """PyTorch's float16 matrix-vector kernel ran the 1B shape's 2048x8192 down projection
    at two thirds the rate of 8192x2048 (docs/PERFORMANCE.md): such a weight is kept as
    contiguous column blocks, each multiplied alone and summed in float32."""
    torch.manual_seed(4)
    k = 2 * f16.SPLIT_K
    w = (torch.randn(24, k) * 0.02).half()
    layer = Float16Linear(w.clone(), refine=4)
    assert layer.parts == 2 and layer.weight16.shape == (2, 24, k // 2) and layer.weight16.is_contiguous()
    assert torch.equal(layer.dequantize(), w.float())  # exact, in [N, K] order
    layer.invariant = True
    x = torch.randn(3, 1, k)
    want = (x.double() @ w.double().T)
    alone = torch.cat([layer(x[i:i + 1]) for i in range(3)])
    assert torch.equal(layer(x), alone)
    # float16 x and float16 partial sums: the rounding of x and of each block's result
    assert torch.allclose(alone.double(), want, rtol=0, atol=2e-3 * want.abs().max().item())
    top = want[:, 0].topk(4, dim=-1).indices  # refined in float32 from the blocks' rows
    assert torch.allclose(alone[:, 0].gather(1, top).double(), want[:, 0].gather(1, top), rtol=0, atol=1e-4)
    many = torch.randn(1, DENSE_ROWS, k)
    assert torch.allclose(layer(many).double(), many.double() @ w.double().T, rtol=0, atol=1e-4)


@pytest.mark.skipif(not f16.ONEDNN, reason="this PyTorch has no oneDNN")
def test_dense_rows_multiply_with_onednn_in_float32(monkeypatch):
    """MKL's float32 GEMM ran 16-64-row chunks of a layered prefill at half oneDNN's speed
    on the AMD EPYC measured (docs/PERFORMANCE.md): the widened weight goes to oneDNN."""
    torch.manual_seed(3)
    layer = Float16Linear((torch.randn(96, 256) * 0.05).half())
    x = torch.randn(1, DENSE_ROWS, 256)
    calls, real = [], torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a[1].shape) or real(*a))
    y = layer(x)
    assert calls == [(96, 256)]
    want = x.double() @ layer.weight16.double().T
    assert y.dtype == torch.float32 and torch.allclose(y.double(), want, rtol=0, atol=1e-5)


def test_explicit_dtypes_still_convert_f16_files(peaked_f16):
    f, _, _ = peaked_f16
    lm = load(f, device="cpu", dtype="float32")
    assert not any(isinstance(m, Float16Linear) for m in lm.model.modules())
    assert lm.model.layers[0].attention.wq.weight.dtype == torch.float32


def test_nan_in_an_f16_matrix_is_refused_naming_the_tensor(tmp_path):
    m = random_model(3)
    with torch.no_grad():
        m.layers[1].feed_forward.w2.weight[3, 4] = float("nan")
    f = tmp_path / "nan-F16.gguf"
    write_gguf(f, m, qtype="F16")
    from core.errors import CheckpointError
    with pytest.raises(CheckpointError, match="blk.1.ffn_down.weight.*|NaN"):
        load(f, device="cpu", dtype="auto")


def test_the_memory_check_counts_the_file_bytes_and_one_widened_layer(peaked_f16, monkeypatch, torch_path):
    from core.checkpoints import gguf as gguf_loader
    from core.checkpoints.gguf_write import gguf_tensor_bytes
    f, exact, _ = peaked_f16
    seen = {}
    real = gguf_loader.limits.check_model
    monkeypatch.setattr(gguf_loader.limits, "check_model",
                        lambda *a, held=None, **kw: seen.setdefault("held", held) and real(*a, held=held, **kw))
    load(f, device="cpu", dtype="auto")
    layer = sum(p.numel() for n, p in exact.layers[0].named_parameters() if n.endswith("weight") and p.dim() == 2)
    assert seen["held"] == gguf_tensor_bytes(f) + 4 * layer  # float16 copies in float32: 2 more bytes each


def test_a_long_prompt_prefills_layer_by_layer_in_float32(peaked_f16, torch_path):
    from core.engine.engine import Engine
    from core.model import quant
    f, exact, _ = peaked_f16
    lm = load(f, device="cpu", dtype="auto")
    prompt = [1] + torch.randint(3, 512, (quant.DENSE_ROWS + 20,), generator=torch.Generator().manual_seed(4)).tolist()
    eng = Engine(lm.model, lm.tokenizer, stop_ids=(), prefill_chunk=32)
    widened = []
    layer0 = lm.model.layers[0].feed_forward.w1
    orig = layer0.dequantize
    layer0.dequantize = lambda dtype: widened.append(dtype) or orig(dtype)
    eng.cache.ensure(1, len(prompt) + 1)
    with torch.inference_mode():
        logits, _ = eng.prefill_row(0, prompt, None)
        ref = exact(torch.tensor([prompt]))[0, -1]
    assert widened == [torch.float32]  # once per prompt, exactly
    assert all(m.dense is None for m in lm.model.modules() if isinstance(m, Float16Linear))
    # float32 throughout but the last row's logits: its 64 largest exact, the tail float16-rounded
    top = ref.topk(64).indices
    assert torch.allclose(logits[top], ref[top], rtol=0, atol=1e-4)
    assert (logits - ref).abs().max() <= 2 ** -10 * ref.abs().max()


def test_cancel_stops_widening_a_layer_between_its_weights(peaked_f16, torch_path):
    import threading

    from core.engine.engine import Engine
    from core.model import quant
    f, _, _ = peaked_f16
    lm = load(f, device="cpu", dtype="auto")
    prompt = [1] + torch.randint(3, 512, (quant.DENSE_ROWS + 20,), generator=torch.Generator().manual_seed(5)).tolist()
    eng = Engine(lm.model, lm.tokenizer, stop_ids=(), prefill_chunk=32)
    cancel, widened = threading.Event(), []
    for m in lm.model.layers[0].modules():
        if isinstance(m, Float16Linear):
            m.dequantize = lambda dtype, _o=m.dequantize: widened.append(1) or cancel.set() or _o(dtype)
    eng.cache.ensure(1, len(prompt) + 1)
    with torch.inference_mode():
        logits, _ = eng.prefill_row(0, prompt, cancel)
    assert logits is None and widened == [1]  # cancelled after the first weight, not the layer's seven
    assert all(m.dense is None for m in lm.model.modules() if isinstance(m, Float16Linear))


@pytest.fixture
def kernels():
    lib = kernel_ops.kernels()
    if lib is None:
        pytest.skip(f"no compiled kernels here: {kernel_build.reason()}")
    return lib


def test_with_kernels_every_row_count_is_float32_and_invariant_and_no_copy_is_made(kernels):
    """ld_mm_f16 takes decode, lanes and prefill alike: float32 x, float32 sums, each row
    the same bits alone or beside others; a weight past SPLIT_K inputs stays the file's
    view (no column blocks), refine is off (nothing to refine) and prefill needs no widened
    copy (quant.dense_weights leaves the layer be)."""
    from core.model import quant
    torch.manual_seed(6)
    w = (torch.randn(40, 2 * f16.SPLIT_K + 48) * 0.02).half()
    layer = Float16Linear(w, refine=4, kernels=kernels)
    assert layer.parts == 1 and layer.weight16.data_ptr() == w.data_ptr() and layer.refine == 0
    assert "kernel=ld_mm_f16" in repr(layer)
    x = torch.randn(DENSE_ROWS + 3, 1, w.shape[1])
    alone = torch.cat([layer(x[i:i + 1]) for i in range(len(x))])
    assert torch.equal(layer(x), alone) and torch.equal(layer(x.transpose(0, 1))[0], alone[:, 0])
    want = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    assert ((alone.double() - want).abs() <= 1e-5 * scale).all()
    model = torch.nn.Sequential(layer)
    assert quant.packed_on_cpu(model) == []
    with quant.dense_weights(model):
        assert layer.dense is None


def test_with_kernels_the_memory_check_counts_the_file_bytes_only(peaked_f16, monkeypatch, kernels):
    from core.checkpoints import gguf as gguf_loader
    from core.checkpoints.gguf_write import gguf_tensor_bytes
    f, _, _ = peaked_f16
    seen = {}
    real = gguf_loader.limits.check_model
    monkeypatch.setattr(gguf_loader.limits, "check_model",
                        lambda *a, held=None, **kw: seen.setdefault("held", held) and real(*a, held=held, **kw))
    load(f, device="cpu", dtype="auto")
    assert seen["held"] == gguf_tensor_bytes(f)  # no widened layer: the kernels read the float16 bytes


def test_with_kernels_a_long_prompt_prefills_in_float32_without_widening(peaked_f16, kernels):
    from core.engine.engine import Engine
    from core.model import quant
    f, exact, _ = peaked_f16
    lm = load(f, device="cpu", dtype="auto")
    prompt = [1] + torch.randint(3, 512, (quant.DENSE_ROWS + 20,), generator=torch.Generator().manual_seed(4)).tolist()
    eng = Engine(lm.model, lm.tokenizer, stop_ids=(), prefill_chunk=32)
    for m in lm.model.modules():
        if isinstance(m, Float16Linear):
            m.dequantize = lambda *a: pytest.fail("widened a float16 weight")
    layered = []
    eng._prefill.layered = lambda *a, _f=eng._prefill.layered: layered.append(1) or _f(*a)
    eng.cache.ensure(1, len(prompt) + 1)
    with torch.inference_mode():
        logits, _ = eng.prefill_row(0, prompt, None)
        ref = exact(torch.tensor([prompt]))[0, -1]
    # layer by layer still: a chunk is a layer's share, so cancel lands within ~0.1 s
    assert layered == [1]
    # float32 throughout, the logits too (the torch path rounds the tail's to float16)
    assert (logits - ref).abs().max() <= 1e-5 * ref.abs().max()
