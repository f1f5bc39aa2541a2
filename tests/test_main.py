"""``python3 main.py`` as a process: no display, and what quitting leaves on disk."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Quits as soon as the model has loaded, after writing one conversation, through main.py's own exit path.
_QUIT_AFTER_LOAD = r"""
import sys
sys.path.insert(0, {root!r})
import gui.app, main
from PySide6.QtCore import QTimer
real_run = gui.app.run

def run(factory, argv):
    def make(bridge, a):
        w = factory(bridge, a)
        conv = w.history.create_conversation("kept on quit")
        w.history.add_message(conv.id, role="user", text="hello")
        w.modelReady.connect(lambda info: QTimer.singleShot(0, w.close))
        return w
    return real_run(make, argv)

gui.app.run = run
getattr(main, "exit_now", sys.exit)(main.main(["main.py", {model!r}, "--device", "cpu"]))
"""


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(LLAMADESK_NO_VENV="1", LLAMADESK_DATA_DIR=str(tmp_path / "data"), HOME=str(tmp_path),
               XDG_CONFIG_HOME=str(tmp_path / "config"), **extra)
    return env


def test_without_a_display_it_says_so(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "main.py")], env=_env(tmp_path), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no display found" in lines[0], p.stderr


def test_quit_closes_the_history_with_the_wal_checkpointed(tmp_path, fixtures):
    script = tmp_path / "quit.py"
    script.write_text(_QUIT_AFTER_LOAD.format(root=str(ROOT), model=str(fixtures / "stories260K.gguf")))
    p = subprocess.run([sys.executable, str(script)], env=_env(tmp_path, QT_QPA_PLATFORM="offscreen"),
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    db = tmp_path / "data" / "history.sqlite3"
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, "written pages were left in the WAL"
    # The database file alone (copied without any WAL) holds what was written.
    alone = tmp_path / "alone.sqlite3"
    alone.write_bytes(db.read_bytes())
    titles = [r[0] for r in sqlite3.connect(alone).execute("SELECT title FROM conversations")]
    assert "kept on quit" in titles
    # The settings (the recent model, at least) went to the data folder, not Qt's default place.
    conf = (tmp_path / "data" / "LlamaDesk.conf").read_text()
    assert "stories260K.gguf" in conf
    assert "[window]" in conf and "geometry=@ByteArray(" in conf  # the window's state, for the next start
    assert not (tmp_path / "config" / "LlamaDesk").exists()
