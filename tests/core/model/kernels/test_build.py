"""Building and loading the kernels: the cache, the atomic rename, and every way to end
without them (no compiler, LLAMADESK_KERNELS=0, a cancelled build)."""
import subprocess
from pathlib import Path

import pytest

from core import checkpoints
from core.model.kernels import build, ops


def test_the_library_builds_loads_and_speaks_this_abi(lib):
    assert lib.ld_abi_version() == build.ABI
    assert lib.ld_isa().decode() in ("AVX-512 VNNI", "AVX2", "plain C")
    assert build.reason() is None
    assert build.describe().startswith(lib.ld_isa().decode())


def test_the_library_shares_torchs_openmp_runtime_and_thread_count(lib):
    import torch
    if build.torch_gomp() is None:
        pytest.skip("this torch ships no libgomp of its own")
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert lib.ld_max_threads() == n  # the same runtime: torch's setting is ours
    finally:
        torch.set_num_threads(before)


def test_a_second_build_reuses_the_cached_library_without_compiling(lib, monkeypatch):
    first = build.build()
    assert first.path is not None and first.path.is_file()
    monkeypatch.setattr(build, "_compile", lambda *a: pytest.fail("compiled again"))
    again = build.build()
    assert again.path == first.path


def test_the_key_changes_with_the_flags_and_the_sources(tmp_path):
    src = [build.CSRC / "abi.c"]
    base = build.library_name(src, ["-O3"], "gcc 12", "gomp")
    assert build.library_name(src, ["-O2"], "gcc 12", "gomp") != base
    assert build.library_name(src, ["-O3"], "gcc 13", "gomp") != base
    assert build.library_name(src, ["-O3"], "gcc 12", "none") != base
    copy = tmp_path / "abi.c"
    copy.write_bytes(src[0].read_bytes() + b"\n")
    assert build.library_name([copy], ["-O3"], "gcc 12", "gomp") != base


def test_the_key_covers_the_headers_the_sources_include(tmp_path, monkeypatch):
    keyed = []
    monkeypatch.setattr(build, "library_name", lambda src, *a: keyed.extend(src) or "ld-kernels-x.so")
    (tmp_path / "ld-kernels-x.so").write_bytes(b"")
    assert build.build(tmp_path).path == tmp_path / "ld-kernels-x.so"
    assert {"common.h", "attn.h", "attn.c"} <= {p.name for p in keyed}


def test_no_compiler_means_no_kernels_and_one_line_saying_why(tmp_path, monkeypatch, fresh_state):
    got = build.build(tmp_path, cc="/bin/false")
    assert got.path is None and "/bin/false" in got.reason and "\n" not in got.reason
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setattr(build.shutil, "which", lambda name: "/bin/false" if name == "/bin/false" else None)
    assert build.library() is None
    assert "/bin/false" in build.reason()
    assert build.describe().startswith("off: ")


def test_a_compile_error_is_the_reason_and_leaves_nothing(tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'fake cc 1.0' && exit 0\n"
                  "echo 'x.c:1: error: this compiler refuses' >&2; exit 1\n")
    cc.chmod(0o755)
    out = tmp_path / "out"
    got = build.build(out, cc=str(cc))
    assert got.path is None and got.reason.endswith("x.c:1: error: this compiler refuses") and str(cc) in got.reason
    assert list(out.iterdir()) == []  # no half-built library, no temporary folder


def test_llamadesk_kernels_0_turns_them_off(monkeypatch, fresh_state):
    monkeypatch.setenv(build.ENV, "0")
    monkeypatch.setattr(build, "build", lambda **kw: pytest.fail("built although turned off"))
    assert build.library() is None
    assert build.reason() == "turned off (LLAMADESK_KERNELS=0)"


def test_a_cancelled_build_kills_the_compiler_and_the_next_call_builds(tmp_path, monkeypatch, fresh_state):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\nexec sleep 30\n")
    cc.chmod(0o755)

    class Cancelled(Exception):
        pass

    def tick():
        raise Cancelled

    with pytest.raises(Cancelled):
        build.build(tmp_path / "out", cc=str(cc), tick=tick)
    monkeypatch.setenv("CC", str(cc))
    with pytest.raises(Cancelled):
        build.library(tick)
    assert not fresh_state.done  # nothing recorded: the next load tries again


def test_a_library_of_another_abi_is_refused(tmp_path):
    cc = build.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "old.c").write_text("int ld_abi_version(void) { return 999; }\n")
    subprocess.run([cc, "-shared", "-fPIC", str(tmp_path / "old.c"), "-o", str(tmp_path / "old.so")], check=True)
    with pytest.raises(OSError, match="ABI 999"):
        build.load(tmp_path / "old.so")


def test_the_kernels_folder_is_the_one_the_environment_names(tmp_path, monkeypatch):
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path / "k"))
    assert build.default_folder() == tmp_path / "k"
    monkeypatch.delenv(build.DIR_ENV)
    monkeypatch.setenv("LLAMADESK_DATA_DIR", str(tmp_path / "data"))
    assert build.default_folder() == tmp_path / "data" / build.FOLDER


def test_a_cpu_load_builds_the_kernels_on_the_loading_thread(monkeypatch):
    calls = []
    monkeypatch.setattr(ops, "kernels", lambda tick=None: calls.append(tick))
    demo = Path(__file__).resolve().parents[4] / "assets" / "models" / "llamadesk-demo"
    lm = checkpoints.load(demo, device="cpu", progress=lambda f, s: None)
    assert calls and callable(calls[0])
    # Model Info's "CPU kernels" row (the demo model is small: its forward runs in one C call)
    assert lm.info["kernels"].startswith(build.describe())
