"""Where LlamaDesk keeps its files, decided in one place.

The data folder holds what the app writes as it runs (conversation history, the model
library's state, downloads, the CPU probe's cache): ``$LLAMADESK_DATA_DIR`` when set (tests,
portable installs), else the platform's user data folder, the same one Qt's
``AppDataLocation`` names for the app "LlamaDesk", so the app, the CLI and ``serve`` share it.

The config folder is where the GUI's ``QSettings(APP_NAME, APP_NAME)`` keeps its file on
Linux (``LlamaDesk.conf``; Qt's own rule, spelled out so tools and tests find it without Qt).

The assets folder (icons, the demo model) is read-only: the checkout's ``assets/``, or in an
installed wheel the copy the build puts in the package (setup.py).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from core.errors import DataFolderError

APP_NAME = "LlamaDesk"
DATA_ENV = "LLAMADESK_DATA_DIR"


def assets_dir() -> Path:
    """Icons and the bundled demo model: ``core/assets`` where a wheel installed them, else
    the checkout's ``assets/`` beside ``core/``."""
    here = Path(__file__).resolve().parent
    installed = here / "assets"
    return installed if installed.is_dir() else here.parent / "assets"


def _xdg(var: str, fallback: Path) -> Path:
    # The XDG spec says relative values are invalid and must be ignored.
    value = os.environ.get(var, "")
    return Path(value) if value and os.path.isabs(value) else fallback


def data_dir() -> Path:
    """``$LLAMADESK_DATA_DIR``, else the platform user data folder for the app."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    return _user_dir(mac=("Library", "Application Support"), xdg="XDG_DATA_HOME", xdg_default=(".local", "share"))


def check_folder(path: Path, what: str = "data folder") -> Path:
    """``path`` when it is a folder or can become one (nothing is created): a file where it
    or one of its parents should be is a DataFolderError saying which."""
    for p in (path, *path.parents):
        if p.is_dir():
            return path
        if p.exists() or p.is_symlink():
            where = "" if p == path else f" (it should hold {path})"
            raise DataFolderError(f"the {what} {p} is a file, not a folder{where}: move the file away, "
                                  f"or set {DATA_ENV} to a folder")
    return path


def config_dir() -> Path:
    """The app's config folder: on Linux the one holding the GUI's settings file (Qt keeps
    them in the registry on Windows and in a plist on macOS; there it is the folder
    for files of the same kind)."""
    return _user_dir(mac=("Library", "Preferences"), xdg="XDG_CONFIG_HOME", xdg_default=(".config",))


def _user_dir(*, mac: tuple[str, ...], xdg: str, xdg_default: tuple[str, ...]) -> Path:
    """The app's folder under the platform's per-user base: roaming AppData on Windows,
    ``~/<mac>`` on macOS, ``$<xdg>`` (else ``~/<xdg_default>``) elsewhere."""
    home = Path.home()
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or home / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = home.joinpath(*mac)
    else:
        base = _xdg(xdg, home.joinpath(*xdg_default))
    return base / APP_NAME
