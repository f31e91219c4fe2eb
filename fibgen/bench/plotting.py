"""What `fibgen report --plot` needs of matplotlib, importable without torch or the report.

The command checks ``--plot`` (matplotlib installed, a file type it draws) before it prints
the report; ``fibgen.bench.report.figure`` draws with ``pyplot()`` and labels its log axis
with ``PlainLogFormatter``.
"""

from __future__ import annotations

from typing import Any

INSTALL = "pip install 'fibgen[plot]'"


class PlotUnavailable(Exception):
    """matplotlib is not installed; the message gives the command that installs it."""


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(f"--plot needs matplotlib; install it with `{INSTALL}`") from None
    return plt


def plot_formats() -> dict[str, str]:
    """The file types matplotlib draws, by suffix without the dot: ``{"png": "Portable ..."}``."""
    pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    return dict(FigureCanvasBase.get_supported_filetypes())


def plain_number(value: float) -> str:
    """A tick label: ``0.998``, ``2``, ``150``; never ``9.98×10⁻¹``."""
    import numpy as np

    # Positional, at most 6 significant digits: enough for ticks 0.0005 apart near 1 (a narrow
    # axis), few enough to hide float noise (3 * 0.1 is 0.30000000000000004).
    return np.format_float_positional(value, precision=6, unique=True, fractional=False, trim="-")


def plain_log_formatter() -> Any:
    """A formatter for a log axis that labels the ticks matplotlib would label, plainly.

    matplotlib's own decides which ticks get a label (every decade, and minor ticks when the
    axis spans little) and writes them as powers of ten; this one keeps the choice and writes
    the number.
    """
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return plain_number(x) if super().__call__(x, pos) else ""

    return PlainLogFormatter(labelOnlyBase=False)
