"""LlamaDesk Qt front end."""
