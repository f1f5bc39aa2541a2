"""Tools the model can call: declarations, calls, results (``spec``), and the providers that
run them (built-in tools, MCP servers). Torch-free and Qt-free: the prompt formats, the
server's protocol, the CLI and the GUI all import these types."""
