"""The transformer and what runs it: ModelArgs + Transformer, the KV cache, packed
linear layers, the static/compiled decode step, the CPU thread plan, heap release. No I/O."""
