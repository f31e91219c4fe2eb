"""Switches read from the environment at import: a flag and the folder it needs."""

from __future__ import annotations

import os
from collections.abc import Callable

from fibgen.runtime.caller import warn


def enable_from_env(
    flag_var: str,
    path_var: str,
    needs: str,
    what: str,
    enable: Callable[[str], object],
    errors: tuple[type[Exception], ...],
) -> None:
    """Call ``enable(path)`` when ``flag_var=1``; on a bad setting warn and leave it off.

    A serving process must keep running on its original kernels, so nothing here raises.
    """
    flag = os.environ.get(flag_var, "").strip()
    if flag in ("", "0"):
        return
    path = os.environ.get(path_var, "").strip()
    problem = None
    if flag != "1":
        problem = f"{flag_var}={flag!r} must be 0 or 1"
    elif not path:
        problem = f"{flag_var}=1 needs {path_var}=<{needs}>"
    else:
        try:
            enable(path)
        except errors as exc:
            problem = f"{path_var}={path}: {exc}"
    if problem is not None:
        warn(f"fibgen: {problem}; {what} stays off")
