"""A lane that a one-request-at-a-time server ran after the others says so in its stats line
(core.remote.runner.SERIAL), instead of being taken for a failed compile."""
from core.remote.runner import SERIAL
from gui.widgets.stats import format_stats


def test_a_lane_run_one_after_another_says_so_in_its_stats_line():
    line = format_stats({"stats": {"generated_tokens": 4, "decode": SERIAL}})
    assert SERIAL in line and "compile" not in line
