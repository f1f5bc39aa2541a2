"""A Q8_0 GGUF file on the kernels: the whole model against transformers' LlamaForCausalLM
on the file's own (gguf-dequantized) weights and against the two-plane packed path the
kernel replaces; the blocks stay the mapped file's; a corrupt scale is refused."""
import pytest
import torch

from core.checkpoints import gguf as gguf_loader, load
from core.checkpoints.hf import hf_name, to_hf_tensor
from core.errors import CheckpointError
from core.model.kernels.linear import KernelLinear
from tests.core.checkpoints.util import write_gguf
from tests.helpers import greedy, meta_from_hf, tiny_hf

IDS = torch.randint(3, 280, (2, 24), generator=torch.Generator().manual_seed(12))


@pytest.fixture(scope="module")
def q8_file_and_twin(tmp_path_factory):
    """A tied Llama (dim 256, 2 layers) as a Q8_0 GGUF file, and transformers' model holding
    exactly the weights that file holds."""
    hf = tiny_hf(6, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=288, tie_word_embeddings=True)
    meta = meta_from_hf(hf)
    f = tmp_path_factory.mktemp("q8") / "tiny-Q8_0.gguf"
    held = write_gguf(f, meta, qtype="Q8_0")
    twin = type(hf)(hf.config).eval()
    twin.load_state_dict({hf_name(k): to_hf_tensor(k, v, meta.args) for k, v in held.items()}, strict=False)
    twin.tie_weights()
    return f, twin


def test_a_q8_0_file_on_the_kernel_gives_transformers_logits(lib, q8_file_and_twin, monkeypatch):
    f, twin = q8_file_and_twin
    lm = load(f, device="cpu")
    assert lm.info["linear_paths"] == {"Q8_0 kernel": 15, "Q8_0 embedding-blocks": 1}
    assert lm.model.output.raw.data_ptr() == lm.model.tok_embeddings.raw.data_ptr()  # tied: one set of bytes
    tensor_bytes = sum(t.n_bytes for t in gguf_loader.open_reader(f).tensors)
    assert lm.info["memory_bytes"] <= tensor_bytes  # the file's 8.5 bits a weight, not 10 in two planes
    with torch.no_grad():
        ours, ref = lm.model(IDS[:, :8]), twin(IDS[:, :8]).logits  # 8 rows a product: the kernel
    err = (ours - ref).abs().max() / ref.abs().max()
    monkeypatch.setenv("LLAMADESK_KERNELS", "0")
    packed = load(f, device="cpu")
    assert packed.info["linear_paths"] == {"Q8_0 int4x2-packed": 15, "Q8_0 embedding-blocks": 1}
    with torch.no_grad():
        packed_err = (packed.model(IDS[:, :8]) - ref).abs().max() / ref.abs().max()
    # int16 activations (~1.5e-5 of each 32 inputs' maximum) against bfloat16 ones and scales
    assert err <= 1e-3 and err * 20 <= packed_err, (err, packed_err)


def test_greedy_decode_on_the_q8_0_kernel_follows_transformers(lib, q8_file_and_twin):
    f, twin = q8_file_and_twin
    lm = load(f, device="cpu")
    ids, _ = greedy(lm.model, [1, 5, 6], 24)
    with torch.no_grad():
        ref = twin(torch.tensor([[1, 5, 6] + ids[:-1]])).logits[0, 2:].argmax(-1)
    assert ids == ref.tolist()


def test_a_non_finite_q8_0_scale_is_refused_at_load(lib, tmp_path, q8_file_and_twin):
    f, _ = q8_file_and_twin
    t = next(t for t in gguf_loader.open_reader(f).tensors if t.name == "blk.0.attn_k.weight")
    bad = tmp_path / "inf.gguf"
    data = bytearray(f.read_bytes())
    at = int(t.data_offset) + 34 * 5  # the sixth block's fp16 d
    data[at:at + 2] = b"\x00\x7c"  # +inf
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as e:
        load(bad, device="cpu")
    assert e.value.tensor == "blk.0.attn_k.weight" and "NaN or infinite" in str(e.value)


def test_q8_0_layers_are_kernel_linears_on_the_file(lib, q8_file_and_twin):
    f, _ = q8_file_and_twin
    lm = load(f, device="cpu")
    layer = lm.model.layers[1].feed_forward.w2
    assert isinstance(layer, KernelLinear) and layer.kind == "Q8_0" and "source=Q8_0" in repr(layer)
    w = layer.dequantize()
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(3))
    want = x.double() @ w.double().T
    assert ((layer(x).double() - want).abs() <= 2e-4 * (x.double().abs() @ w.double().abs().T)).all()
