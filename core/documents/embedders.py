"""The embedding models dense and hybrid retrieval can use, by name.

``wordllama``: WordLlama's ``l2_supercat`` (256 dimensions), static token embeddings
distilled from LLaMA 2's embedding table and mean-pooled: its weights (16 MB) ship inside
its PyPI wheel, so it works with no download and no torch, and embeds thousands of
passages a second on a CPU. ``bge-small``: BAAI/bge-small-en-v1.5 through fastembed,
only when the user has downloaded it (nothing is fetched here).

Both are optional dependencies: a name whose package or files are missing is refused with
a :class:`DocumentError` that says what to install.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from core.documents.extract import DocumentError
from core.documents.retrieve import Embedder, fastembed_embedder

__all__ = ["EMBEDDERS", "DEFAULT_EMBEDDER", "load_embedder", "wordllama_embedder"]

#: name -> what a person is told about it (menus, --help)
EMBEDDERS = {
    "wordllama": "WordLlama l2_supercat (256 dims, ships with the wordllama package)",
    "bge-small": "BAAI/bge-small-en-v1.5 through fastembed (a model you downloaded)",
}
DEFAULT_EMBEDDER = "wordllama"
_loaded: dict[str, Embedder] = {}
_lock = threading.Lock()


class _WordLlama:
    def __init__(self, model, config: str, dim: int):
        self.model, self.name = model, f"wordllama:{config}_{dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.model.embed(list(texts), norm=True), dtype=np.float32)


def wordllama_embedder(config: str = "l2_supercat", dim: int = 256) -> Embedder | None:
    """WordLlama from the weights inside its package, or None (not installed, files missing)."""
    try:
        import wordllama  # why: an optional dependency (2 s to load: only when dense is used)
        from wordllama import WordLlama
    except ImportError:
        return None
    # The wheel holds weights/ and tokenizers/ beside the code: used as the cache folder, its
    # own files are found and nothing is downloaded.
    try:
        model = WordLlama.load(config, cache_dir=Path(wordllama.__file__).parent, dim=dim, disable_download=True)
    except (OSError, ValueError):
        return None
    return _WordLlama(model, config, dim)


def load_embedder(name: str = DEFAULT_EMBEDDER) -> Embedder:
    """The embedding model ``name`` (loaded once per process; thread-safe). Raises
    DocumentError naming what is missing."""
    if name not in EMBEDDERS:
        raise DocumentError(f"the embedding model must be one of {', '.join(EMBEDDERS)}, got {name!r}")
    with _lock:
        have = _loaded.get(name)
        if have is None:
            have = wordllama_embedder() if name == "wordllama" else fastembed_embedder()
            if have is None:
                raise DocumentError(
                    "dense retrieval with WordLlama needs the wordllama package (pip install wordllama)"
                    if name == "wordllama" else "dense retrieval with bge-small needs an embedding model: install "
                    "fastembed and download BAAI/bge-small-en-v1.5 (nothing is fetched here)")
            _loaded[name] = have
        return have
