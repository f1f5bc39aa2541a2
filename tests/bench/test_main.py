"""``python -m bench --quick`` writes the report with every section (no times asserted)."""
import json
from pathlib import Path

import pytest

from bench.__main__ import write_report
from tests import forked

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_bench_writes_markdown_and_json(tmp_path, meta_fixtures, monkeypatch):
    kept = "# Performance\n\n## Serving (hand-written)\n\nnot the bench's to touch\n"
    (tmp_path / "PERFORMANCE.md").write_text(kept)
    monkeypatch.setenv("LLAMADESK_FIXTURES", str(meta_fixtures))  # the forked child runs with this process's environment
    run = forked.run(forked.module, "bench", ["--quick", "--out", str(tmp_path)], cwd=ROOT, timeout=280)
    assert run.returncode == 0, run.stderr[-2000:]
    md = (tmp_path / "PERFORMANCE.md").read_text()
    data = json.loads((tmp_path / "performance.json").read_text())
    titles = [s["title"] for s in data["sections"]]
    for want in ("Machine", "Sampler", "Engine decode vs transformers", "GGUF files", "GPU"):
        assert any(t.startswith(want) for t in titles), (want, titles)
        assert f"### {want}" in md
    assert md.startswith(kept)  # other sections stay; a second run replaces only its own block
    write_report(tmp_path / "PERFORMANCE.md", "<!-- python -m bench: begin (generated) -->X<!-- python -m bench: end -->")
    assert (tmp_path / "PERFORMANCE.md").read_text() == kept.rstrip("\n") + "\n\n" + \
        "<!-- python -m bench: begin (generated) -->X<!-- python -m bench: end -->\n"
    by = {t.split(" ")[0]: s["data"] for t, s in zip(titles, data["sections"])}
    assert by["Machine"]["read_bandwidth_gb_s"] > 0
    assert set(by["Engine"]) >= {"greedy", "top_p", "lanes8", "hf", "floor_tok_s"}
    gguf = by["GGUF"]
    # llama.cpp is either measured or the report says why not.
    assert gguf["llama_cpp"] or ("not measured" in md and gguf["why_not"])
    if not __import__("torch").cuda.is_available():
        assert "**Unmeasured**" in md


@pytest.mark.timeout(300)
def test_sampler_bench_runs_alone(meta_fixtures, monkeypatch):
    """bench/bench_sampler.py --quick: the interleaved sampler table and the decode-step
    ratios print (plumbing only: no times asserted)."""
    monkeypatch.setenv("LLAMADESK_FIXTURES", str(meta_fixtures))  # the forked child runs with this process's environment
    run = forked.run(forked.script, str(ROOT / "bench" / "bench_sampler.py"), ["--quick"], cwd=ROOT, timeout=280)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "| flat (logit std 0.5) | top-p | 8 |" in run.stdout
    assert "Top-p decode / greedy decode" in run.stdout and "eight top-p lanes" in run.stdout
