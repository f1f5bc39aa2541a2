"""The valid seed models the bad-input corpus is made from, and a GGUF rewriter to break them.

Split from tools/badinputs.py so the runner, the case tables and the seed writers each stay
small; tests/robustness uses ``write_gguf`` and ``make_seeds`` directly.
"""
from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "stories260K.gguf"


def write_gguf(src: Path, dst: Path, *, set_kv: dict | None = None, drop_kv=(), tensors=None,
               retype: dict | None = None, shift: dict | None = None) -> None:
    """Copy the GGUF ``src`` to ``dst`` with metadata and tensors changed.

    set_kv: key -> value (type picked from the value: bool, int (u32/i32/u64/i64), float
        (f32 or f64), str, list) replacing or adding a key.
    tensors: name -> numpy array replacing a tensor's data (same type).
    retype: name -> GGML type name written in the header while the data stay as they were.
    shift: name -> bytes added to the tensor's data offset in the header (misalignment).
    """
    import gguf
    import numpy as np

    r = gguf.GGUFReader(src)
    arch = (set_kv or {}).get("general.architecture", r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(dst), str(arch))
    set_kv = dict(set_kv or {})
    set_kv.pop("general.architecture", None)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_kv:
            continue
        if name in set_kv:
            _add_value(w, name, set_kv.pop(name))
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vt, sub_type=sub)
    for name, v in set_kv.items():
        _add_value(w, name, v)
    for t in r.tensors:
        data = np.array(t.data)
        if tensors and t.name in tensors:
            data = np.asarray(tensors[t.name], dtype=data.dtype).reshape(data.shape)
        kind = t.tensor_type
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if retype or shift:
        _patch_tensor_infos(dst, retype or {}, shift or {})


def _add_value(w, key: str, v) -> None:
    import gguf
    T = gguf.GGUFValueType
    if isinstance(v, bool):
        w.add_key_value(key, v, T.BOOL)
    elif isinstance(v, int):
        if 0 <= v < 2**32:
            w.add_key_value(key, v, T.UINT32)
        elif -2**31 <= v < 0:
            w.add_key_value(key, v, T.INT32)
        elif 0 <= v < 2**64:
            w.add_key_value(key, v, T.UINT64)
        else:
            w.add_key_value(key, max(min(v, 2**63 - 1), -2**63), T.INT64)
    elif isinstance(v, float):
        w.add_key_value(key, v, T.FLOAT64 if abs(v) > 3e38 and v == v and abs(v) != float("inf") else T.FLOAT32)
    elif isinstance(v, str):
        w.add_key_value(key, v, T.STRING)
    elif isinstance(v, list):
        sub = T.STRING if v and isinstance(v[0], str) else T.FLOAT32 if v and isinstance(v[0], float) else T.INT32
        w.add_key_value(key, v, T.ARRAY, sub_type=sub)
    else:
        raise TypeError(type(v))


def _patch_tensor_infos(path: Path, retype: dict, shift: dict) -> None:
    """Rewrite tensor-info type fields / offsets in place (little-endian GGUF v3)."""
    import struct

    import gguf
    data = bytearray(path.read_bytes())
    r = gguf.GGUFReader(path)
    for t in r.tensors:
        info = t.field
        _, name_data, _, dims, raw_dtype, offset = info.parts
        # parts are views into the mapped file: their byte positions
        base = r.data.ctypes.data
        if t.name in retype:
            pos = raw_dtype.ctypes.data - base
            struct.pack_into("<I", data, pos, int(gguf.GGMLQuantizationType[retype[t.name]]))
        if t.name in shift:
            pos = offset.ctypes.data - base
            struct.pack_into("<Q", data, pos, int(offset[0]) + shift[t.name])
    del r
    path.write_bytes(bytes(data))


def make_seeds(out: Path) -> dict[str, Path]:
    """The valid seed inputs every case is made from: GGUF, Meta and HF forms of one model."""
    from core.checkpoints import load
    from core.checkpoints.hf import save_hf
    from core.checkpoints.meta import save_meta

    out.mkdir(parents=True, exist_ok=True)
    seeds = {"gguf": out / "seed.gguf", "meta": out / "seed_meta", "hf": out / "seed_hf"}
    if not seeds["gguf"].exists():
        shutil.copy(FIXTURE, seeds["gguf"])
    lm = load(seeds["gguf"], device="cpu", dtype="float32")
    if not (seeds["meta"] / "params.json").exists():
        tok_file = out / "seed_tokenizer.model"
        tok_file.write_bytes(lm.tokenizer.processor.serialized_model_proto())
        save_meta(lm, seeds["meta"], tokenizer_file=tok_file)
    if not (seeds["hf"] / "config.json").exists():
        save_hf(lm, seeds["hf"])
        # An HF folder with a tokenizer.json too, for the tokenizer.json cases.
    seeds["tokenizer.model"] = seeds["meta"] / "tokenizer.model"
    tj = out / "seed_tokenizer.json"
    if not tj.exists():
        from tokenizers import SentencePieceBPETokenizer  # noqa: F401  (a real tokenizer.json)
        from tokenizers import Tokenizer, models, pre_tokenizers, decoders
        vocab = {lm.tokenizer.id_to_piece(i): i for i in range(lm.tokenizer.vocab_size)}
        t = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
        t.pre_tokenizer = pre_tokenizers.Metaspace()
        t.decoder = decoders.Metaspace()
        t.save(str(tj))
    seeds["tokenizer.json"] = tj
    return seeds
