"""Compiled CPU kernels on GGUF's own blocks (issue 24; docs/PERFORMANCE.md "Our own kernels").

``csrc/*.c`` (plain C11) are compiled once per machine into a cached shared library
(:mod:`.build`); :mod:`.ops` wraps its symbols for torch tensors. Without a compiler, or
with ``LLAMADESK_KERNELS=0``, :func:`.build.library` is None with a reason and every model
takes the torch path it took before.
"""
