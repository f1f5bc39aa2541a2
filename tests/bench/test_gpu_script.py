"""bench/gpu.py cannot run without a GPU, but it must import, explain itself and refuse cleanly."""
from pathlib import Path

import pytest
import torch

from tests import forked

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    """``python bench/gpu.py ARGS``, forked from an interpreter with torch imported already."""
    return forked.run(forked.script, str(ROOT / "bench" / "gpu.py"), list(args), cwd=ROOT)


def test_help_names_the_cuda_graphs_stage():
    run = _run("--help")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--no-graphs" in run.stdout and "CUDA-graphs decode stage" in " ".join(run.stdout.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script would run the whole table")
def test_without_a_gpu_it_refuses_with_one_line(tmp_path):
    run = _run("--out", str(tmp_path))
    assert run.returncode == 2
    assert run.stderr.strip() == "bench/gpu.py needs a CUDA device; none is available here"
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_its_engine_stage_runs_without_the_tokenizer_fixture_and_compiled(monkeypatch):
    """The stage the GPU runs, on a tiny model on the CPU: with the script's own id
    tokenizer (a GPU machine may lack the fixtures) and a compiled step (dynamo's eager
    backend standing in for inductor + CUDA graphs), it reports the path and the warm-up."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    torch._dynamo.reset()
    monkeypatch.setattr(gpu, "SHAPE", dict(gpu.SMALL, vocab_size=512, n_layers=1))
    model = gpu.build(torch.device("cpu"))
    r = gpu.engine_figures(model, gpu.IdTokenizer(), list(range(5, 30)), 6, 1.0, compile="eager")
    assert r["decode_path"] == "compiled (eager)" and r["decode_tok_s"] > 0
    assert r["capture_s"] > 0 and r["recaptured_in_runs_s"] == 0  # compiled in the warm-up, not in the timed runs
