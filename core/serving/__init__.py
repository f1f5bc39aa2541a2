"""``python -m core serve``: an OpenAI-compatible HTTP server over one model.

Starlette on uvicorn, in vLLM's shape: :mod:`.scheduler` (one thread owns the engine;
continuous batching), :mod:`.protocol` (parse and validate OpenAI requests),
:mod:`.responses` (shape replies and chunks), :mod:`.state` (the model, engine and
scheduler served), :mod:`.app` (the Starlette handlers over ``app.state``) and
:mod:`.run` (bind, serve forever, or serve on a thread).
"""
