"""`python -m fibgen.demo`: the tour of a generated dispatcher, which lives in `fibgen.cli.demo`."""

import sys

from fibgen.cli.demo import main, my_rmsnorm

__all__ = ["main", "my_rmsnorm"]

if __name__ == "__main__":
    sys.exit(main())
