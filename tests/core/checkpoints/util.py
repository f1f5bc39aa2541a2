"""Shared helpers for checkpoint tests: greedy decoding both ways, tiny tokenizers."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from tests.helpers import greedy, hf_greedy, widen_weights  # noqa: F401  (re-exported for the checkpoint tests)
from core.checkpoints.gguf import gguf_name
from core.checkpoints.gguf_write import add_llama_params
from core.model.transformer import Transformer
from core.model.args import ModelArgs
from core.tokenizer import bytes_to_unicode

PROMPT = [1, 403, 407, 261, 378]  # stories260K's BOS + "Once upon a time"

LETTERS = "abcdefghijklmnopqrstuvwxyz "


def write_tiny_tokenizer(folder: Path, extra_special: tuple[str, ...] = ()) -> int:
    """A 30-token character-level tokenizer.json (<unk>, <s>, </s>, a-z, space); returns its size."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in LETTERS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", *extra_special)])
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size(with_added_tokens=True)


def write_json(file: Path, data) -> None:
    file.write_text(json.dumps(data, indent=2))


def sp_vocab(n_normal: int = 20):
    """A llama-style (SentencePiece) GGUF vocabulary: <unk>, <s>, </s>, 256 byte tokens, pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["\u2581" + c for c in LETTERS.strip()] + list(LETTERS.strip())
    tokens += pieces[:n_normal]
    types += [1] * len(pieces[:n_normal])
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces[:n_normal]))]
    return tokens, scores, types


def write_gguf(path: Path, model, *, qtype="F32", qtypes=None, vocab=None, arch="llama",
               rope_freqs=None, extra=None, chat_template=None, tokenizer="llama", skip=()):
    """Write ``model`` (our Transformer, Meta layout) as a GGUF file with gguf.GGUFWriter.

    2-D weights are stored as ``qtype`` (or ``qtypes[meta_name]``); norms stay F32.
    Returns {meta name: the float32 tensor the file really holds (dequantized)}.
    """
    a = model.args
    w = gguf.GGUFWriter(str(path), arch)
    add_llama_params(w, a)  # keys carry the writer's arch (another arch: the loader must refuse it)
    if tokenizer == "llama":
        tokens, scores, types = vocab or sp_vocab()
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    elif tokenizer == "gpt2":
        tokens, merges, types, bos, eos, eot = vocab
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types(types)
        w.add_bos_token_id(bos)
        w.add_eos_token_id(eos)
        w.add_eot_token_id(eot)
    if chat_template:
        w.add_chat_template(chat_template)
    for k, v in (extra or {}).items():
        w.add_key_value(k, v[0], v[1])
    held = {}
    sd = model.state_dict()
    for name, t in sd.items():
        if name in skip or (a.tie_word_embeddings and name == "output.weight"):
            continue
        x = t.detach().float().numpy()
        kind = Q[(qtypes or {}).get(name, qtype)] if x.ndim == 2 else Q.F32
        if kind == Q.F32:
            w.add_tensor(gguf_name(name), x)
            held[name] = torch.from_numpy(x.copy())
            continue
        if kind == Q.Q6_K:
            data = q6_k_blocks(x)
        elif kind in (Q.Q3_K, Q.Q4_K, Q.Q5_K):  # gguf cannot quantize these: random blocks with sane scales
            data = _random_k_blocks(x.shape, kind)
        else:
            data = quantize(x, kind)
        w.add_tensor(gguf_name(name), data, raw_shape=data.shape, raw_dtype=kind)
        held[name] = torch.from_numpy(np.ascontiguousarray(dequantize(data, kind), dtype=np.float32)).reshape(x.shape)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def q6_k_blocks(x):
    """A float [rows, cols] matrix as Q6_K blocks (gguf has no Q6_K quantizer): symmetric
    6-bit values under an int8 scale per 16 weights and an fp16 d per 256, laid out as
    gguf's dequantizer reads them (the round trip is checked against it in the tests)."""
    rows, cols = x.shape
    b = x.astype(np.float32).reshape(-1, 16, 16)  # [blocks, sub-blocks, 16]
    scale = np.abs(b).max(-1) / 31  # per sub-block
    d = (scale.max(-1) / 127).astype(np.float16)  # per block
    df = np.where(d == 0, 1, d).astype(np.float32)[:, None]
    sc = np.clip(np.round(scale / df), 1, 127).astype(np.int8)
    q = np.clip(np.round(b / (df * sc)[..., None]), -32, 31).astype(np.int16) + 32  # 0..63
    q = q.reshape(-1, 2, 2, 2, 32)  # [blocks, half, shift 0/4 (ql) and pair, byte]
    flat = q.reshape(-1, 2, 128)
    ql = (flat[..., :64] & 15) | ((flat[..., 64:] & 15) << 4)  # value h*128 + s*64 + j -> ql[h*64 + j] nibble s
    hi = (flat >> 4).reshape(-1, 2, 4, 32)  # value h*128 + s*32 + j -> qh[h*32 + j] bits 2s
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    out = np.concatenate([ql.reshape(-1, 128).astype(np.uint8), qh.reshape(-1, 64).astype(np.uint8),
                          sc.view(np.uint8), d.reshape(-1, 1).view(np.uint8)], axis=1)
    return out.reshape(rows, -1)


def _random_k_blocks(shape, kind):
    block, size = GGML_QUANT_SIZES[kind]
    rows, cols = shape
    rng = np.random.default_rng(rows * 7 + cols)
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.full((rows, cols // block, 1), 0.002, dtype=np.float16).view(np.uint8)
    if kind in (Q.Q4_K, Q.Q5_K):  # d, dmin lead the block
        data[..., 0:2] = scale
        data[..., 2:4] = scale
    else:  # Q3_K, Q6_K: d ends the block
        data[..., size - 2:size] = scale
    return data.reshape(rows, -1)


def reference_model(args, tensors):
    """Our Transformer holding exactly ``tensors`` (float32)."""
    m = Transformer(args)
    m.load_state_dict(tensors, strict=not args.tie_word_embeddings)
    if args.tie_word_embeddings:
        m.output.weight = m.tok_embeddings.weight
    return m.eval()


def random_model(seed=0, **kw):
    """A random Transformer (vocab 288 unless told), weights widened so greedy choices are clear."""
    base = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=288, hidden_dim=160,
                norm_eps=1e-5, max_seq_len=256)
    torch.manual_seed(seed)
    return widen_weights(Transformer(ModelArgs(**{**base, **kw})).eval())


LLAMA3_TEMPLATE = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}")


def write_llama3_gguf(f: Path, pre: str | None = None) -> tuple[int, int, int]:
    """A random model with a byte-level (gpt2) vocabulary and Llama 3's chat template, written
    as GGUF to f (``pre``: its tokenizer.ggml.pre, none by default); returns its bos, eos and
    end-of-turn ids."""
    byte_chars = list(bytes_to_unicode().values())
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tokens = byte_chars + ["he", "ll", "hell", "hello", "\u0120w"] + specials
    merges = ["h e", "l l", "he ll", "hell o", "\u0120 w"]
    types = [1] * (256 + 5) + [3] * len(specials)
    bos, eos, eot = 261, 262, 265
    write_gguf(f, random_model(5, vocab_size=272), tokenizer="gpt2", vocab=(tokens, merges, types, bos, eos, eot),
               chat_template=LLAMA3_TEMPLATE,
               extra=None if pre is None else {"tokenizer.ggml.pre": (pre, gguf.GGUFValueType.STRING)})
    return bos, eos, eot
