"""LlamaDesk Qt front end."""
import ctypes
import platform
import sys


def _keep_none_alive() -> None:
    """PySide6 6.12 (its abi3 wheel) returns None from every void method without taking a
    reference. Python 3.12+ never frees None, so nothing happens there; on 3.10 and 3.11
    each call drops None's count by one, and the process aborts ("none_dealloc: deallocating
    None") once it reaches zero: ~5,100 calls streaming one 4,000-token reply, so a long
    chat session would crash. Giving None 2**40 more references makes it as immortal as 3.12
    does (it is a static object and is never freed anyway)."""
    if platform.python_implementation() == "CPython" and sys.version_info < (3, 12):
        ctypes.c_ssize_t.from_address(id(None)).value += 1 << 40


_keep_none_alive()
