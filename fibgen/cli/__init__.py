"""The `fibgen` command line: one module per command group, each a thin layer over the library.

`main.py` holds `main()` and the registry of commands; `build.py` the commands that compile
(build, check, fmt, import, list); `workloads.py`, `scaffold.py` (scaffold-solution, pack),
`bench.py` (bench, report) and `validate.py` the others; `demo.py` the tour of a generated
dispatcher (`python -m fibgen.demo`). Importing this package loads no compiler, code generator
or runtime: each command imports what it drives when it runs.
"""

from fibgen.cli.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from fibgen.cli.main import build_parser, main

__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]
