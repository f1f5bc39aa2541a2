"""OpenAI-compatible servers as a backend: the HTTP client and the lane/branch runner."""
