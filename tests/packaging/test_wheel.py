"""``pip install .`` gives a working LlamaDesk (issue 22, item 21): the wheel holds every
subpackage, the icons and the demo model, and its ``llamadesk-cli`` command generates from
the demo model in a fresh environment. Deselect with ``-m "not packaging"``."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from zipfile import ZipFile

import pytest

from tests.helpers import ROOT

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(180)]
SOURCES = ("core", "gui", "assets", "main.py", "pyproject.toml", "setup.py", "README.md")
BUILD = ("import sys; from setuptools import build_meta; "
         "print(build_meta.build_wheel(sys.argv[1]))")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of its sources (the checkout gets no build/)."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if (ROOT / name).is_dir() else {}))
    r = subprocess.run([sys.executable, "-c", BUILD, str(dist)], cwd=src, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return dist / r.stdout.strip().splitlines()[-1]


def test_the_wheel_holds_every_package_the_icons_and_the_demo_model(wheel):
    names = set(ZipFile(wheel).namelist())
    packages = {str(p.parent.relative_to(ROOT)) for top in ("core", "gui") for p in (ROOT / top).rglob("*.py")
                if "__pycache__" not in p.parts}
    assert {p for p in packages if f"{p}/__init__.py" not in names} == set()
    demo = ROOT / "assets" / "models" / "llamadesk-demo"
    assert {f"core/assets/models/llamadesk-demo/{f.name}" for f in demo.iterdir()} <= names
    assert {f"core/assets/icons/{f.name}" for f in (ROOT / "assets" / "icons").iterdir()} <= names
    assert "main.py" in names
    csrc = ROOT / "core" / "model" / "kernels" / "csrc"  # compiled where the wheel is installed
    assert {f"core/model/kernels/csrc/{f.name}" for f in csrc.iterdir()} <= names


def _venv_seeing_ours(where: Path) -> Path:
    """A fresh venv whose extra path is this interpreter's site-packages (the dependencies,
    pip): a .pth line adds it as a plain path, so our editable install's finder stays out."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    py = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "llamadesk-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def test_installed_commands_run_the_demo_model(wheel, tmp_path):
    py = _venv_seeing_ours(tmp_path / "venv")
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--disable-pip-version-check", str(wheel)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    bin_dir = py.parent
    env = {**os.environ, "LLAMADESK_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": ""}
    where = subprocess.run([str(py), "-c", "import core.paths as p; print(p.__file__); print(p.assets_dir())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    module, assets = where.stdout.split()
    assert Path(module).is_relative_to(tmp_path / "venv"), "core came from the checkout, not the wheel"
    demo = Path(assets) / "models" / "llamadesk-demo"
    assert demo.is_dir() and (Path(assets) / "icons" / "app.svg").is_file()
    gen = subprocess.run([str(bin_dir / "llamadesk-cli"), "generate", str(demo), "--prompt", "Once upon a time",
                          "--max-new-tokens", "4", "--device", "cpu", "--seed", "1", "--json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert '"tokens"' in gen.stdout
    app = subprocess.run([str(bin_dir / "llamadesk"), "--help"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert app.returncode == 0 and "int4" in app.stdout, app.stderr[-2000:]
