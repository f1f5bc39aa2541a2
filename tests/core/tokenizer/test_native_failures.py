"""A tokenizer.json whose native code fails (a Rust panic) is refused at load, in one line,
with the panic's own report kept off stderr (issue 22, item 23)."""
import os

import pytest
from tokenizers import Tokenizer
from tokenizers.models import BPE
from tokenizers.normalizers import BertNormalizer, Replace, Sequence

from core.cli.main import main
from core.errors import TokenizerError
from core.tokenizer import load_tokenizer
from core.tokenizer.base import native_call


@pytest.fixture
def panicking(tmp_path):
    """A tokenizer.json that loads in `tokenizers` but panics on every text: Replace with an
    empty pattern before BertNormalizer indexes past the end of the normalized string."""
    tok = Tokenizer(BPE({"<unk>": 0, "a": 1}, [], unk_token="<unk>"))
    tok.normalizer = Sequence([Replace("", " "), BertNormalizer()])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    with pytest.raises(BaseException, match="index out of bounds"):  # the library itself panics
        Tokenizer.from_file(str(path)).encode("ab")
    return path


def test_a_tokenizer_that_cannot_encode_is_refused_at_load_in_one_line(panicking, capfd):
    capfd.readouterr()
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(panicking)
    msg = str(err.value)
    assert str(panicking) in msg and "cannot encode" in msg and "\n" not in msg
    out, errtext = capfd.readouterr()
    assert "panicked" not in errtext and "backtrace" not in errtext and errtext == ""


def test_the_cli_says_one_line_and_exits_2(panicking, capfd):
    capfd.readouterr()
    assert main(["tokenize", str(panicking), "--text", "hello"]) == 2
    out, errtext = capfd.readouterr()
    lines = errtext.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(panicking) in lines[0]
    assert out == ""


def test_quiet_calls_pass_other_output_on_and_drop_a_failures_report(capfd):
    capfd.readouterr()
    os.write(2, b"before\n")
    assert native_call(lambda: os.write(2, b"kept\n") and 7, "x", quiet=True) == 7

    def fails():
        os.write(2, b"thread 'x' panicked at somewhere\n")
        raise RuntimeError("boom")
    with pytest.raises(TokenizerError, match="boom"):
        native_call(fails, "it failed", quiet=True)
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\nkept\nafter\n"
