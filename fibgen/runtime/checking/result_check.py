"""The check of what a value-returning solution returns, on the hit path.

Note [result check]
~~~~~~~~~~~~~~~~~~~
A value-returning solution's output must be a tensor of the definition's dtype, of the
call's shape, on the inputs' device, or the call falls back (Note [the dispatch contract] in
apply.py): a wrong output is never handed to the caller. Written in Python, the check reads
four tensor attributes through torch's bindings (dtype, shape, and the device of the output
and of an input), about 3,300 instructions, a third of a hit's overhead.
``same`` in ``_native.cpp`` makes the same checks on the C++ tensors; it is part of the
extension module that holds launch replay's table (``fibgen.runtime.launch.native.build_native``), and built like
it: in the background, the first time a value-returning solution is routed, from the cache
afterwards, and the dispatchers switch to it when it is ready (``Api.same``); until then,
and where no compiler is at hand or ``FIBGEN_NATIVE=0`` is set, the Python check runs. Both
compare devices exactly: a ``meta`` tensor is not on the CPU, although ``get_device()`` says
-1 for both. ``wait()`` waits for a build under way (bench and the benchmarks time the path a
settled process takes).
"""

from __future__ import annotations

import os
import shutil
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

_Tensor = torch.Tensor


def same_python(out: Any, dtype: torch.dtype, shape: Any, like: torch.Tensor) -> bool:
    """The check in Python: ``shape`` is the sizes, or an int, the number of dimensions."""
    if not isinstance(out, _Tensor) or out.dtype is not dtype:
        return False
    if isinstance(shape, int):
        if out.ndim != shape:
            return False
    elif out.shape != shape:
        return False
    return out.device == like.device


_state: dict[str, Any] = {"same": same_python}
_lock = threading.Lock()
# Called with the native check once it is built: the runtime puts it on every dispatcher.
_listeners: list[Callable[[Callable[..., bool]], None]] = []


def current() -> Callable[..., bool]:
    """The check to use now: the native one once built, else the Python one."""
    return _state["same"]


def on_ready(listener: Callable[[Callable[..., bool]], None]) -> None:
    """Call ``listener`` with the native check when it is built (at once if it is)."""
    with _lock:
        if _state["same"] is same_python:
            _listeners.append(listener)
            return
    listener(_state["same"])


def enabled() -> bool:
    """Whether the native check may be built: a C++ compiler, and not ``FIBGEN_NATIVE=0``."""
    if os.environ.get("FIBGEN_NATIVE", "").strip() == "0":
        return False
    return any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "g++", "clang++"))


def start() -> None:
    """Build the native check in the background, once per process (Note [result check])."""
    with _lock:
        if "thread" in _state or not enabled():
            return
        thread = threading.Thread(target=_build, name="fibgen-check-build", daemon=True)
        _state["thread"] = thread
        thread.start()


def wait() -> None:
    """Wait for a build under way, if any."""
    thread = _state.get("thread")
    if thread is not None:
        thread.join()


def build() -> Callable[..., bool]:
    """Build (or load from the cache) the native check in this thread; its ``same``."""
    from fibgen.runtime.launch.native import build_native

    return build_native().same


def _build() -> None:
    try:
        native = build()
    except Exception as exc:  # no headers, a compiler that fails: the Python check stays
        warnings.warn(
            "fibgen: the result check of value-returning solutions stays in Python: its C++ "
            f"part did not build ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})",
            RuntimeWarning,
            stacklevel=1,
        )
        return
    with _lock:
        _state["same"] = native
        listeners = list(_listeners)
        _listeners.clear()
    for listener in listeners:
        listener(native)
