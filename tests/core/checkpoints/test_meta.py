"""Meta folders: model-parallel shards merged on load, and generate on every format via the CLI."""
import json

import torch

from core.cli.main import main
from core.checkpoints import load
from core.checkpoints.meta import load_meta
from core.checkpoints.convert import convert

# How Meta's model-parallel checkpoints split each weight (fairscale Column/RowParallelLinear).
SPLIT_DIM = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1}


def shard(sd, n, emb_dim):
    shards = [{} for _ in range(n)]
    for name, t in sd.items():
        key = name.split(".")[-2]
        dim = emb_dim if key == "tok_embeddings" else SPLIT_DIM.get(key)
        for i, piece in enumerate(t.chunk(n, dim=dim) if dim is not None else [t] * n):
            shards[i][name] = piece.clone()
    return shards


def test_two_shards_merge_to_the_single_file_model(tiny_meta_dir, tmp_path):
    one = load_meta(tiny_meta_dir, device="cpu", dtype="float32")
    sd = torch.load(tiny_meta_dir / "consolidated.00.pth", weights_only=True, mmap=True)
    ids = torch.tensor([[1, 15043, 3186, 29892, 920]])
    with torch.no_grad():
        ref = one.model(ids)
    for emb_dim, label in ((1, "llama2"), (0, "llama3")):  # Llama 2 splits the embedding's width, Llama 3 its rows
        d = tmp_path / label
        d.mkdir()
        (d / "tokenizer.model").write_bytes((tiny_meta_dir / "tokenizer.model").read_bytes())
        params = json.loads((tiny_meta_dir / "params.json").read_text())
        params["vocab_size"] = -1  # as Meta's Llama 2 params.json says: read it off the shards
        (d / "params.json").write_text(json.dumps(params))
        for i, part in enumerate(shard(sd, 2, emb_dim)):
            torch.save(part, d / f"consolidated.{i:02d}.pth")
        lm = load(d, device="cpu", dtype="float32")
        assert lm.info["files"] == ["consolidated.00.pth", "consolidated.01.pth"]
        with torch.no_grad():
            torch.testing.assert_close(lm.model(ids), ref, atol=1e-5, rtol=0)


def test_cli_generate_on_every_format(fixtures, tmp_path, capsys):
    gguf = fixtures / "stories260K.gguf"
    convert(gguf, tmp_path / "hf")
    convert(gguf, tmp_path / "meta", fmt="meta")
    texts = {}
    for model in (gguf, tmp_path / "hf", tmp_path / "meta"):
        rc = main(["generate", str(model), "--prompt", "Once upon a time", "--temperature", "0",
                   "--max-new-tokens", "16", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0 and out["prompt_tokens"] == [1, 403, 407, 261, 378]
        texts[str(model)] = out["text"]
    assert len(set(texts.values())) == 1
    assert next(iter(texts.values())).startswith(", there was a little girl named Lily")
