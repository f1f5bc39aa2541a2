import atexit
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def _isolate_user_folders() -> str:
    """Point everything the app keeps (data, settings: core.paths) and Qt's own config and
    data locations at a folder of this process's, so the suite never reads or writes the
    user's ~/.config/LlamaDesk or ~/.local/share/LlamaDesk; child processes (the app, the
    CLI, `serve`) inherit it. A developer's LLAMADESK_CONFIG_DIR is dropped: the config
    follows the data folder, as each test that sets LLAMADESK_DATA_DIR expects."""
    root = tempfile.mkdtemp(prefix="llamadesk-tests-")
    atexit.register(shutil.rmtree, root, True)
    os.environ.pop("LLAMADESK_CONFIG_DIR", None)
    for var, sub in (("LLAMADESK_DATA_DIR", "data"), ("XDG_CONFIG_HOME", "xdg-config"),
                     ("XDG_DATA_HOME", "xdg-data")):
        os.environ[var] = os.path.join(root, sub)
    return root


USER_FOLDERS = _isolate_user_folders()
# 'auto' on CPU runs a kernel probe that may pick bfloat16 on some CPUs; tests compare
# against float32 references, so they fix it (tests/core/test_tuning.py covers the probe).
os.environ.setdefault("LLAMADESK_CPU_DTYPE", "float32")

# Tests run tiny models, where one intra-op thread is fastest, and a second thread only
# spins against the Qt thread and other processes on a 2-core machine. The environment
# says so to what runs the CLI's main in-process and to child processes (`serve`, the CLI),
# which would otherwise take every core each while `python3 -m tests` runs a worker per core.
os.environ.setdefault("LLAMADESK_THREADS", "1")
# The packed-layer cache writes beside the data folder at every GGUF open; tests that test
# it turn it on in their own temporary data folder.
os.environ.setdefault("LLAMADESK_PACK_CACHE", "0")
# The compiled kernels (core.model.kernels) are built once for every session and worker,
# not once per session's data folder: each costs seconds of compiler time on a shared machine.
os.environ.setdefault("LLAMADESK_KERNELS_DIR", os.path.join(tempfile.gettempdir(), f"llamadesk-test-kernels-{getattr(os, 'getuid', lambda: 0)()}"))
import torch  # noqa: E402

torch.set_num_threads(1)


def pytest_sessionstart(session):
    """Build (or find) the compiled kernels once per test process, before any test: the
    first decode step or GGUF open would otherwise compile them inside whichever test comes
    first, seconds under load against that test's own timeouts (a GUI reply's 30 s was
    missed so). Not in an xdist controller, which runs no test."""
    xdist = session.config.getoption("numprocesses", None)
    if os.environ.get("PYTEST_XDIST_WORKER") or not xdist:
        from core.model.kernels import build  # here: after the folder and thread settings above
        build.library()


def pytest_collection_finish(session):
    """Freeze what exists once the tests are collected (modules, fixtures' definitions): the
    collections below then walk only what tests make, a fraction of a millisecond instead of
    ~130 ms over torch's and Qt's objects."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_on_the_main_thread():
    """Finalise garbage on this (the Qt) thread before and after every test.

    A QObject left in a reference cycle is destroyed by whichever thread next collects:
    when one test file's GUI garbage meets the next file's engine worker (which collects on
    its own thread after dropping a model), Qt crashes in its next event pass. Serially,
    core/ ran before gui/ and hid this; with a worker per core, files of both kinds share a
    process. Collecting here first leaves a worker thread nothing of Qt's to finalise.

    What a test leaves alive (modules it imported, module-scoped fixtures) is frozen after
    it: a full collection walks every object, and once a test has imported transformers
    or openai (lazily, as they are) that took 0.15-0.25 s, twice per test, ~0.4 s of CPU
    for a test that itself takes milliseconds. Frozen garbage is never collected by any
    thread; it is collected here, on this thread, once it may hold much memory (below).
    """
    if "PySide6" in sys.modules:
        gc.collect()
    yield
    if "PySide6" in sys.modules:
        gc.collect()
    gc.freeze()


# A full collection (0.2-0.4 s here) after a test file's last test, once resident memory
# grew by this much since the last one: what a file's module fixtures drop in reference
# cycles is freed then. Collecting after every file found nothing to free in most files.
FULL_COLLECTION_GROWTH = 256 << 20
_resident_at_full_collection = 0


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # not Linux: collect after every file
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test file's last test (its module fixtures finalised): a full collection of
    everything frozen since, on this thread, when memory has grown (see above)."""
    global _resident_at_full_collection
    yield
    if nextitem is None or nextitem.module is not item.module:
        now = _resident_bytes()
        if now is None or now - _resident_at_full_collection > FULL_COLLECTION_GROWTH:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            _resident_at_full_collection = _resident_bytes() or 0


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Code under test may claim every core (the CLI's main does): later tests run on one
    again, so results that depend on the reduction order stay reproducible."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)

from tests.helpers import ROOT  # noqa: E402

SLOW_ENV = "LLAMADESK_SLOW_TESTS"


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (minutes on a 2-core CPU, such as inductor compiling) run when
    selected with ``-m slow`` or when LLAMADESK_SLOW_TESTS=1; the default suite skips them
    so it stays minutes."""
    if os.environ.get(SLOW_ENV, "").strip() in ("1", "true", "yes") or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason=f"slow (minutes here): run with -m slow or {SLOW_ENV}=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


SHIPPED = ROOT / "tests" / "fixtures"
META_FILES = ("llama2-tokenizer.model", "llama3-tokenizer.model")


def fixtures_dir() -> Path:
    """Where Meta's tokenizer files are looked for (they may not be redistributed here)."""
    return Path(os.environ.get("LLAMADESK_FIXTURES", ROOT.parent / "shared" / "fixtures"))


@pytest.fixture(scope="session")
def fixtures() -> Path:
    """tests/fixtures: the MIT-licensed stories260K.gguf shipped with the repository."""
    return SHIPPED


@pytest.fixture(scope="session")
def meta_fixtures() -> Path:
    """The folder holding Meta's Llama 2/3 tokenizer files; skipped when missing, a failure in CI."""
    d = fixtures_dir()
    missing = [f for f in META_FILES if not (d / f).exists()]
    if missing:
        msg = (f"needs Meta's {' and '.join(missing)} (Llama Community License, not shipped): "
               f"put them in {d} or name their folder in LLAMADESK_FIXTURES")
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture(scope="session")
def llama2_kind_tokenizer(tmp_path_factory) -> Path:
    """Meta's Llama 2 tokenizer file where it is present, else a SentencePiece model of the
    same kind and size trained here (tests/generated.py): for tests that need a Llama 2-style
    tokenizer, not Meta's exact ids."""
    meta = fixtures_dir() / "llama2-tokenizer.model"
    if meta.exists():
        return meta
    from tests.generated import sentencepiece_model
    return sentencepiece_model(tmp_path_factory.mktemp("tokenizer") / "tokenizer.model")


@pytest.fixture(scope="session")
def llama3_kind_tokenizer(tmp_path_factory) -> Path:
    """Meta's Llama 3 ranks file where it is present, else one of the same kind and size
    written here (tests/generated.py): Meta's special-token ids, not Meta's text ids."""
    meta = fixtures_dir() / "llama3-tokenizer.model"
    if meta.exists():
        return meta
    from tests.generated import tiktoken_ranks
    return tiktoken_ranks(tmp_path_factory.mktemp("tokenizer") / "tokenizer.model")


@pytest.fixture(scope="session")
def tiny_meta_dir(tmp_path_factory, llama2_kind_tokenizer):
    """A tiny random Llama (GQA, vocab 32000) saved as a Meta folder with a Llama 2 tokenizer
    (Meta's own where present)."""
    from core.prompt.chat_format import chat_format_for
    from core.checkpoints.common import LoadedModel
    from core.checkpoints.meta import save_meta
    from core.tokenizer import load_tokenizer
    from tests.helpers import TINY_META, meta_from_hf, tiny_hf

    tok_file = llama2_kind_tokenizer
    tok = load_tokenizer(tok_file)
    model = meta_from_hf(tiny_hf(**TINY_META))
    out = tmp_path_factory.mktemp("tiny_meta")
    save_meta(LoadedModel(model, tok, chat_format_for(tok), model.args, tok.stop_ids, {}), out,
              tokenizer_file=tok_file)
    return out


@pytest.fixture
def make_worker():
    """make(hook=None, **kw) -> (a started Worker on one torch thread, its Collector); all are
    shut down, and must have ended, after the test."""
    from core.worker.worker import Worker
    from tests.helpers import Collector

    workers = []

    def make(hook=None, **kw):
        col = Collector(hook)
        w = Worker(col, torch_threads=1, **kw)
        w.start()
        workers.append(w)
        return w, col
    yield make
    for w in workers:
        w.shutdown(5)
        assert not w.alive


@pytest.fixture(scope="session")
def hub_tree(tmp_path_factory):
    """The fake Hub's repositories (see tests/hubserver.py), built once per session."""
    from tests.hubserver import build_tree
    return build_tree(tmp_path_factory.mktemp("hub"), SHIPPED)


@pytest.fixture
def hub_server(hub_tree, monkeypatch, tmp_path_factory):
    """A local Hugging Face Hub serving the fixture repositories (tests/hubserver.py): point
    ``HubClient(endpoint=hub_server.url)`` at it. No token from the environment or the user's
    huggingface_hub login leaks in; the gated repository wants ``hub_server.token``."""
    import copy

    from tests.hubserver import FakeHub

    import huggingface_hub.constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path_factory.mktemp("hf") / "no-token"))
    hub = FakeHub(copy.deepcopy(hub_tree)).start()
    yield hub
    hub.stop()
