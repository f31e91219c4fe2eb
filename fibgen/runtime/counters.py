"""Counters the hot paths tick, exact under threads without a lock.

A counter is an ``itertools.count``, ticked by its ``__next__`` (atomic under the GIL), or,
once the runtime's extension module is built, its ``Tally`` (Note [native reads] in
fibgen/runtime/checking/result_check.py), ticked by calling it, with no int made and freed per
tick: a hit's tick costs about 210 instructions rather than 460. Counters of both kinds may be
read side by side.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

# The extension's Tally type, once built.
_native: list[Any] = []


def use_native(tally: Any) -> None:
    """Make new counters of the extension's ``Tally`` type."""
    _native[:] = [tally]


def new() -> Any:
    """A counter at zero."""
    return _native[0]() if _native else itertools.count()


def ticker(counter: Any) -> Callable[[], Any]:
    """What ticks ``counter`` by one when called."""
    return counter.__next__ if isinstance(counter, itertools.count) else counter


def read(counter: Any) -> int:
    """How many times ``counter`` was ticked, without ticking it.

    ``itertools.count`` has no reader: its repr ("count(N)") is the only one that is not
    deprecated (copying or pickling it is, since Python 3.12).
    """
    if isinstance(counter, itertools.count):
        return int(repr(counter)[6:-1])
    return int(counter.value)
