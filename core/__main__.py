"""``python -m core``: the command line (see core/cli/)."""
from core.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
