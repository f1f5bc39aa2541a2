"""Render the main window offscreen mid-conversation and save a PNG (the README's screenshot).

    python tools/screenshot.py [--model PATH] [--theme light|dark] [--out docs/screenshot.png]

Uses the bundled demo model when it exists, else the stories260K test fixture. Runs with
a throwaway history and settings, so nothing of the user's is read or written. The first
reply is generated to the end, the second is caught mid-stream.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Every reply in the picture is generated live by the model: nothing is staged.
FIRST = "Tell me a story about a cat named Tom."
PROMPT = "Tell me a short story about a dog."


def default_model() -> Path | None:
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    if demo.is_dir():
        return demo
    fx = ROOT / "tests" / "fixtures" / "stories260K.gguf"
    return fx if fx.exists() else None


async def _scene(w, model: Path, out: Path, result: dict) -> None:
    """Two live replies, the second caught mid-stream, then grab the window into ``out``."""
    try:
        await w.load_model(str(model))
        if w.info is None:
            raise RuntimeError(f"could not load {model}")
        w.panel.maxTokensSpin.setValue(200)
        w.prompt.set_text(FIRST)
        w.prompt.submit()
        t0 = time.monotonic()
        while (w.busy or not w.chat.stream_text) and time.monotonic() - t0 < 60:
            await asyncio.sleep(0.02)
        while w.busy and time.monotonic() - t0 < 60:
            await asyncio.sleep(0.02)
        w.prompt.set_text(PROMPT)
        w.prompt.submit()
        t0 = time.monotonic()
        while len(w.chat.stream_text) < 160 and w.busy and time.monotonic() - t0 < 30:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # one more frame so the last text is painted
        w.prompt.set_text("What happens next?")
        w.grab().save(str(out))
        result["ok"] = True
        w.stop()
        while w.busy:
            await asyncio.sleep(0.01)
    except Exception as e:  # report, never hang
        print(f"error: {e}", file=sys.stderr)
    finally:
        w._closing = True
        w.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--theme", choices=["light", "dark"], default="light")
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    p.add_argument("--size", default="1200x760")
    args = p.parse_args(argv)
    model = Path(args.model) if args.model else default_model()
    if model is None:
        print("error: no model (no assets/models/llamadesk-demo and no stories260K fixture); pass --model",
              file=sys.stderr)
        return 2
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    tmp = tempfile.mkdtemp(prefix="llamadesk-shot-")
    os.environ["LLAMADESK_DATA_DIR"] = tmp
    width, height = (int(v) for v in args.size.split("x"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"ok": False}

    from gui.app import run

    def factory(bridge, _argv):
        from PySide6.QtCore import QSettings, Qt
        from PySide6.QtWidgets import QApplication

        from core.history.store import History
        from gui import theme
        from gui.main_window import MainWindow

        app = QApplication.instance()
        theme.apply(app, args.theme)
        settings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.IniFormat)
        w = MainWindow(bridge=bridge, history=History(Path(tmp) / "history.sqlite3"), settings=settings,
                       autoload=False)
        w.resize(width, height)

        w._shot_task = asyncio.ensure_future(_scene(w, model, out, result))
        return w

    run(factory, [sys.argv[0]])
    if result["ok"]:
        print(out)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
