"""Where the shared reference material (the flashinfer-trace dataset, schemas) lives for tests.

``FIBGEN_SHARED`` overrides the default, which is the ``shared`` directory beside the
repository checkout. Tests that need it call ``require_shared()`` and are skipped without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DIR: Path = Path(
    os.environ.get("FIBGEN_SHARED") or Path(__file__).resolve().parents[1].parent / "shared"
)
DATASET_DIR: Path = SHARED_DIR / "flashinfer-trace"
SCHEMAS_DIR: Path = SHARED_DIR / "reference" / "schemas"


def require_shared(*parts: str) -> Path:
    """Return ``SHARED_DIR/parts``, or skip the calling test when it does not exist."""
    path = SHARED_DIR.joinpath(*parts)
    if not path.exists():
        pytest.skip(
            f"shared reference material not found at {path}; "
            "set FIBGEN_SHARED to the directory holding flashinfer-trace/ and reference/"
        )
    return path
