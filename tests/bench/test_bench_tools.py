"""bench/bench_tools.py's MCP section in quick mode: every row measured (no times asserted)."""
import pytest

from bench import bench_tools


@pytest.mark.timeout(120)
def test_the_mcp_round_trip_section_measures_every_row(monkeypatch):
    section = bench_tools.mcp_section(quick=True)
    data = section["data"]
    for key in ("stdio", "http", "http_sdk", "builtin"):  # quick: no stdio baseline (a process fewer)
        assert data[key]["n"] == 5 and 0 < data[key]["p50_ms"] <= data[key]["p99_ms"], key
    assert data["stdio_start_s"] > 0
    assert "| stdio, through McpServer" in section["markdown"] and "p99" in section["markdown"]
