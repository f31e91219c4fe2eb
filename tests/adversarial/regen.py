"""Rewrite every `<case>/expected` from the current output of its command."""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_adversarial import CASES, CORPUS, run_case  # noqa: E402

for case in CASES:
    with tempfile.TemporaryDirectory() as tmp:
        got, _ = run_case(case, Path(tmp))
    (CORPUS / case / "expected").write_text(got, encoding="utf-8")
print(f"wrote {len(CASES)} expected outputs")
