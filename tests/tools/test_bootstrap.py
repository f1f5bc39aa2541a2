"""The README's set-up (tools/bootstrap.py): where PyTorch comes from, and when to rebuild."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import bootstrap
from tools.bootstrap import CPU_INDEX, torch_plan

ROOT = Path(__file__).resolve().parents[2]


def _plan(**kw):
    return [args for _, args in torch_plan(**kw)]


def test_linux_without_nvidia_prefers_a_cpu_build():
    plan = _plan(env={}, platform="linux", nvidia=False, reachable=lambda url: True)
    assert plan == [["--no-index"], ["--index-url", CPU_INDEX], []]


def test_unreachable_cpu_index_falls_back_to_the_default_index(capsys):
    plan = _plan(env={}, platform="linux", nvidia=False, reachable=lambda url: False)
    assert plan == [["--no-index"], []]
    assert "did not answer" in capsys.readouterr().err


def test_cpu_index_is_probed_only_after_the_local_wheel_failed():
    probed = []
    plan = torch_plan(env={}, platform="linux", nvidia=False, reachable=lambda url: probed.append(url) or True)
    assert next(plan) == ("from a wheel pip finds locally", ["--no-index"]) and probed == []
    next(plan)
    assert probed == [CPU_INDEX]


def test_gpu_machines_and_other_platforms_use_the_default_index():
    never = lambda url: (_ for _ in ()).throw(AssertionError("probed"))  # noqa: E731
    assert _plan(env={}, platform="linux", nvidia=True, reachable=never) == [["--no-index"], []]
    assert _plan(env={}, platform="darwin", nvidia=False, reachable=never) == [["--no-index"], []]
    assert _plan(env={}, platform="win32", nvidia=False, reachable=never) == [["--no-index"], []]


def test_an_explicit_index_is_the_only_source():
    url = "https://download.pytorch.org/whl/cu128"
    assert _plan(env={"LLAMADESK_TORCH_INDEX": url}, platform="linux", nvidia=False) == [["--index-url", url]]


def test_stamp_decides_whether_to_rebuild(tmp_path):
    root, venv = tmp_path / "repo", tmp_path / "repo" / ".venv"
    (root).mkdir()
    (root / "pyproject.toml").write_text("[project]\nname='x'\n")
    py = bootstrap.venv_python(venv)
    py.parent.mkdir(parents=True)
    shutil.copy(__file__, py)  # any file stands in for the interpreter
    assert not bootstrap.up_to_date((), venv, root)  # no stamp yet
    (venv / bootstrap.STAMP_NAME).write_text(json.dumps({"pyproject": bootstrap.fingerprint(root), "extras": []}))
    assert bootstrap.up_to_date((), venv, root)
    assert not bootstrap.up_to_date(("test",), venv, root)  # the test extras are not in it
    (root / "pyproject.toml").write_text("[project]\nname='x'\ndependencies=['y']\n")
    assert not bootstrap.up_to_date((), venv, root)  # pyproject changed


# --- which interpreter runs: this one when it has everything, else .venv (issue 22, item 19) ---

PYPROJECT = """[project]
name = "x"
dependencies = ["torch>=2.5", "PySide6-Essentials>=6.10  ", "tiktoken[blobfile]>=0.7"]
[project.optional-dependencies]
test = ["pytest>=8,<10", "psutil"]
"""


def _repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root, root / ".venv"


def _metadata(**versions):
    """A fake importlib.metadata.version over ``versions`` (names as pip spells them)."""
    def version_of(name):
        key = name.lower().replace("-", "_")
        for have, v in versions.items():
            if have.lower() == key:
                return v
        raise bootstrap.importlib.metadata.PackageNotFoundError(name)
    return version_of


FULL = dict(torch="2.13.0+cu128", pyside6_essentials="6.10.1", tiktoken="0.9.0")


def test_requirements_read_pyproject_and_its_extras(tmp_path):
    root, _ = _repo(tmp_path)
    assert bootstrap.requirements((), root) == ["torch>=2.5", "PySide6-Essentials>=6.10  ", "tiktoken[blobfile]>=0.7"]
    assert bootstrap.requirements(("test",), root)[-2:] == ["pytest>=8,<10", "psutil"]


def test_versions_compare_as_pep_440_orders_them():
    holds = bootstrap._clause_holds  # noqa: SLF001  — the matching rule itself, case by case
    assert holds("2.13.0+cpu", ">=", "2.5") and not holds("2.4.1", ">=", "2.5")
    assert holds("6.10", ">=", "6.10.0") and not holds("1.0rc1", ">=", "1.0")
    assert holds("1.0.post1", ">", "1.0") and holds("1.0.dev3", "<", "1.0a1")
    assert holds("1.4.5", "~=", "1.4.2") and not holds("1.5", "~=", "1.4.2")
    assert holds("2.1.3", "==", "2.*") and not holds("3.0", "==", "2.*") and not holds("2.0", "!=", "2.0.*")
    assert not holds("not-a-version", ">=", "1")


def test_unmet_names_what_is_missing_or_too_old():
    reqs = ["torch>=2.5", "PySide6-Essentials>=6.10", "tiktoken[blobfile]>=0.7", "pytest>=8,<10"]
    have = _metadata(torch="2.4.0", pyside6_essentials="6.10.0", pytest="10.1")
    assert bootstrap.unmet(reqs, have) == ["torch 2.4.0 (needs >=2.5)", "tiktoken (not installed)",
                                           "pytest 10.1 (needs >=8,<10)"]
    assert bootstrap.unmet(reqs[:3], _metadata(**FULL)) == []


def test_a_satisfying_interpreter_is_used_as_it_is(tmp_path):
    root, venv = _repo(tmp_path)
    how, line = bootstrap.decide((), venv, root, _metadata(**FULL))
    assert how == "here" and "no .venv needed" in line and not venv.exists()
    # the test extras are checked too
    how, line = bootstrap.decide(("test",), venv, root, _metadata(**FULL))
    assert how == "build" and "pytest (not installed)" in line and "psutil" in line
    how, _ = bootstrap.decide(("test",), venv, root, _metadata(**FULL, pytest="8.3", psutil="7.0"))
    assert how == "here"


def test_a_bare_interpreter_builds_the_venv(tmp_path):
    root, venv = _repo(tmp_path)
    how, line = bootstrap.decide((), venv, root, _metadata())
    assert how == "build" and line.startswith(f"setting up {venv}") and "torch (not installed)" in line


def test_an_up_to_date_venv_keeps_being_used(tmp_path):
    root, venv = _repo(tmp_path)
    py = bootstrap.venv_python(venv)
    py.parent.mkdir(parents=True)
    shutil.copy(__file__, py)
    (venv / bootstrap.STAMP_NAME).write_text(json.dumps({"pyproject": bootstrap.fingerprint(root), "extras": []}))
    assert bootstrap.decide((), venv, root, _metadata(**FULL)) == ("venv", f"using {venv}")
    assert bootstrap.decide(("test",), venv, root, _metadata(**FULL))[0] == "build"  # no test extras in it


def test_ensure_returns_in_a_satisfying_interpreter_and_says_so_once(monkeypatch, capsys):
    monkeypatch.delenv("LLAMADESK_NO_VENV", raising=False)
    monkeypatch.setattr(bootstrap, "inside", lambda: False)
    monkeypatch.setattr(bootstrap, "decide", lambda extras: ("here", "using this Python"))
    monkeypatch.setattr(bootstrap, "build", lambda extras: pytest.fail("built a venv"))
    monkeypatch.setattr(bootstrap.os, "execv", lambda *a: pytest.fail("re-ran elsewhere"))
    bootstrap.ensure(("test",), ["-m", "tests"])
    assert capsys.readouterr().err == "LlamaDesk: using this Python\n"


def test_ensure_builds_then_reruns_in_the_venv(monkeypatch, capsys):
    monkeypatch.delenv("LLAMADESK_NO_VENV", raising=False)
    monkeypatch.setattr(bootstrap, "inside", lambda: False)
    monkeypatch.setattr(bootstrap, "decide", lambda extras: ("build", "setting up .venv: lacks torch"))
    built, ran = [], []
    monkeypatch.setattr(bootstrap, "build", built.append)
    monkeypatch.setattr(bootstrap.os, "name", "posix")
    monkeypatch.setattr(bootstrap.os, "execv", lambda py, argv: ran.append(argv))
    bootstrap.ensure(("test",), ["-m", "tests", "-q"])
    assert built == [("test",)] and ran == [[str(bootstrap.venv_python()), "-m", "tests", "-q"]]


def test_no_venv_setting_skips_every_check(monkeypatch, capsys):
    monkeypatch.setenv("LLAMADESK_NO_VENV", "1")
    monkeypatch.setattr(bootstrap, "decide", lambda extras: pytest.fail("checked"))
    bootstrap.ensure()
    assert capsys.readouterr().err == ""


def test_a_real_bare_venv_is_told_apart_from_this_one(tmp_path):
    """The check as a bare interpreter runs it: standard library only, metadata only."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from tools import bootstrap; "
            "print(bootstrap.decide((), bootstrap.Path(sys.argv[2]))[0]); "
            "print('torch' in sys.modules)")
    args = [str(ROOT), str(tmp_path / "no-venv")]
    bare = subprocess.run([str(bootstrap.venv_python(venv)), "-c", code, *args], capture_output=True, text=True,
                          timeout=60)
    assert bare.stdout.split() == ["build", "False"], bare.stderr
    here = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert here.stdout.split() == ["here", "False"], here.stderr
