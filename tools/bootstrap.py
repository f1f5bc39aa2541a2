"""The project-local environment behind the README's two commands.

``python3 main.py`` and ``python3 -m tests`` call :func:`ensure` first. It runs on a bare
Python (standard library only): the first time it creates ``.venv`` beside this repository,
installs PyTorch and the project into it, and re-runs the command inside it. Later runs
find a stamp that matches ``pyproject.toml`` and only re-exec (well under a second).

PyTorch source, in order (the first that works wins):
1. ``LLAMADESK_TORCH_INDEX=URL``: that index (e.g. a CUDA build's index), nothing else.
2. A torch wheel pip can already see without an index (``pip install --no-index``:
   find-links, a local wheelhouse).
3. Linux without an NVIDIA GPU: PyTorch's CPU index, if it answers within a few seconds;
   PyPI's Linux wheels bundle about 3 GB of CUDA libraries a CPU machine never uses.
4. pip's default index (PyPI): CUDA builds on Linux, CPU/MPS builds on macOS and Windows.

``LLAMADESK_NO_VENV=1`` skips all of this and uses the running interpreter as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP_NAME = "llamadesk-setup.json"
TORCH = "torch>=2.5"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 4.0


def venv_python(venv: Path = VENV) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def inside(venv: Path = VENV) -> bool:
    """True when this interpreter is the one in ``venv``."""
    try:
        return Path(sys.prefix).resolve() == venv.resolve()
    except OSError:
        return False


def fingerprint(root: Path = ROOT) -> str:
    """What the environment was built from: pyproject.toml's bytes."""
    return hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()[:16]


def up_to_date(extras: tuple[str, ...], venv: Path = VENV, root: Path = ROOT) -> bool:
    """The venv exists, was built from this pyproject.toml and holds ``extras``."""
    try:
        stamp = json.loads((venv / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return False
    return (venv_python(venv).exists() and stamp.get("pyproject") == fingerprint(root)
            and set(extras) <= set(stamp.get("extras", [])))


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver is installed (the CUDA build of PyTorch would be usable)."""
    return bool(shutil.which("nvidia-smi")) or Path("/proc/driver/nvidia/version").exists()


def index_reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout) as r:
            return r.status < 400
    except Exception:  # noqa: BLE001  — any failure means "not usable now"
        return False


def torch_plan(env: dict | None = None, platform: str = sys.platform, nvidia: bool | None = None,
               reachable=index_reachable) -> Iterator[tuple[str, list[str]]]:
    """The (description, extra pip arguments) attempts for installing torch, best first.

    Lazy: the CPU index is probed only once the local attempt has failed."""
    env = os.environ if env is None else env
    if env.get("LLAMADESK_TORCH_INDEX"):
        url = env["LLAMADESK_TORCH_INDEX"]
        yield f"from {url}", ["--index-url", url]
        return
    yield "from a wheel pip finds locally", ["--no-index"]
    nvidia = has_nvidia_gpu() if nvidia is None else nvidia
    if platform.startswith("linux") and not nvidia:
        if reachable(CPU_INDEX):
            yield "(CPU build) from PyTorch's CPU index", ["--index-url", CPU_INDEX]
        else:
            print(f"LlamaDesk: PyTorch's CPU index ({CPU_INDEX}) did not answer; falling back to the "
                  "default index, whose Linux build carries CUDA libraries (~3 GB).", file=sys.stderr)
    yield "from the default index", []


def _pip(py: Path, *args: str) -> bool:
    cmd = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, cwd=ROOT).returncode == 0


def _has_torch(py: Path) -> bool:
    return subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode == 0


def build(extras: tuple[str, ...], venv: Path = VENV) -> None:
    """Create or update ``venv`` with torch and the project (+ ``extras``); exits 2 on failure."""
    say = lambda msg: print(f"LlamaDesk: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    py = venv_python(venv)
    if not py.exists():
        say(f"first run: creating {venv} (a few minutes, once) …")
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        except (subprocess.CalledProcessError, OSError):
            _fail(f"could not create {venv} with '{sys.executable} -m venv' "
                  "(on Debian/Ubuntu: sudo apt install python3-venv)")
    if not _has_torch(py):
        for what, args in torch_plan():
            say(f"installing PyTorch {what} …")
            if _install_torch(py, args):
                break
        else:
            _fail("could not install PyTorch; see pip's messages above")
    spec = "." + (f"[{','.join(extras)}]" if extras else "")
    say(f"installing LlamaDesk's dependencies ({spec}) …")
    if not _pip(py, "-e", spec):
        _fail("could not install the project's dependencies; see pip's messages above")
    old = _read_stamp(venv)
    stamp = {"pyproject": fingerprint(), "extras": sorted(set(extras) | set(
        old.get("extras", []) if old.get("pyproject") == fingerprint() else []))}
    (venv / STAMP_NAME).write_text(json.dumps(stamp))
    say("environment ready.")


def _install_torch(py: Path, args: list[str]) -> bool:
    # The local-only attempt fails in a second where no wheel is around; keep its noise out.
    # It takes torch alone: its small dependencies come from the index with the project's.
    if args[:1] == ["--no-index"]:
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            *args, "--no-deps", TORCH], cwd=ROOT, capture_output=True, text=True)
        return r.returncode == 0
    return _pip(py, *args, TORCH)


def _read_stamp(venv: Path) -> dict:
    try:
        return json.loads((venv / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return {}


def _fail(msg: str) -> None:
    print(f"LlamaDesk: {msg}", file=sys.stderr)
    raise SystemExit(2)


def ensure(extras: tuple[str, ...] = (), argv: list[str] | None = None) -> None:
    """Return when running inside the project's environment; otherwise set it up and re-run
    ``argv`` (default: this process's command line) inside it, never returning."""
    if os.environ.get("LLAMADESK_NO_VENV") == "1" or inside():
        return
    if not up_to_date(extras):
        build(extras)
    py = str(venv_python())
    argv = [py, *(sys.argv if argv is None else argv)]
    if os.name == "nt":  # no real exec on Windows: run it as a child and pass its status on
        raise SystemExit(subprocess.call(argv))
    os.execv(py, argv)
