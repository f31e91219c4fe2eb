"""`python -m fibgen.cli`: the `fibgen` command."""

import sys

from fibgen.cli.main import main

sys.exit(main())
