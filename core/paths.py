"""Where LlamaDesk keeps its files, decided in one place.

The data folder holds what the app writes as it runs (conversation history, the model
library's state, downloads, the CPU probe's cache): ``$LLAMADESK_DATA_DIR`` when set (tests,
portable installs), else the platform's user data folder, the same one Qt's
``AppDataLocation`` names for the app "LlamaDesk", so the app, the CLI and ``serve`` share it.

The config folder holds the GUI's settings file (``LlamaDesk.conf``: the window's layout, the
sampling settings and presets, recent models, saved servers): ``$LLAMADESK_CONFIG_DIR`` when set,
else ``$LLAMADESK_DATA_DIR`` (so one data folder isolates everything the app keeps), else the
platform's user config folder (on Linux the file Qt's ``QSettings(APP_NAME, APP_NAME)`` uses, so
settings from before this rule are kept).

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
CONFIG_ENV = "LLAMADESK_CONFIG_DIR"
SETTINGS_FILE = f"{APP_NAME}.conf"


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
    """``$LLAMADESK_CONFIG_DIR``, else ``$LLAMADESK_DATA_DIR``, else the platform user config
    folder for the app (``~/.config/LlamaDesk`` on Linux, where Qt kept the settings before)."""
    for var in (CONFIG_ENV, DATA_ENV):
        env = os.environ.get(var)
        if env:
            return Path(env).expanduser()
    return _user_dir(mac=("Library", "Preferences"), xdg="XDG_CONFIG_HOME", xdg_default=(".config",))


def settings_path() -> Path:
    """The GUI's settings file (INI): everything the app keeps besides the data folder's files."""
    return config_dir() / SETTINGS_FILE


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
