"""Handing memory back to the operating system (Linux with glibc; elsewhere a no-op).

Loading converts memory-mapped weights and a layered prefill dequantizes a layer at a
time: both leave memory resident that the process no longer uses. The loaders and the
engine call these two after such work.
"""
from __future__ import annotations

import ctypes
import mmap
import sys

_MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def release_mapped_pages(ptr: int, nbytes: int) -> None:
    """Drop the resident pages of a read-only, privately mapped file range.

    Converting a memory-mapped tensor (bf16 -> f32, dequantizing) leaves the source
    pages resident next to the converted copy: up to 1.6x the weights at peak. Only for
    memory that is a private file mapping nobody writes: the kernel re-reads dropped
    pages from the file if they are touched again. Partial pages at either end are kept.
    """
    if _libc is None or nbytes <= 0:
        return
    page = mmap.PAGESIZE
    start = -(-ptr // page) * page
    end = (ptr + nbytes) // page * page
    if end > start:
        _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED)


def release_freed_heap() -> None:
    """Hand back to the OS the heap memory that loading freed. glibc keeps freed chunks
    mapped, so the temporaries of packing stayed resident: "RSS after load - RSS before"
    was 1.39x a Q8_0 file's tensor bytes and 1.18x a Q4_0's, 1.07x and 1.06x after this
    (bench/bench_quant.py); the engine calls it after each layer of a layered prefill,
    whose dequantized copies stayed resident the same way. glibc only (musl and other
    platforms: nothing to do)."""
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
