"""Where fibgen's data files live: the checkout, or the installed wheel."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[1]


def _find(folder: str, package: str) -> Path:
    local = _CHECKOUT / folder
    if local.is_dir():
        return local
    # Installed from a wheel: the folders are shipped as package data.
    return Path(str(resources.files(package)))


@lru_cache(maxsize=None)
def grammars_dir() -> Path:
    """The folder holding fidef.lark."""
    return _find("grammars", "fibgen.data.grammars")


@lru_cache(maxsize=None)
def templates_dir() -> Path:
    """The folder holding the Jinja templates."""
    return _find("templates", "fibgen.data.templates")
