"""``python -m core``: one module per command family."""
