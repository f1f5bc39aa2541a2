"""The model library: scanning headers only, families, last use, deleting only what a model owns."""
from __future__ import annotations

import json
import shutil
import threading

import pytest

from core.library import library
from core.library.library import LibraryState, delete, family_of, quant_from_name, record_used, scan
from tests.core.checkpoints.util import random_model, write_gguf, write_tiny_tokenizer
from core.checkpoints import load, pack_cache
from tests.helpers import ROOT, tiny_hf


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "data"))
    return LibraryState()


def hf_config(**kw):
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=160,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=96,
               max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0, torch_dtype="bfloat16")
    cfg.update(kw)
    return cfg


def write_hf_stub(folder, cfg):
    """config.json plus a 'weights' file that is not safetensors at all: the scan must not read it."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").write_bytes(b"\xff" * 1000)
    return folder


def test_default_models_folder_is_in_the_data_folder(state, tmp_path):
    assert library.default_models_folder() == tmp_path / "data" / "models"
    assert state.folders() == [tmp_path / "data" / "models"]


def test_gguf_entry_matches_what_the_loader_builds(fixtures, state):
    [e] = scan([fixtures], state=state)
    loaded = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    assert (e.format, e.name, e.error) == ("gguf", "stories260K", None)
    assert e.params == loaded.info["parameters"]
    assert e.context_length == loaded.info["context_length"]
    assert e.size_bytes == (fixtures / "stories260K.gguf").stat().st_size
    assert e.quant == "F32"
    assert e.family == "Llama-compatible"  # 512-token vocabulary: no Meta release


def test_quantized_gguf_names_its_type(tmp_path, state):
    f = tmp_path / "m" / "tiny.gguf"
    f.parent.mkdir()
    write_gguf(f, random_model(vocab_size=288), qtype="Q8_0")
    [e] = scan([tmp_path / "m"], state=state)
    assert e.quant == "Q8_0" and e.error is None


def test_hf_families_from_config(tmp_path, state):
    llama3 = dict(vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192)
    scaled = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192)
    cases = {
        "l2": (dict(vocab_size=32000, max_position_embeddings=4096), "Llama 2"),
        "l3": (llama3, "Llama 3"),
        "l31": ({**llama3, "max_position_embeddings": 131072, "rope_scaling": {**scaled, "factor": 8.0}}, "Llama 3.1"),
        "l32": ({**llama3, "max_position_embeddings": 131072, "rope_scaling": {**scaled, "factor": 32.0},
                 "tie_word_embeddings": True}, "Llama 3.2"),
        "codellama": (dict(vocab_size=32016, rope_theta=1e6, max_position_embeddings=16384), "Llama-compatible"),
    }
    for name, (kw, _) in cases.items():
        write_hf_stub(tmp_path / "lib" / name, hf_config(**kw))
    got = {e.name: e for e in scan([tmp_path / "lib"], state=state)}
    assert {n: e.family for n, e in got.items()} == {n: fam for n, (_, fam) in cases.items()}
    assert got["l31"].context_length == 131072 and got["l31"].quant == "BF16"
    assert all(e.error is None and e.format == "hf" for e in got.values())


def test_hf_params_match_transformers(tmp_path, state):
    hf = tiny_hf(num_key_value_heads=2)
    hf.save_pretrained(tmp_path / "lib" / "tiny", safe_serialization=True)
    [e] = scan([tmp_path / "lib"], state=state)
    assert e.params == hf.num_parameters()
    assert e.context_length == hf.config.max_position_embeddings


def test_meta_folder_entry(state):
    [e] = scan([ROOT / "assets" / "models"], state=state)
    loaded = load(e.path, device="cpu", dtype="float32")
    assert (e.format, e.name, e.quant) == ("meta", "llamadesk-demo", None)
    assert (e.params, e.context_length) == (loaded.info["parameters"], loaded.info["context_length"])


def test_family_rules():
    assert family_of(vocab_size=128256, rope_theta=5e5, scaling_factor=None, scaled=True, dim=2048) == "Llama 3.2"
    assert family_of(vocab_size=128256, rope_theta=5e5, scaling_factor=None, scaled=True, dim=4096) == "Llama 3.1"
    assert family_of(vocab_size=32000, rope_theta=1e4, scaling_factor=None) == "Llama 2"
    assert family_of(vocab_size=None, rope_theta=None, scaling_factor=None) == "Llama-compatible"


def test_quant_from_file_names():
    assert quant_from_name("Llama-3.2-1B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_from_name("llama-2-7b.Q8_0.gguf") == "Q8_0"
    assert quant_from_name("model-IQ3_XS.gguf") == "IQ3_XS"
    assert quant_from_name("tinyllama-f16.gguf") == "F16"
    assert quant_from_name("stories260K.gguf") is None


def test_broken_files_are_listed_with_an_error_and_partials_are_skipped(tmp_path, state, fixtures):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "cut.gguf").write_bytes((fixtures / "stories260K.gguf").read_bytes()[:1_000_000])
    (lib / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 10)
    (lib / "half.gguf.part").write_bytes(b"GGUF")
    (lib / ".downloads").mkdir()
    (lib / ".downloads" / "x.gguf").write_bytes(b"GGUF")
    write_hf_stub(lib / "bad", {"hidden_size": "big"})
    got = {e.name: e for e in scan([lib], state=state)}
    assert set(got) == {"broken", "bad", "cut"}
    assert "header" in got["broken"].error and got["broken"].params is None
    assert "truncated" in got["cut"].error
    assert got["bad"].error


def test_record_used_persists_and_orders(tmp_path, fixtures, state):
    lib = tmp_path / "lib"
    write_hf_stub(lib / "a", hf_config())
    write_hf_stub(lib / "b", hf_config())
    record_used(lib / "b", when=1000.0)
    record_used(lib / "a", when=2000.0)
    again = LibraryState()  # a new process would read the same file
    assert [e.name for e in scan([lib], state=again)] == ["a", "b"]
    assert [e.last_used for e in scan([lib], state=again)] == [2000.0, 1000.0]
    assert [p.name for p in state.path.parent.iterdir()] == ["library.json"]  # no temp file left


def test_damaged_state_file_reads_as_empty(state, tmp_path):
    state.path.parent.mkdir(parents=True)
    state.path.write_text("{not json")
    assert state.last_used() == {}
    record_used(tmp_path / "x", when=5.0)
    assert list(state.last_used().values()) == [5.0]


def test_folders_setting(state, tmp_path):
    state.set_models_folder(tmp_path / "mine")
    state.set_extra_folders([tmp_path / "more", tmp_path / "mine"])
    assert state.folders() == [tmp_path / "mine", tmp_path / "more"]
    state.set_models_folder(None)
    assert state.folders()[0] == library.default_models_folder()


def test_delete_removes_only_what_the_entry_owns(tmp_path, state):
    lib = tmp_path / "lib"
    folder = write_hf_stub(lib / "tiny", hf_config())
    write_tiny_tokenizer(folder)
    (folder / "my notes.txt").write_text("keep me")
    g = lib / "q" / "m.gguf"
    g.parent.mkdir()
    write_gguf(g, random_model())
    (lib / "q" / "other.bin").write_bytes(b"x")
    entries = {e.name: e for e in scan([lib], state=state)}
    record_used(folder)
    removed = delete(entries["tiny"], state=state)
    assert sorted(p.name for p in removed) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert [p.name for p in folder.iterdir()] == ["my notes.txt"]
    assert state.last_used() == {}
    delete(entries["m"], state=state)
    assert [p.name for p in (lib / "q").iterdir()] == ["other.bin"]
    (lib / "q" / "other.bin").unlink()
    write_gguf(g, random_model())
    delete(scan([lib], state=state)[0], state=state)
    assert not (lib / "q").exists()  # a folder left empty goes too
    assert lib.is_dir()  # but never a library folder itself: lib is scanned, not owned
    assert [e.name for e in scan([lib], state=state)] == []


def test_cancelled_scan_returns_early(tmp_path, state):
    for i in range(3):
        write_hf_stub(tmp_path / "lib" / f"m{i}", hf_config())
    stop = threading.Event()
    stop.set()
    assert scan([tmp_path / "lib"], cancel=stop, state=state) == []
    assert len(scan([tmp_path / "lib"], state=state)) == 3


def test_generic_names_take_the_repository_or_the_folder(tmp_path, state, fixtures):
    lib = tmp_path / "lib"
    write_hf_stub(lib / "Llama-3.2-1B" / "hf", hf_config())
    meta = lib / "Llama-3.2-1B" / "original"  # how a meta-llama repository ships its Meta checkpoint
    meta.mkdir(parents=True)
    (meta / "params.json").write_text(json.dumps(dict(dim=64, n_layers=2, n_heads=4, vocab_size=96)))
    (meta / "consolidated.00.pth").write_bytes(b"\0" * 10)
    for rel in ("TinyStories-GGUF/model.gguf", "TinyStories-GGUF/ggml-model-Q4_K_M.gguf", "stories-q8.gguf",
                "cache/models--someone--Tiny-Llama/snapshots/" + "ab12" * 10 + "/model.gguf",
                "someone/Downloaded/model.gguf"):
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(fixtures / "stories260K.gguf", lib / rel)
    state.record_source(lib / "someone" / "Downloaded" / "model.gguf", "someone/From-The-Hub")
    got = sorted((e.name, e.format, str(e.location.relative_to(lib))) for e in scan([lib], state=state))
    assert got == [("Llama-3.2-1B", "hf", "Llama-3.2-1B"), ("Llama-3.2-1B", "meta", "Llama-3.2-1B"),
                   ("TinyStories-GGUF", "gguf", "TinyStories-GGUF"), ("TinyStories-GGUF", "gguf", "TinyStories-GGUF"),
                   ("someone/From-The-Hub", "gguf", "someone/Downloaded"),
                   ("someone/Tiny-Llama", "gguf", "cache/models--someone--Tiny-Llama/snapshots/" + "ab12" * 10),
                   ("stories-q8", "gguf", ".")]
    assert library.read_entry(lib / "TinyStories-GGUF" / "model.gguf").name == "TinyStories-GGUF"
    assert library.model_name(tmp_path / "models" / "model.gguf") == "model"  # nothing better: the file's own
    assert json.loads(json.dumps(scan([lib / "TinyStories-GGUF"], state=state)[0].to_json()))["location"] == \
        str(lib / "TinyStories-GGUF")


def test_deleting_a_gguf_removes_its_fast_open_cache(tmp_path, state, monkeypatch):
    monkeypatch.setenv(pack_cache.ENV, "1")
    monkeypatch.setenv("LLAMADESK_KERNELS", "0")  # Q4_K packed (with kernels it needs no cache)
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(state.path.parent))
    g = tmp_path / "lib" / "q4.gguf"
    g.parent.mkdir()
    write_gguf(g, random_model(dim=256, n_heads=4, n_kv_heads=2, hidden_dim=512), qtype="Q4_K")
    other = tmp_path / "lib" / "other.gguf"
    write_gguf(other, random_model(dim=256, n_heads=4, n_kv_heads=2, hidden_dim=512), qtype="Q4_0")
    load(g, device="cpu")
    load(other, device="cpu")
    pack_cache.flush()
    assert len(pack_cache.list_caches()) == 2
    removed = delete(next(e for e in scan([tmp_path / "lib"], state=state) if e.path == g), state=state)
    assert any(p.name.endswith(pack_cache.SUFFIX) for p in removed)
    assert [c.source for c in pack_cache.list_caches()] == [str(other.resolve())]  # the other model's stays
