"""The grid of var-axis values `fibgen workloads --axes` takes, parsed without torch."""

from __future__ import annotations

from collections.abc import Iterable


class GridError(ValueError):
    """An ``--axes`` value that is not ``AXIS=V1,V2,...``; the message says which and why."""


def parse_grid(text: Iterable[str]) -> dict[str, list[int]]:
    """Parse ``["batch_size=1,7,64", "num_pages=8"]`` into a grid of var-axis values."""
    grid: dict[str, list[int]] = {}
    for item in text:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise GridError(f"--axes {item!r}: write AXIS=V1,V2,... (for example batch_size=1,7)")
        if name in grid:
            raise GridError(f"--axes {name} is given twice; list every value in one --axes")
        try:
            parsed = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise GridError(
                f"--axes {item!r}: values must be integers separated by commas"
            ) from None
        if not parsed or any(v < 0 for v in parsed):
            raise GridError(f"--axes {item!r}: give one or more integers >= 0")
        grid[name] = parsed
    return grid
