"""The fake Hub the library tests run against answers as huggingface_hub expects."""
from __future__ import annotations

import hashlib

import httpx
import pytest

from tests.hubserver import GATED_REPO, GGUF_REPO, HF_REPO


def test_huggingface_hub_reads_the_fake_hub(hub_server, fixtures):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_server.url, token=False)
    found = [m.id for m in api.list_models(search="llama", filter=["gguf"], sort="downloads", limit=10)]
    assert found == [GGUF_REPO, GATED_REPO]  # 1500 downloads before 90; the HF repo has no gguf tag
    [info] = api.get_paths_info(GGUF_REPO, ["stories260K.gguf"])
    want = hashlib.sha256((fixtures / "stories260K.gguf").read_bytes()).hexdigest()
    assert (info.size, info.lfs.sha256) == ((fixtures / "stories260K.gguf").stat().st_size, want)
    names = {s.rfilename for s in api.model_info(HF_REPO, files_metadata=True).siblings}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names


def test_ranges_cuts_and_counts(hub_server, fixtures):
    data = (fixtures / "stories260K.gguf").read_bytes()
    url = hub_server.file_url(GGUF_REPO, "stories260K.gguf")
    r = httpx.get(url, headers={"Range": "bytes=100-199"})
    assert (r.status_code, r.content, r.headers["Content-Range"]) == (206, data[100:200], f"bytes 100-199/{len(data)}")
    hub_server.cut_after[(GGUF_REPO, "stories260K.gguf")] = 5000
    with pytest.raises(httpx.HTTPError):
        httpx.get(url)
    assert hub_server.sent(GGUF_REPO, "stories260K.gguf") == 100 + 5000
    assert httpx.get(url).content == data  # the cut happens once


def test_gated_repo_wants_the_token(hub_server):
    url = hub_server.file_url(GATED_REPO, "stories260K-gated.gguf")
    r = httpx.head(url)
    assert (r.status_code, r.headers["X-Error-Code"]) == (401, "GatedRepo")
    assert httpx.head(url, headers={"Authorization": f"Bearer {hub_server.token}"}).status_code == 200
