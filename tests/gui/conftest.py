"""GUI tests' shared fixtures. Their Qt garbage is collected on the UI thread after each test
by tests/conftest.py (_collect_on_the_main_thread), once, not again here."""
import pytest


@pytest.fixture(scope="session")
def random_draft(fixtures, tmp_path_factory):
    """A small random model with the stories260K fixture's own tokenizer, written as a GGUF
    file: a draft model whose drafts are mostly wrong (the tokens stay plain decoding's)."""
    import torch

    from core.checkpoints import load
    from core.checkpoints.common import LoadedModel
    from core.checkpoints.gguf_write import save_gguf
    from core.model.transformer import Transformer
    from core.model.args import ModelArgs
    story = load(fixtures / "stories260K.gguf", device="cpu", dtype="float32")
    torch.manual_seed(3)
    model = Transformer(ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=story.args.vocab_size,
                                  multiple_of=16, max_seq_len=512)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.15)
    path = tmp_path_factory.mktemp("draft") / "random-draft.gguf"
    save_gguf(LoadedModel(model, story.tokenizer, story.chat_format, model.args, story.stop_ids,
                          {**story.info, "name": "random draft"}), path, "F32")
    return path
