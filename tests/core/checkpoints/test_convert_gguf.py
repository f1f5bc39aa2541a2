"""convert --to gguf: quantized GGUF files laid out as llama.cpp reads them, round-tripping."""
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize, quantize

from core.cli.main import main
from core.checkpoints import load
from core.checkpoints.gguf import gguf_name
from core.checkpoints.convert import convert
from core.model.kernels import ops as kernel_ops
from tests.core.checkpoints.util import PROMPT
from tests.helpers import greedy
DEMO = Path(__file__).resolve().parents[3] / "assets" / "models" / "llamadesk-demo"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_stories260k_to_quantized_gguf(fixtures, tmp_path, qtype):
    src_file = fixtures / "stories260K.gguf"
    dst = convert(src_file, tmp_path / f"s-{qtype}.gguf", fmt="gguf", qtype=qtype)
    src = load(src_file, device="cpu", dtype="float32")
    r, orig = GGUFReader(str(dst)), GGUFReader(str(src_file))
    shapes = {t.name: t.shape.tolist() for t in orig.tensors}
    align = int(r.fields["general.alignment"].contents()) if "general.alignment" in r.fields else 32
    sd = src.model.state_dict()
    for t in r.tensors:
        assert t.shape.tolist() == shapes[t.name], t.name  # same GGUF dims as llama.cpp's file
        assert (r.data_offset + int(t.data_offset)) % align == 0
        meta = next(k for k in sd if gguf_name(k) == t.name)
        x = sd[meta].numpy()
        if x.ndim == 2 and x.shape[1] % 32 == 0:
            assert t.tensor_type == Q[qtype], t.name
            # the file holds exactly what gguf's own quantizer makes of the source weights
            want = dequantize(quantize(x, Q[qtype]), Q[qtype])
            assert np.array_equal(dequantize(t.data, t.tensor_type).reshape(x.shape), want)
        else:  # norms, and w2 whose 172-wide rows are not whole blocks
            assert t.tensor_type == Q.F32 and np.array_equal(np.asarray(t.data).reshape(x.shape), x)
    assert r.fields["general.file_type"].contents() == {"Q8_0": 7, "Q4_0": 2}[qtype]
    lm = load(dst, device="cpu")
    assert lm.tokenizer.encode("Once upon a time", bos=True) == PROMPT
    on_kernel = qtype == "Q8_0" and kernel_ops.kernels() is not None  # else packed
    how = "kernel" if on_kernel else "int4x2-packed" if qtype == "Q8_0" else "int4-packed"
    assert lm.info["linear_paths"].get(f"{qtype} {how}") == 31  # 5 w2 stay F32
    ids, _ = greedy(lm.model, PROMPT, 16)
    # the known continuation of the float model survives both quantizations
    assert lm.tokenizer.decode(ids).startswith(", there was a little girl named Lily. She loved to play")


def test_demo_model_to_q4_0_keeps_tokenizer_and_chat_format(tmp_path):
    dst = tmp_path / "demo.gguf"
    rc = main(["convert", str(DEMO), str(dst), "--to", "gguf", "--type", "Q4_0"])
    assert rc == 0
    a, b = load(DEMO, device="cpu", dtype="float32"), load(dst, device="cpu")
    text = "Tell me a story about a dog named Max."
    assert a.tokenizer.encode(text, bos=True) == b.tokenizer.encode(text, bos=True)
    assert b.chat_format.name == a.chat_format.name == "llama3"
    assert b.args.tie_word_embeddings and "output.weight" not in {t.name for t in GGUFReader(str(dst)).tensors}
    # tied: the Q4_0 embedding serves lookups as blocks and the output layer packed
    assert b.info["linear_paths"] == {"Q4_0 int4-packed": 29, "Q4_0 embedding-blocks": 1}
    with torch.no_grad():
        x = torch.tensor([a.tokenizer.encode(text, bos=True)])
        la, lb = a.model(x), b.model(x)
    assert (la.argmax(-1) == lb.argmax(-1)).float().mean() >= 0.8


def test_convert_gguf_errors(tmp_path, capsys, fixtures):
    dst = tmp_path / "x.gguf"
    dst.write_bytes(b"keep me")
    assert main(["convert", str(fixtures / "stories260K.gguf"), str(dst), "--to", "gguf"]) == 2
    assert "already exists" in capsys.readouterr().err and dst.read_bytes() == b"keep me"
    assert main(["convert", str(fixtures / "stories260K.gguf"), str(dst), "--to", "gguf", "--type", "Q3"]) == 2
    assert "Q3" in capsys.readouterr().err
