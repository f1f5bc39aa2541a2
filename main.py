"""LlamaDesk: ``python3 main.py [MODEL] [--device auto|cpu|cuda|mps] [--dtype auto|float32|bfloat16|float16|int8|int4]``.

Run directly, it first makes sure of an interpreter with every dependency (tools/bootstrap.py):
the running one when it has them all, else the project's own ``.venv``, built on first use.
Installed (``pip install .``), the ``llamadesk`` command calls :func:`run` directly.

Without MODEL the app opens the last model used, else the bundled demo model, else none
(and says how to open one).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

# core.checkpoints.common.DTYPE_CHOICES, spelled out: importing it would import torch before the
# interpreter is settled (tests/packaging/test_entry_points.py keeps the two equal).
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "int8", "int4")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llamadesk", description="Chat with LLaMA-family models, locally.")
    p.add_argument("model", nargs="?", help="a model folder (Meta or Hugging Face) or a .gguf file")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default=None,
                   help="where to run the model (default: the last choice, else auto)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                   help="weights' data type; int8/int4 quantize at load (default: the last choice, else auto)")
    p.add_argument("--theme", choices=["system", "light", "dark"], default=None,
                   help="colour theme (default: the last choice, else follow the system)")
    args, _qt_args = p.parse_known_args(argv[1:])  # leave Qt's own options (-platform, …) to Qt
    return args


def no_display(env=os.environ, platform: str = sys.platform) -> str | None:
    """Why no window can open (Linux/BSD without X11 or Wayland), else None."""
    if platform in ("win32", "darwin") or env.get("QT_QPA_PLATFORM"):
        return None
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return ("no display found (neither DISPLAY nor WAYLAND_DISPLAY is set): start LlamaDesk from a desktop "
            "session, or over SSH with X forwarding (ssh -X); without a window, use python -m core")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    args = parse_args(argv)
    why = no_display()
    if why and not any(a == "-platform" or a.startswith("-platform=") for a in argv):
        print(f"llamadesk: {why}", file=sys.stderr)
        return 2

    # start-up time: Qt and the GUI load only after the display check (no display: one line at once)
    from gui.app import run

    closers = []  # what must reach the disk before the process ends

    def factory(bridge, _argv):
        # start-up time: the window's modules (widgets, torch through the model dialog) load
        # when gui.app asks for the window, after its event loop and worker are up
        from PySide6.QtWidgets import QApplication

        from gui import theme
        from gui.main_window import MainWindow
        from gui.settings.store import default_settings

        app = QApplication.instance()
        app.setOrganizationName("LlamaDesk")
        settings = default_settings()  # core.paths.config_dir(): follows LLAMADESK_CONFIG_DIR / _DATA_DIR
        mode = args.theme or str(settings.value("ui/theme", "system"))
        theme.apply(app, mode)
        window = MainWindow(bridge=bridge, settings=settings, model=args.model,
                            device=args.device, dtype=args.dtype)
        theme.follow_system(app, window.retheme)
        closers.extend([window.history.close, settings.sync])
        return window

    try:
        return run(factory, argv)
    finally:
        for close in closers:  # after the worker and every task have ended: nothing writes any more
            close()


def run() -> None:
    """The installed ``llamadesk`` command: pip has settled the interpreter already."""
    exit_now(main())


def exit_now(rc: int) -> None:
    """End the process once the app has shut down: skip the interpreter's module teardown,
    which with torch loaded takes seconds and has nothing left to save."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    from tools.bootstrap import ensure

    ensure()  # first run: set up .venv and re-run in it; later runs just re-run in it
    exit_now(main())
