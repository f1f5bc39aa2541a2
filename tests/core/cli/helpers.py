"""Running the command line in-process for the CLI's tests."""
from core.cli.main import main


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of ``python -m core ARGV`` run in this process."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err
