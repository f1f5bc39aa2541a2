"""LlamaDesk: ``python3 main.py [MODEL] [--device auto|cpu|cuda|mps] [--dtype auto|float32|bfloat16|float16]``.

Run directly, it sets up and uses the project's own ``.venv`` first (tools/bootstrap.py).

Without MODEL the app opens the last model used, else the bundled demo model, else none
(and says how to open one).
"""
from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llamadesk", description="Chat with LLaMA-family models, locally.")
    p.add_argument("model", nargs="?", help="a model folder (Meta or Hugging Face) or a .gguf file")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], default=None,
                   help="where to run the model (default: the last choice, else auto)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default=None,
                   help="weights' data type (default: the last choice, else auto)")
    p.add_argument("--theme", choices=["system", "light", "dark"], default=None,
                   help="colour theme (default: the last choice, else follow the system)")
    args, _qt_args = p.parse_known_args(argv[1:])  # leave Qt's own options (-platform, …) to Qt
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    args = parse_args(argv)

    from gui.app import run

    def factory(bridge, _argv):
        from PySide6.QtCore import QSettings
        from PySide6.QtWidgets import QApplication

        from gui import theme
        from gui.main_window import MainWindow

        app = QApplication.instance()
        app.setOrganizationName("LlamaDesk")
        settings = QSettings("LlamaDesk", "LlamaDesk")
        mode = args.theme or str(settings.value("ui/theme", "system"))
        theme.apply(app, mode)
        window = MainWindow(bridge=bridge, settings=settings, model=args.model,
                            device=args.device, dtype=args.dtype)
        theme.follow_system(app, window.retheme)
        return window

    return run(factory, argv)


if __name__ == "__main__":
    from tools.bootstrap import ensure

    ensure()  # first run: set up .venv and re-run in it; later runs just re-run in it
    sys.exit(main())
