"""The packed-layer cache: a second open maps what the first packed, and only a complete,
matching cache is ever used."""
import json
import os

import pytest
import torch

from core.checkpoints import load, pack_cache
from core.cli.main import main
from core.model import pack
from tests.core.checkpoints.util import random_model, write_gguf

IDS = torch.randint(3, 280, (1, 24), generator=torch.Generator().manual_seed(7))


@pytest.fixture
def cached(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(pack_cache.ENV, "1")
    monkeypatch.setenv("LLAMADESK_KERNELS", "0")  # the cache serves the packed path, the kernels' fallback
    return tmp_path


@pytest.fixture
def q4k(cached):
    m = random_model(4, dim=256, n_heads=4, n_kv_heads=2, hidden_dim=512, tie_word_embeddings=True)
    f = cached / "model.gguf"
    write_gguf(f, m, qtypes={n: ("Q4_K" if "w2" not in n else "Q8_0") for n in m.state_dict()})
    return f


def opened(path, **kw):
    """load, then wait for the cache it writes in the background."""
    lm = load(path, **kw)
    pack_cache.flush()
    return lm


def logits(lm):
    with torch.no_grad():
        return lm.model(IDS)


def no_packing(monkeypatch):
    monkeypatch.setattr(pack, "pack_gguf", lambda *a, **k: pytest.fail("packed although a cache was there"))


def test_second_open_maps_the_cache_and_gives_the_same_logits(q4k, monkeypatch):
    first = opened(q4k, device="cpu")
    caches = pack_cache.list_caches()
    assert len(caches) == 1 and caches[0].source == str(q4k.resolve()) and caches[0].bytes > 0
    # the reference: the float path of the same file, which the packed path is tested against
    floats = logits(opened(q4k, device="cpu", dtype="float32"))
    no_packing(monkeypatch)
    second = opened(q4k, device="cpu")
    assert second.info["linear_paths"] == first.info["linear_paths"]
    torch.testing.assert_close(logits(second), logits(first), atol=0, rtol=0)
    assert (logits(second) - floats).abs().max() <= 0.04 * floats.abs().max()


def test_a_half_written_or_damaged_cache_is_never_used(q4k, monkeypatch):
    first = logits(opened(q4k, device="cpu"))
    path = pack_cache.list_caches()[0].path
    size = path.stat().st_size
    with open(path, "r+b") as f:  # a torn write: the tail is gone
        f.truncate(size // 2)
    again = opened(q4k, device="cpu")  # packs again, and says nothing to the user
    torch.testing.assert_close(logits(again), first, atol=0, rtol=0)
    assert path.exists() and path.stat().st_size == size  # rewritten whole
    # a writer killed before its rename leaves only a temporary, which no load reads
    tmp = path.parent / f".{path.name}.999999-1.tmp"
    tmp.write_bytes(b"partial")
    path.unlink()
    calls = []
    real = pack.pack_gguf
    monkeypatch.setattr(pack, "pack_gguf", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.testing.assert_close(logits(opened(q4k, device="cpu")), first, atol=0, rtol=0)
    assert calls and not tmp.exists()  # packed from the file; the dead writer's temporary swept


def test_a_rewritten_file_or_another_layout_does_not_find_the_old_cache(q4k, cached, monkeypatch):
    before = logits(opened(q4k, device="cpu"))
    old = pack_cache.cache_path(q4k)
    m = random_model(5, dim=256, n_heads=4, n_kv_heads=2, hidden_dim=512, tie_word_embeddings=True)
    write_gguf(q4k, m, qtype="Q4_K")  # same name, new weights
    os.utime(q4k, ns=(1, 1))
    assert pack_cache.cache_path(q4k) != old
    new = logits(opened(q4k, device="cpu"))
    floats = logits(opened(q4k, device="cpu", dtype="float32"))
    assert (new - before).abs().max() > 0.1 * floats.abs().max()  # not the old weights
    assert (new - floats).abs().max() <= 0.04 * floats.abs().max()
    # an entry whose type or shape disagrees with the file is stale: the whole cache goes
    entries = torch.load(pack_cache.cache_path(q4k), weights_only=True)
    entries["layers"]["layers.0.attention.wq.weight"]["kind"] = "Q4_0"
    torch.save(entries, pack_cache.cache_path(q4k))
    torch.testing.assert_close(logits(opened(q4k, device="cpu")), new, atol=0, rtol=0)
    assert torch.load(pack_cache.cache_path(q4k), weights_only=True)["layers"][
        "layers.0.attention.wq.weight"]["kind"] == "Q4_K"


def test_off_by_environment_and_for_float_loads(q4k, monkeypatch):
    opened(q4k, device="cpu", dtype="float32")  # nothing stays packed: nothing to cache
    assert pack_cache.list_caches() == []
    monkeypatch.setenv(pack_cache.ENV, "0")
    opened(q4k, device="cpu")
    assert pack_cache.list_caches() == []


def test_caches_are_listed_and_removed(q4k):
    opened(q4k, device="cpu")
    (c,) = pack_cache.list_caches()
    pack_cache.remove(c.path)
    assert pack_cache.list_caches() == [] and not list(c.path.parent.iterdir())


def test_the_cli_lists_and_clears_caches(q4k, capsys):

    opened(q4k, device="cpu")
    assert main(["cache", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["source"] == str(q4k.resolve()) and entry["bytes"] > 0
    assert main(["cache"]) == 0 and str(q4k.resolve()) in capsys.readouterr().out
    assert main(["cache", "--clear"]) == 0
    assert "removed 1" in capsys.readouterr().err and pack_cache.list_caches() == []
