"""`python -m fibgen.cli`: the `fibgen` command."""

import sys

from fibgen.cli import main

sys.exit(main())
