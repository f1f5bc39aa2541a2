"""``python3 -m tests``: a worker per core unless the options pick their own layout."""
import pytest

from tests.__main__ import parallel_args

SPREAD = ["-n", "auto", "--dist", "loadfile", "--max-worker-restart", "0"]


@pytest.mark.parametrize("argv", [[], ["-k", "server"], ["-q", "tests/gui", "-x"], ["-m", "slow"]])
def test_the_suite_spreads_over_a_worker_per_core_a_file_at_a_time(argv):
    assert parallel_args(argv) == [*SPREAD, *argv]


@pytest.mark.parametrize("argv", [["-n", "0"], ["-n4"], ["--numprocesses=3"], ["-p", "no:xdist"], ["-pno:xdist"],
                                  ["--pdb"], ["--trace"], ["--dist=load", "-n", "2"], ["-q", "--pdb", "-k", "x"]])
def test_options_that_choose_the_layout_are_passed_as_given(argv):
    assert parallel_args(argv) == argv
