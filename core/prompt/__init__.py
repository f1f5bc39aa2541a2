"""From messages to prompt text: chat formats (Llama 3 / Llama 2 / raw) and fitting to the context."""
