"""core.library.hub against the local fake Hub: search, file lists, the memory estimate (checked
against what the loader really holds), recommendations and plain-words errors."""
from __future__ import annotations

import pytest

from core.errors import HubAuthError, HubError, HubNetworkError, HubNotFoundError
from core.library.hub import HubClient
from tests.hubserver import GATED_REPO, GGUF_REPO, HF_REPO
from core.checkpoints import load
from core.model.kv_cache import KVCache
from tests.hubserver import HubRepo


@pytest.fixture
def client(hub_server):
    return HubClient(endpoint=hub_server.url)


def test_search_sorts_filters_and_reports(client):
    by_downloads = client.search("", sort="downloads")
    assert [r.repo_id for r in by_downloads] == [GGUF_REPO, HF_REPO, GATED_REPO]
    assert [r.repo_id for r in client.search("", sort="likes")] == [GATED_REPO, HF_REPO, GGUF_REPO]
    assert [r.repo_id for r in client.search("", sort="last_modified")] == [GATED_REPO, HF_REPO, GGUF_REPO]
    assert [r.repo_id for r in client.search("tiny", formats=("safetensors",))] == [HF_REPO]
    assert [r.repo_id for r in client.search("stories", formats=("gguf",))] == [GGUF_REPO]
    assert client.search("stories", formats=("safetensors",)) == []
    got = {r.repo_id: r for r in by_downloads}
    assert (got[GGUF_REPO].license, got[GGUF_REPO].gated, got[GGUF_REPO].formats) == ("mit", False, ("gguf",))
    assert (got[GATED_REPO].license, got[GATED_REPO].gated) == ("llama3.2", "manual")
    assert got[HF_REPO].downloads == 300 and got[HF_REPO].likes == 40
    with pytest.raises(HubError, match="unknown sort"):
        client.search("x", sort="stars")


def test_search_keeps_llama_architectures(client, hub_server):
    hub_server.add(HubRepo("other/qwen-GGUF", tags=["gguf", "text-generation"], downloads=10**6,
                           architecture="qwen2"))
    hub_server.add(HubRepo("other/bert", tags=["safetensors", "bert"], downloads=10**6, architecture="bert"))
    hub_server.add(HubRepo("other/untagged-llama-GGUF", tags=["gguf"], downloads=5))  # architecture from GGUF
    got = [r.repo_id for r in client.search("", sort="downloads")]
    assert got == [GGUF_REPO, HF_REPO, GATED_REPO, "other/untagged-llama-GGUF"]
    assert {"other/qwen-GGUF", "other/bert"} <= {r.repo_id for r in client.search("", llama_only=False)}
    assert [r.repo_id for r in client.search("", limit=2)] == [GGUF_REPO, HF_REPO]


def test_repo_files_lists_ggufs_and_groups_a_safetensors_folder(client, hub_server):
    files = {f.path: f for f in client.repo_files(GGUF_REPO)}
    assert set(files) == {"stories260K.gguf", "tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf"}  # README.md is not loadable
    spec = hub_server.repos[GGUF_REPO].files["tiny-Q4_K_M.gguf"]
    f = files["tiny-Q4_K_M.gguf"]
    assert (f.kind, f.quant, f.size, f.sha256) == ("gguf", "Q4_K_M", spec.size, spec.sha256)
    [folder] = client.repo_files(HF_REPO)
    assert folder.kind == "hf-folder" and folder.path == ""
    assert set(folder.files) == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    assert folder.size == sum(hub_server.repos[HF_REPO].files[p].size for p in folder.files)


@pytest.mark.parametrize("name", ["stories260K.gguf", "tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf"])
def test_fit_estimate_is_what_the_loader_holds(client, hub_server, name):
    """Weights as held after load (Q4_K/Q8_0 packed, Q6_K requantized into two planes) and the
    KV cache at the context asked for, compared with a real load of the same file."""
    f = next(x for x in client.repo_files(GGUF_REPO) if x.path == name)
    est = client.fit(f, context_length=300, free_ram=1 << 40)
    loaded = load(hub_server.repos[GGUF_REPO].files[name].source, device="cpu", dtype="auto")
    m = loaded.model
    held = sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])
    assert est.weights_bytes == held
    assert est.kv_bytes == KVCache.for_model(m, capacity=300).nbytes()
    assert est.total_bytes == est.weights_bytes + est.kv_bytes and est.fits and est.context_length == 300
    if name == "tiny-Q4_K_M.gguf":
        assert {"Q4_K", "Q6_K"} <= set(loaded.info["tensor_paths"])  # both types were exercised
        # the kernels multiply the file's blocks; without them, two planes: 10 bits a weight
        assert loaded.info["tensor_paths"]["Q6_K"] == (["kernel"] if "kernels" in loaded.info
                                                       and not loaded.info["kernels"].startswith("off")
                                                       else ["int4x2-requantized"])
    tight = client.fit(f, context_length=300, free_ram=est.total_bytes - 1)
    assert not tight.fits and tight.total_bytes == est.total_bytes


def test_fit_of_a_safetensors_folder_and_the_context_cap(client, hub_server):
    [folder] = client.repo_files(HF_REPO)
    est = client.fit(folder, context_length=10**6, free_ram=1 << 40)
    src = hub_server.repos[HF_REPO].files["model.safetensors"].source.parent
    loaded = load(src, device="cpu", dtype="auto")
    assert est.context_length == loaded.args.max_seq_len  # capped at the model's own
    assert est.weights_bytes == sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert est.kv_bytes == KVCache.for_model(loaded.model, capacity=est.context_length).nbytes()


def test_fit_on_a_gpu_counts_bfloat16_and_vram(client):
    f = next(x for x in client.repo_files(GGUF_REPO) if x.path == "stories260K.gguf")
    cpu = client.fit(f, context_length=256, free_ram=1 << 40)
    gpu = client.fit(f, context_length=256, free_ram=1 << 40, free_vram=1000)
    assert (gpu.device, gpu.dtype, gpu.fits) == ("cuda", "bfloat16", False)
    assert gpu.weights_bytes * 2 == cpu.weights_bytes and gpu.kv_bytes * 2 == cpu.kv_bytes  # float32 on CPU here


def test_recommend_picks_the_largest_that_fits(client):
    files = client.repo_files(GGUF_REPO)
    est = {f.path: client.fit(f, context_length=512, free_ram=1 << 40) for f in files}
    need = {p: e.total_bytes for p, e in est.items()}
    roomy = max(need.values()) * 2
    # Everything fits with room: the packed kind (Q4_K_M or Q8_0) of the largest size wins over F32
    pick = client.recommend(files, context_length=512, free_ram=roomy)
    assert pick.path == "tiny-Q4_K_M.gguf"
    # Only the smallest fits
    smallest = min(need, key=need.get)
    pick = client.recommend(files, context_length=512, free_ram=need[smallest])
    assert pick.path == smallest
    assert client.recommend(files, context_length=512, free_ram=need[smallest] - 1) is None


def test_errors_in_plain_words(client, hub_server):
    gated = next(f for f in client.repo_files(GATED_REPO))  # listing a gated repo is public
    with pytest.raises(HubAuthError, match="gated.*token.*HF_TOKEN"):
        client.fit(gated, context_length=128)  # reading its header is not
    assert client.with_token(hub_server.token).fit(gated, context_length=128).weights_bytes > 0
    with pytest.raises(HubAuthError, match="no access"):
        client.with_token("hf_wrong").fit(gated, context_length=128)
    hub_server.remove(GGUF_REPO)
    with pytest.raises(HubNotFoundError, match="does not exist"):
        client.repo_files(GGUF_REPO)
    with pytest.raises(HubError, match="not a repository name"):
        client.repo_files("no slash at all!")
    hub_server.offline = True
    with pytest.raises(HubNetworkError, match="cannot reach"):
        client.repo_files(HF_REPO)


def test_hf_token_from_the_environment_is_used(hub_server, monkeypatch):
    gated = HubClient(hub_server.url).repo_files(GATED_REPO)[0]
    with pytest.raises(HubAuthError):
        HubClient(hub_server.url).fit(gated, context_length=64)
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    est = HubClient(hub_server.url).fit(gated, context_length=64, free_ram=1 << 40)
    assert est.weights_bytes == HubClient(hub_server.url, hub_server.token).fit(gated, context_length=64).weights_bytes
