"""Build hook beside pyproject.toml (which holds everything else): the wheel carries the
checkout's ``assets/`` (icons, the demo model) as ``core/assets``, where
``core.paths.assets_dir`` finds them once installed. A checkout reads ``assets/`` in place."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ASSETS = Path(__file__).resolve().parent / "assets"


class BuildPyWithAssets(build_py):
    def run(self):
        super().run()
        shutil.copytree(ASSETS, Path(self.build_lib) / "core" / "assets", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithAssets})
