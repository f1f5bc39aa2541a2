"""The README's set-up (tools/bootstrap.py): where PyTorch comes from, and when to rebuild."""
import json
import shutil

from tools import bootstrap
from tools.bootstrap import CPU_INDEX, torch_plan


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
