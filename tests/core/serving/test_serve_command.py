"""``python -m core serve``'s own options, run in-process up to the point it would listen:
the engine's thread plan (--threads, LLAMADESK_THREADS, every core but one), the HTTP
guards' settings, and flags refused at start with exit 2 and one line."""
import pytest

from core.cli import serve as serve_cli
from core.cli.main import main
from core.model import tuning


@pytest.fixture
def started(monkeypatch):
    """What cmd_serve would serve: (state, HTTP options), captured instead of listening."""
    got = {}

    def fake(state, host, port, announce, options):
        got.update(state=state, options=options, host=host)
    monkeypatch.setattr(serve_cli, "serve_forever", fake)
    return got


def threads_of(fixtures, started, *argv):
    assert main(["serve", str(fixtures / "stories260K.gguf"), "--port", "0", *argv]) == 0
    return started["state"].engine.threads


def test_threads_flag_and_environment_set_the_engines_plan(fixtures, started, monkeypatch):
    monkeypatch.setenv("LLAMADESK_THREADS", "2")
    assert threads_of(fixtures, started) == (2, 2)
    assert threads_of(fixtures, started, "--threads", "3") == (3, 3)  # the flag wins


def test_by_default_the_engine_leaves_a_core_to_the_http_side(fixtures, started, monkeypatch):
    monkeypatch.delenv("LLAMADESK_THREADS", raising=False)
    monkeypatch.setattr(serve_cli.os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    monkeypatch.setattr(tuning, "physical_cores", lambda: 6)
    assert threads_of(fixtures, started) == (5, 5)
    monkeypatch.setattr(serve_cli.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert threads_of(fixtures, started) == (1, 1)  # one core: the engine still gets a thread


def test_http_flags_reach_the_guard(fixtures, started):
    assert main(["serve", str(fixtures / "stories260K.gguf"), "--port", "0", "--allowed-hosts", "a.lan,b.lan",
                 "--allowed-hosts", "c.lan", "--cors-origin", "http://localhost:3000", "--max-body", "4096",
                 "--read-timeout", "2.5", "--shutdown-timeout", "7"]) == 0
    o = started["options"]
    assert o.allowed_hosts == ("a.lan", "b.lan", "c.lan") and o.cors_origins == ("http://localhost:3000",)
    assert (o.max_body, o.read_timeout, o.shutdown_timeout) == (4096, 2.5, 7)


@pytest.mark.parametrize("argv, needle", [
    (["--api-key", "clé-secrète"], "--api-key must be ASCII"),
    (["--threads", "0"], "--threads must be"),
    (["--max-body", "10"], "--max-body must be"),
    (["--read-timeout", "0"], "--read-timeout must be"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout must be"),
    (["--cors-origin", "localhost:3000"], "--cors-origin takes an origin"),
])
def test_bad_serve_flags_exit_2_with_one_line_before_loading(capsys, fixtures, started, argv, needle):
    rc = main(["serve", str(fixtures / "stories260K.gguf"), "--port", "0", *argv])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "state" not in started
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err
