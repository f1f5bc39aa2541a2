"""Documents: read attached files and folders (extract), cut them into passages (chunk),
index them in the history store (index, collect), find passages (retrieve) and ground a
question in them with numbered sources (ground). Never imports Qt."""
from core.documents.chunk import Chunk, TokenizerCounter, approx_tokens, chunk_document
from core.documents.collect import IndexJob, Progress, index_collection
from core.documents.extract import Document, DocumentError, Section, extract, kind_of
from core.documents.ground import Grounding, Source, default_budget, ground
from core.documents.index import Blob, Collection, DocumentIndex, Hit
from core.documents.retrieve import MODES, Embedder, Retriever, fastembed_embedder, rrf

__all__ = ["Blob", "Chunk", "Collection", "Document", "DocumentError", "DocumentIndex", "Embedder", "Grounding",
           "Hit", "IndexJob", "MODES", "Progress", "Retriever", "Section", "Source", "TokenizerCounter",
           "approx_tokens", "chunk_document", "default_budget", "extract", "fastembed_embedder", "ground", "index_collection",
           "kind_of", "rrf"]
