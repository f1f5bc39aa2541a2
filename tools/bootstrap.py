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

When the running interpreter already has every dependency ``pyproject.toml`` names (and
the extras asked for), e.g. an activated virtualenv or conda environment with the PyTorch
build the user chose, it is used as it is and no ``.venv`` is built. The check reads installed
distributions' metadata only (nothing is imported). A ``.venv`` already built and up to date
keeps being used. Which of the three happens is said in one line on stderr.

``LLAMADESK_NO_VENV=1`` skips all of this and uses the running interpreter as it is.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
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


def requirements(extras: tuple[str, ...], root: Path = ROOT) -> list[str] | None:
    """pyproject.toml's dependencies plus those of ``extras``; None where it cannot be read
    (Python 3.10 has no tomllib: the caller then builds .venv as before)."""
    try:
        import tomllib  # noqa: PLC0415  — Python 3.11+; 3.10 answers "cannot tell"
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    except (ImportError, OSError, ValueError, KeyError):
        return None
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    return reqs


_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*?)\s*(?:;.*)?$")
_CLAUSE = re.compile(r"^\s*(===|==|!=|~=|<=|>=|<|>)\s*([^\s]+)\s*$")
_VERSION = re.compile(r"^v?(?:\d+!)?(\d+(?:\.\d+)*)(?:[._-]?(a|alpha|b|beta|rc|c|pre|preview)[._-]?(\d*))?"
                      r"(?:[._-]?(?:post|rev|r)[._-]?(\d*)|-(\d+))?(?:[._-]?dev[._-]?(\d*))?$", re.I)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "rc": 2, "c": 2, "pre": 2, "preview": 2}


def version_key(text: str) -> tuple | None:
    """A sort key ordering versions as PEP 440 does for the cases installs meet (release,
    pre, post, dev; a local ``+cpu`` part is ignored); None for a version it cannot read."""
    m = _VERSION.match(text.strip().split("+", 1)[0])
    if not m:
        return None
    release = tuple(int(x) for x in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre_kind, pre_n, post, post_implicit, dev = m.group(2, 3, 4, 5, 6)
    is_post = post is not None or post_implicit is not None
    is_dev = dev is not None
    if pre_kind:
        pre = (_PRE_RANK[pre_kind.lower()], int(pre_n or 0))
    else:  # 1.0.dev0 < 1.0a0 < 1.0 < 1.0.post0
        pre = (-1, 0) if is_dev and not is_post else (3, 0)
    post_n = int(post or post_implicit or 0) if is_post else -1
    return release, pre, post_n, int(dev or 0) if is_dev else float("inf")


def _clause_holds(have: str, op: str, want: str) -> bool:
    if op == "===":
        return have == want
    if want.endswith(".*") and op in ("==", "!="):  # a release prefix: ==2.* , !=1.4.*
        h, w = version_key(have), version_key(want[:-2])
        if h is None or w is None:
            return False
        n = len(want[:-2].split("."))
        same = (h[0] + (0,) * n)[:n] == (w[0] + (0,) * n)[:n]
        return same if op == "==" else not same
    h, w = version_key(have), version_key(want)
    if h is None or w is None:
        return False
    if op == "~=":  # ~=1.4.2 means >=1.4.2 and ==1.4.*
        head = want.split(".")[:-1]
        return h >= w and _clause_holds(have, "==", ".".join(head) + ".*")
    return {"==": h == w, "!=": h != w, "<=": h <= w, ">=": h >= w, "<": h < w, ">": h > w}[op]


def unmet(reqs: list[str], version_of=importlib.metadata.version) -> list[str]:
    """The requirements in ``reqs`` this interpreter's installed distributions do not meet,
    each as a short phrase ("torch (not installed)", "numpy 1.21 (needs >=1.24)").

    A requirement with an environment marker counts as needed wherever it is (conservative:
    at worst .venv is built when it was not necessary)."""
    out = []
    for req in reqs:
        m = _REQ.match(req)
        if not m:
            out.append(f"{req} (unreadable requirement)")
            continue
        name, spec = m.group(1), m.group(2)
        try:
            have = version_of(name)
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name} (not installed)")
            continue
        clauses = [_CLAUSE.match(c) for c in spec.split(",") if c.strip()]
        if not all(c and _clause_holds(have, c.group(1), c.group(2)) for c in clauses):
            out.append(f"{name} {have} (needs {spec})")
    return out


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


def decide(extras: tuple[str, ...], venv: Path = VENV, root: Path = ROOT,
           version_of=importlib.metadata.version) -> tuple[str, str]:
    """("venv" | "here" | "build", the one line that says so).

    An up-to-date ``venv`` wins (a checkout that has one keeps using it); else this
    interpreter when it meets every requirement; else ``venv`` is built."""
    if up_to_date(extras, venv, root):
        return "venv", f"using {venv}"
    reqs = requirements(extras, root)
    missing = ["pyproject.toml's dependencies could not be read"] if reqs is None else unmet(reqs, version_of)
    if not missing:
        extra = f" (with the {'+'.join(extras)} extras)" if extras else ""
        return "here", f"using this Python ({sys.executable}): it has every dependency{extra}; no .venv needed"
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    return "build", f"setting up {venv}: this Python ({sys.executable}) lacks {shown}"


def ensure(extras: tuple[str, ...] = (), argv: list[str] | None = None) -> None:
    """Return when this interpreter is the one to use (the project's .venv, or one that
    already meets every requirement); otherwise set .venv up and re-run ``argv`` (default:
    this process's command line) inside it, never returning."""
    if os.environ.get("LLAMADESK_NO_VENV") == "1" or inside():
        return
    how, line = decide(extras)
    print(f"LlamaDesk: {line}", file=sys.stderr, flush=True)
    if how == "here":
        return
    if how == "build":
        build(extras)
    py = str(venv_python())
    argv = [py, *(sys.argv if argv is None else argv)]
    if os.name == "nt":  # no real exec on Windows: run it as a child and pass its status on
        raise SystemExit(subprocess.call(argv))
    os.execv(py, argv)
