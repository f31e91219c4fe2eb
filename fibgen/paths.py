"""Where fibgen's data files live: the checkout, or the installed wheel."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[1]


def _find(folder: str) -> Path:
    local = _CHECKOUT / folder
    if local.is_dir():
        return local
    # Installed from a wheel: the folders are shipped inside the package as fibgen/data/<folder>.
    return Path(__file__).resolve().parent / "data" / folder


@lru_cache(maxsize=None)
def grammars_dir() -> Path:
    """The folder holding fidef.lark."""
    return _find("grammars")


@lru_cache(maxsize=None)
def templates_dir() -> Path:
    """The folder holding the Jinja templates."""
    return _find("templates")
