"""How a command ends, torch-free (``python -m core tools`` runs on this alone): user
errors as one line on stderr and exit status 2, Ctrl+C as 130, a closed pipe quietly, and
stdout written as UTF-8."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from core.errors import LlamaDeskError

__all__ = ["UsageError", "Parser", "guarded", "write_stdout"]


class UsageError(LlamaDeskError):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage too)
        raise UsageError(f"{self.prog}: {message}")


def guarded(command: Callable[[], int]) -> int:
    """``command()``'s exit status, what goes wrong said in one line."""
    try:
        return command()
    except LlamaDeskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:
        print("error: out of memory while loading or running the model", file=sys.stderr)
        return 2
    except RuntimeError as e:  # torch's allocator reports running out of memory this way
        if "memory" not in str(e).lower():
            raise
        print("error: out of memory while loading or running the model", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2


def write_stdout(text: str) -> None:
    """``text`` on stdout as UTF-8, with a file name that is not UTF-8 (lone surrogates
    after Python's decoding) written as the bytes it is."""
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
