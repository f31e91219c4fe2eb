"""Rewrite every `<case>/expected` from the current output of its command."""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_adversarial import CASES, CORPUS, run_case  # noqa: E402


def main() -> None:
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            got, _ = run_case(case, Path(tmp))
        (CORPUS / case / "expected").write_text(got, encoding="utf-8")
    print(f"wrote {len(CASES)} expected outputs")


# bench starts its workers with multiprocessing's spawn, which imports this module again in
# each worker: only the script run by hand may write.
if __name__ == "__main__":
    main()
