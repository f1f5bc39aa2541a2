"""The one thread that owns the model, KV cache and sampler, and its request protocol."""
