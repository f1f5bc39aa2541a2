"""The app's command line as the README states it (issue 22, item 21)."""
import re
from pathlib import Path

import main
from core.checkpoints.common import DTYPE_CHOICES
from core.paths import assets_dir

ROOT = Path(__file__).resolve().parents[2]


def test_main_accepts_every_dtype_the_engine_loads():
    assert main.DTYPE_CHOICES == DTYPE_CHOICES
    assert main.parse_args(["main.py", "--dtype", "int4"]).dtype == "int4"


def test_readme_usage_line_matches_main():
    usage = next(line for line in (ROOT / "README.md").read_text().splitlines()
                 if line.startswith("`python main.py [MODEL]"))
    assert re.search(r"--dtype ([a-z0-9|]+)\]", usage).group(1).split("|") == list(main.DTYPE_CHOICES)


def test_a_checkout_reads_its_assets_in_place():
    assert assets_dir() == ROOT / "assets"
