"""``python -m core serve``: the OpenAI-compatible HTTP server over the engine."""
