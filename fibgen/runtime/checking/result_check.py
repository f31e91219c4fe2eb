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

Note [native reads]
~~~~~~~~~~~~~~~~~~~
The same extension gives the hit path's two other reads of tensors and its counter. A
dispatcher reads the shape of the tensor its key comes from and the dtype of each input it
checks; through torch's attribute getters (which make a new ``torch.Size``, and test for
``__torch_function__`` under an error handler) these cost about 1,100 and 560 instructions
a call, ``shape_of`` and ``dtype_of`` in ``_native.cpp`` about 630 and 320 (the shape as a
tuple of ints). They read a plain tensor (``Tensor`` or ``Parameter``, no
``__torch_function__`` mode, no skip pending, sizes that are not symbolic) directly, and
anything else through Python's attribute read, so that a subclass, a mode or an object that
is not a tensor is read as ``x.shape`` and ``x.dtype`` read it. Until the extension is built,
and without it, the readers are ``operator.attrgetter``. Its ``Tally`` counts a route's calls
(fibgen/runtime/counters.py).

A dispatcher calls ``_same``, ``_shape_of`` and ``_dtype_of`` as globals of its module, which
``Api.checks`` binds at import and rebinds when the extension is ready: a global costs a call
about 180 instructions less than an attribute of ``_api``.
"""

from __future__ import annotations

import operator
import os
import shutil
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fibgen.runtime import counters

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


# The readers of Note [native reads] in Python: the dispatcher's own reads.
shape_python = operator.attrgetter("shape")
dtype_python = operator.attrgetter("dtype")

_state: dict[str, Any] = {"same": same_python, "shape_of": shape_python, "dtype_of": dtype_python}
# The same dict, for code that looks the check and the readers up on every call (the
# written-out checks of fibgen/runtime/tracing/checks.py): it is updated in place when the
# native ones are built.
LIVE = _state
_lock = threading.Lock()
# Called with the native check once it is built: the runtime puts it on every dispatcher.
_listeners: list[Callable[[Callable[..., bool]], None]] = []


def current() -> Callable[..., bool]:
    """The check to use now: the native one once built, else the Python one."""
    return _state["same"]


def reads() -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """``x.shape`` and ``x.dtype`` as the hit path reads them now (Note [native reads])."""
    return _state["shape_of"], _state["dtype_of"]


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
    from fibgen.runtime.launch.native import build_native

    try:
        module = build_native()
    except Exception as exc:  # no headers, a compiler that fails: the Python check stays
        warnings.warn(
            "fibgen: the result check of value-returning solutions stays in Python: its C++ "
            f"part did not build ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})",
            RuntimeWarning,
            stacklevel=1,
        )
        return
    native = module.same
    counters.use_native(module.Tally)
    with _lock:
        _state.update(same=native, shape_of=module.shape_of, dtype_of=module.dtype_of)
        listeners = list(_listeners)
        _listeners.clear()
    for listener in listeners:
        listener(native)
