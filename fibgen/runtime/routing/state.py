"""The state of apply: route kinds, outcomes, and what enable_apply and disable_apply change."""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from fibgen.runtime.caller import DISPATCH_CODES, warn
from fibgen.runtime.checking import result_check
from fibgen.runtime.routing import patching
from fibgen.runtime.solutions import loading as solutions

# A registered dispatcher's Api object, as the state keeps it and hands it to its callbacks:
# not the class itself (fibgen/runtime/routing/api.py imports this module, so this module
# does not import it), a stand-in that says what the values are.
RegisteredApi = Any

# Route kinds: how a dispatcher calls the callable of a route.
ORIGINAL = 0  # with the API's own arguments: the original API, or what stands in for it
RETURNS = 1  # with the definition's inputs by keyword; returns the outputs
DPS = 2  # with the inputs and output buffers by keyword; writes the outputs
INPLACE = 3  # as DPS, with inplace=True: Note [in-place solutions]

# Note [in-place solutions]
# Some APIs write into their arguments more than their definition exposes: FlashInfer's
# fused_add_rmsnorm leaves the normalized rows in `input` and the sum in `residual`, while
# the definition (flashinfer-bench's) returns only the normalized rows. A routed call of a
# solution that computes the definition costs extra passes over memory: the dispatcher
# computes the family's effects (Note [effects] in fibgen/codegen/python/dispatch/emit.py) and
# copies the outputs back. A destination-passing solution whose entry takes a parameter
# `inplace` with a default (False) may do those writes itself: for a family with effects it
# is routed as INPLACE and called with `inplace=True` and, as output buffers, the API's own
# (which may be its inputs: `output` is `input` for fused_add_rmsnorm); it must then leave
# every buffer as the original API would, effects included. Called without it (by bench,
# by flashinfer-bench), it computes the definition as any solution does.

OUTCOMES = (
    "hit",
    "fallback_no_candidate",
    "fallback_guard",
    "fallback_unwarmed_in_capture",
    "fallback_declined",
    "error",
    "nested",
)

# Note [re-entry]
# A solution may call the API it serves: FlashInfer-Bench's dataset gives every definition a
# baseline that calls the FlashInfer API itself, and with apply on that API is patched, so
# the call would come back to the same dispatcher, route to the same solution, and recurse
# until a RecursionError (about 500 levels). A call made from inside a routed call (by a
# solution, or by the original API or reference a failed solution fell back to) is *nested*:
# it goes to the original API (else to what a miss runs: the reference), once, counted as
# `nested`, never as a hit, never traced. This holds for every patched API, not only the one
# being served, in eager mode, under torch.compile (the op's implementation runs the
# dispatcher eagerly) and in graph capture.
#
# The hot path pays for it with one counter: a dispatcher increments ``SERVING.n`` around the
# call of its route's solution, with the local ``_serving`` bound, and a call that finds
# the counter above zero takes the slow path (``Api.resolve``). There ``nested()`` decides by
# the calling thread's own stack: a dispatcher frame (a code object in ``DISPATCH_CODES``)
# that has ``_serving`` bound is a routed call in progress on this thread. The counter is only
# a hint, so it needs no lock and no thread-local (which would cost a hit about 0.2 µs): a
# call on another thread while one thread serves takes the slow path, finds no such frame,
# and is routed as usual; a counter left high by an interrupt costs the slow path, never a
# wrong route.


class _Serving:
    """How many routed calls are in progress (a hint; Note [re-entry])."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


SERVING = _Serving()
# How far up the stack a nested call is looked for.
_NESTING_DEPTH = 256


def nested() -> bool:
    """Whether the calling thread is inside a routed call (Note [re-entry])."""
    frame: Any = sys._getframe(1)
    codes = DISPATCH_CODES
    for _ in range(_NESTING_DEPTH):
        if frame is None:
            return False
        if id(frame.f_code) in codes and "_serving" in frame.f_locals:
            return True
        frame = frame.f_back
    return False


UNSET: Any = object()
# Ticked by routes taken while apply is off: nothing is counted then.
DISCARD = itertools.count().__next__


class ApplyState:
    """Everything enable_apply and disable_apply change, guarded by ``lock``.

    Note [apply state]
    The process has one, ``STATE`` below: the public functions (enable_apply, disable_apply,
    set_tracer, stats, register_api, the ``apply`` decorator) act on it, since generated
    modules register their dispatchers at import, before anyone could hand them a state.
    Everything under them is given the state it works on rather than reaching for the
    global: an ``Api`` keeps the one it was registered in (``Api.state``) and routes, counts
    and falls back by it, and the registry's functions take it as their first argument.
    What the process has only once stays the process's whatever the state: the patched
    module attributes (patching one API twice from two states would stack), the imported
    generated packages (they register in ``STATE``), and the re-entry counter ``SERVING``.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.on = False
        self.strict = False
        self.patching = False  # whether this enable patches APIs
        self.entries: dict[str, solutions.Entry] = {}
        self.loaded: dict[tuple[str, tuple[str, ...], tuple[str, ...]], solutions.Loaded] = {}
        self.matched: set[str] = set()
        self.apis: list[RegisteredApi] = []
        self.packages: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self.patches: list[patching.Patch] = []
        # API path → the callable that was there before patching, kept after restoring, so
        # that every dispatcher of a path (a dispatch group's families too) falls back to it.
        self.originals: dict[str, Callable[..., Any]] = {}
        # Reference source → its compiled ``run``.
        self.references: dict[str, Callable[..., Any]] = {}
        # Paths left unpatched, and (definition, solution) pairs whose failure was reported:
        # each is warned about once (per state: the process has one).
        self.warned: set[Any] = set()
        # While tracing is on: wraps each route as it is resolved (Note [tracing hooks] in
        # fibgen/runtime/tracing/tracer.py); every call then takes the routed path.
        self.tracer: Callable[[RegisteredApi, str | None, Any], Any] | None = None
        # While tracing is on: told of each call a dispatcher does not hand to a wrapped route:
        # (api, reason, definition name or None, what failed), Note [missed calls] there.
        self.trace_missed: Callable[[RegisteredApi, str | None, str | None, Any], None] | None = (
            None
        )
        # While tracing is on: runs the fallback of a hand-written call whose solution failed,
        # (definition name, fallback, args, kwargs), so that tracing knows the call it is.
        self.trace_detour: Callable[[str, Callable[..., Any], Any, Any], Any] | None = None
        self.trace_patching = False  # whether tracing patches APIs (apply off or not)
        _STATES.add(self)

    def warn_once(self, key: Any, message: str) -> None:
        """Warn with ``message`` the first time ``key`` is seen."""
        with self.lock:
            if key in self.warned:
                return
            self.warned.add(key)
        warn(message)

    def use_native_check(self, same: Callable[..., bool]) -> None:
        """Check value-returning outputs with ``same`` in every registered dispatcher."""
        with self.lock:
            for api in self.apis:
                api.use_checks(same)


# Every state made, held weakly: each gets the native result check when it is built.
_STATES: weakref.WeakSet[ApplyState] = weakref.WeakSet()


def _use_native_check(same: Callable[..., bool]) -> None:
    for state in list(_STATES):
        state.use_native_check(same)


# Value-returning routes check their outputs natively once that check is built.
result_check.on_ready(_use_native_check)

# The process's apply state (Note [apply state]).
STATE = ApplyState()
