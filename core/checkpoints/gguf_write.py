"""Write a loaded model as a GGUF file (llama arch) with float or quantized tensors.

Tensors are quantized by ``gguf.quants`` (the ``gguf`` package's own quantizers, which
follow llama.cpp's reference ones); ``gguf.GGUFWriter`` lays out the header, alignment and
tensor shapes the way llama.cpp reads them. Matrices whose rows are not whole blocks of
the chosen type (e.g. stories260K's 172-wide FFN rows) are written F32, and norms are
always F32, as llama.cpp's own converter does.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

from core.checkpoints.common import LoadedModel
from core.checkpoints.gguf import gguf_name
from core.checkpoints.gguf_reader import Metadata, open_reader
from core.checkpoints.gguf_vocab import LLAMA_BPE, byte_level_vocab, check_same_ids
from core.errors import CheckpointError, TokenizerError
from core.model.transformer import rope_frequencies
from core.model.args import ModelArgs

#: Tensor types ``convert --to gguf --type`` can write.
GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def save_gguf(loaded: LoadedModel, dst: Path, qtype: str = "Q8_0") -> None:
    """Write ``loaded`` (float weights) to the file ``dst`` with matrices as ``qtype``."""
    if qtype not in GGUF_TYPES:
        raise CheckpointError(f"unknown GGUF tensor type '{qtype}' (use {', '.join(GGUF_TYPES)})")
    a = loaded.args
    w = gguf.GGUFWriter(str(dst), "llama")
    add_llama_params(w, a, loaded.info.get("general_name") or loaded.name, qtype)
    _write_tokenizer(w, loaded)
    if loaded.chat_template:
        w.add_chat_template(loaded.chat_template)
    kind = Q[qtype]
    block = GGML_QUANT_SIZES[kind][0]
    for name, t in loaded.model.state_dict().items():
        if a.tie_word_embeddings and name == "output.weight":
            continue
        x = t.detach().float().cpu().numpy()
        if x.ndim != 2 or kind == Q.F32 or x.shape[1] % block:
            w.add_tensor(gguf_name(name), x.astype(np.float32))
        elif kind == Q.F16:
            w.add_tensor(gguf_name(name), x.astype(np.float16))
        else:
            data = quantize(x, kind)
            w.add_tensor(gguf_name(name), data, raw_shape=data.shape, raw_dtype=kind)
    if a.rope_scaling:
        # llama.cpp takes Llama 3.1 scaling as per-frequency divisors (rope_freqs.weight)
        plain = ModelArgs(**{**a.__dict__, "rope_scaling": None, "use_scaled_rope": False})
        w.add_tensor("rope_freqs.weight", (rope_frequencies(plain) / rope_frequencies(a)).numpy().astype(np.float32))
        w.add_rope_scaling_type(gguf.RopeScalingType.LLAMA3 if hasattr(gguf.RopeScalingType, "LLAMA3")
                                else gguf.RopeScalingType.NONE)
        w.add_rope_scaling_orig_ctx_len(int(a.rope_scaling["original_max_position_embeddings"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def add_llama_params(w, a: ModelArgs, name: str | None = None, qtype: str | None = None) -> None:
    """Write ``a`` as llama.cpp's llama.* metadata on a ``gguf.GGUFWriter`` (and the file
    type, when ``qtype`` names the matrices' tensor type)."""
    if name:
        w.add_name(str(name))
    w.add_context_length(a.max_seq_len)
    w.add_embedding_length(a.dim)
    w.add_block_count(a.n_layers)
    w.add_feed_forward_length(a.hidden_dim)
    w.add_head_count(a.n_heads)
    w.add_head_count_kv(a.n_kv_heads)
    w.add_layer_norm_rms_eps(a.norm_eps)
    w.add_rope_freq_base(a.rope_theta)
    w.add_rope_dimension_count(a.head_dim)
    w.add_vocab_size(a.vocab_size)
    if a.head_dim != a.dim // a.n_heads:
        w.add_key_length(a.head_dim)
        w.add_value_length(a.head_dim)
    if qtype:
        file_type = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q4_K": "MOSTLY_Q4_K_M",
                     "Q5_K": "MOSTLY_Q5_K_M", "Q6_K": "MOSTLY_Q6_K"}.get(qtype, f"MOSTLY_{qtype}")
        w.add_file_type(gguf.LlamaFileType[file_type])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _write_tokenizer(w, loaded: LoadedModel) -> None:
    """A GGUF source's tokenizer fields are copied; a SentencePiece one is written out as a
    "llama" vocabulary, a Llama 3 one (tokenizer.json or tiktoken ranks) as "gpt2"."""
    tok = loaded.tokenizer
    if loaded.info.get("format") == "gguf":
        path = Path(loaded.info["path"])
        reader = open_reader(path)
        md = Metadata(reader, path)
        for key, field in reader.fields.items():
            if key.startswith("tokenizer."):
                sub = field.types[1] if len(field.types) > 1 else None
                w.add_key_value(key, md.get(key), field.types[0], sub_type=sub)
        return
    kind = getattr(tok, "kind", None)
    if kind in ("hf", "tiktoken"):
        _write_byte_level(w, tok, loaded.args.vocab_size)
        return
    if kind != "sentencepiece":
        raise CheckpointError(f"writing a GGUF needs a SentencePiece, Llama 3 or GGUF tokenizer; this model's is "
                              f"'{kind or '?'}' (convert to hf instead)")
    sp = tok.processor
    n = sp.get_piece_size()
    tokens, scores, types = [], [], []
    for i in range(n):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    for ident, add in ((sp.unk_id(), w.add_unk_token_id), (tok.bos_id, w.add_bos_token_id),
                       (tok.eos_id, w.add_eos_token_id), (tok.pad_id, w.add_pad_token_id)):
        if ident is not None and ident >= 0:
            add(int(ident))
    w.add_add_space_prefix(bool(tok.add_dummy_prefix))


def _write_byte_level(w, tok, size: int) -> None:
    """Llama 3's tokenizer as llama.cpp's converter writes it: "gpt2" tokens (GPT-2's byte
    alphabet), merges, token types, the "llama-bpe" pre-tokenizer and the special ids,
    after checking that the loader rebuilds the same ids from them."""
    try:
        tokens, merges, types = byte_level_vocab(tok, size)
        check_same_ids(tok, tokens, merges, types)
    except TokenizerError as e:
        raise CheckpointError(str(e)) from None
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(LLAMA_BPE)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    special = tok.special_tokens
    for ident, add in ((tok.bos_id, w.add_bos_token_id), (tok.eos_id, w.add_eos_token_id),
                       (special.get("<|eot_id|>"), w.add_eot_token_id), (special.get("<|eom_id|>"), w.add_eom_token_id),
                       (tok.pad_id, w.add_pad_token_id)):
        if ident is not None:
            add(int(ident))
    # The prompt starts with BOS here (and in Meta's and HF's Llama 3): llama.cpp adds it when told.
    w.add_add_bos_token(tok.bos_id is not None)
    w.add_add_eos_token(False)


def gguf_tensor_bytes(path: str | Path) -> int:
    """Total bytes of a GGUF file's tensor data (what a loader must hold)."""
    return int(sum(t.n_bytes for t in GGUFReader(str(path)).tensors))


