"""Warnings that point at the caller's line, not at fibgen's.

Note [warnings at the caller]
A warning of the runtime is about a call the program made (a name misspelt, a solution that
failed, a call tracing cannot record), and the line Python shows with it should be the
program's: the first frame of the stack that is not fibgen's own. Which frame that is depends
on the path the call took (a dispatcher, the ``apply`` decorator, tracing's wrapped route, a
fallback), so ``warn`` walks the stack rather than counting frames: it passes over frames of
the ``fibgen`` package, of generated dispatchers (the code objects routing knows as serving
calls, Note [re-entry] in routing/state.py) and of the checks fibgen writes out and executes
(files named ``<fibgen ...>``), and of Python's import machinery, so that a warning given as
``fibgen.runtime`` is imported points at the program's ``import``. A stack that is fibgen's all the way up (a thread of its own)
keeps the frame of the function that warned. The code objects of the dispatchers are kept
here, below routing, which registers them and reads them to tell a nested call (Note
[re-entry]).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

# The code objects of the functions that serve routed calls (generated dispatchers,
# ``Api.call_definition``, the ``apply`` decorator's wrapper), by id: a code object's hash is
# computed from its contents on every lookup, which made the walk of a nested call cost twice
# as much. The values keep the code objects alive, so an id is never reused.
DISPATCH_CODES: dict[int, Any] = {}


def add_dispatch_code(code: Any) -> None:
    """Count frames of ``code`` as serving routed calls while ``_serving`` is bound in them."""
    DISPATCH_CODES[id(code)] = code


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _fibgens(frame: Any, dispatchers: Mapping[int, Any]) -> bool:
    code = frame.f_code
    # Python's import machinery too: a warning at import points at the program's import line.
    name = code.co_filename
    return name.startswith((_PACKAGE, "<fibgen", "<frozen importlib")) or id(code) in dispatchers


def _importing(frame: Any) -> bool:
    name = frame.f_code.co_filename
    return "importlib" in name and "_bootstrap" in name  # as warnings.warn tells them


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` at the first frame of the caller's stack outside fibgen (Note
    [warnings at the caller])."""
    frame: Any = sys._getframe(1)
    level = 2  # the caller of warn
    while frame is not None and _fibgens(frame, DISPATCH_CODES):
        frame = frame.f_back
        # warnings.warn passes over the import machinery's frames without counting them.
        if frame is not None and not _importing(frame):
            level += 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
