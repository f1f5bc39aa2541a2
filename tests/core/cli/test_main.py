"""`python -m core`: the parser and dispatch; every user error exits 2 with one line."""
import subprocess
import sys

import pytest

from tests.core.cli.helpers import run_cli
from tests.helpers import ROOT


@pytest.mark.parametrize("argv,needle", [
    (["generate", "{m}", "--prompt", "x", "--temperature", "-0.5"], "temperature"),
    (["generate", "{m}", "--prompt", "x", "--top-p", "1.5"], "top_p"),
    (["generate", "{m}", "--prompt", "x", "--max-new-tokens", "0"], "max-new-tokens"),
    (["generate", "/nonexistent/model", "--prompt", "x"], "no such file"),
    (["generate", "{m}"], "--prompt"),
    (["compare", "{m}", "--prompt", "x", "--lane", "warmth=3"], "warmth"),
    (["info", "{m}/params.json"], "not a GGUF"),
    (["tokenize", "/nonexistent", "--text", "x"], "no such file"),
])
def test_user_errors_exit_2_with_one_line(capsys, tiny_meta_dir, argv, needle):
    rc, out, err = run_cli(capsys, *[a.replace("{m}", str(tiny_meta_dir)) for a in argv])
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert "Traceback" not in err


def test_broken_weights_exit_2_in_a_real_process(tmp_path, tiny_meta_dir):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("params.json", "tokenizer.model"):
        (bad / f).write_bytes((tiny_meta_dir / f).read_bytes())
    (bad / "consolidated.00.pth").write_bytes((tiny_meta_dir / "consolidated.00.pth").read_bytes()[:5000])
    p = subprocess.run([sys.executable, "-m", "core", "generate", str(bad), "--prompt", "x"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "consolidated.00.pth" in p.stderr
    assert "Traceback" not in p.stderr
