"""The one thread that owns the model, KV cache and sampler, and its request protocol.

worker (Worker: the thread, loads, generation) · protocol (requests and the events it
emits, torch-free: what the GUI and the remote runner build and read).
"""
