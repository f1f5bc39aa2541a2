"""LlamaDesk core: LLaMA-family inference in PyTorch. Never imports Qt."""
