"""`python -m fibgen`: the `fibgen` command."""

import sys

from fibgen.cli import main

if __name__ == "__main__":
    sys.exit(main())
