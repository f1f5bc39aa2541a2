"""The model library window: local models, the Hub browser, downloads."""
