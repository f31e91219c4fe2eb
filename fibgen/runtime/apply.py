"""Apply: route live calls to registered solutions by definition name.

Note [the dispatch contract]
A generated dispatcher module calls ``register_api`` once, at the end of its import, and
keeps the returned ``Api`` as ``_api``, ``_api.routes`` as ``_routes`` and, for a plan/run
wrapper, ``_api.plans`` as ``_plans``. Its function does, in straight-line code:

1. ``if _api.direct is not None: return _api.direct(<the API's own arguments>)``. The runtime
   sets ``direct`` to the original API while apply is off (resolved lazily on the first
   call), and to None while apply is on or when there is no original to call.
2. For a wrapper: ``_plan = _plans.get(self)``; a wrapper whose ``plan()`` fibgen did not see,
   or whose plan state changed since (Note [plan state] in ``fibgen/runtime/patching.py``),
   is not routed (``_api.miss``). The runtime calls the module's ``_capture`` after every
   successful ``plan()``; it keeps the plan's arguments and the first plan rule they fail.
3. The `let` rules and the key (const values read from the arguments), in a ``try``: a call
   they cannot be computed for is refused (``_api.refuse(None, ...)``).
4. ``route = _routes.get(key)``; when None, ``route = _api.resolve(key)``. The runtime owns
   ``routes`` and empties it in place on enable and disable; ``resolve`` fills it once per
   key (checking the rules over the definition's values, ``_const_check``), except while a
   CUDA graph is being captured (see ``resolve``).
5. ``kind, fn, tick, values = route``. ``kind == ORIGINAL``: ``tick()`` and ``return
   fn(<the API's own arguments>)``. ``tick`` counts the call (a bound ``itertools.count``
   ``__next__``, atomic under the GIL, so counts are exact under threads without a lock).
6. The call's rules (Note [rules] in ``fibgen/compiler/ir.py``): the plan's verdict, then the
   dtype and rank of each input tensor and every call-time rule, in a ``try``. The first that
   fails gives ``_api.refuse(key, index, <arguments>)``, which counts it and returns the
   route to take instead: ``ORIGINAL`` (the original API, or the next family of the API),
   whose result the dispatcher returns, or the reference, which it runs as a solution.
7. ``tick()``; ``RETURNS``: call ``fn`` with the definition's inputs by keyword and check
   each output it returns (type, dtype, shape, device; ``_api.bad_result``). ``DPS``: call
   ``fn`` with the inputs and one buffer per output by keyword. An exception:
   ``_api.failed(key, fn, exc, <arguments>)`` from the except block. A fallback's exception
   is re-raised unchanged; a solution's is counted as an error (or a ``Decline``), and
   ``failed`` returns the route of the fallback, taken as in 6, or raises in strict mode.
8. Outputs are reconciled with the caller's buffers and returned.

The name of a key is computed on the slow path only: the generated table of known
definitions first, then the family's name rule for const values that no instance declares
(never a name another family of the same API declares).

``Api.call_definition(name, inputs, outputs)`` takes the same routes, counters and errors
entered by definition name with the definition's own inputs, for generated tests and tools
that hold inputs rather than API arguments; it is not a dispatcher's path.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from fibgen.runtime import patching, select, solutions

# Generated modules import ApiDefault from here, with the other names of the contract.
from fibgen.runtime.patching import ApiDefault  # noqa: F401
from fibgen.runtime.errors import ApplyConfigError, Decline, FallbackError, SolutionError

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
# computes the family's effects (Note [effects] in fibgen/codegen/python_dispatch.py) and
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
)

# Packages of generated dispatchers that enable_apply looks for even when not imported yet.
DEFAULT_PACKAGES = ("fibgen_kernels",)

# Rule indices of checks that are not rules of the family (Note [the dispatch contract]).
_UNEVALUABLE = -2  # a rule raised while it was checked
_NO_KEY = -3  # the key (or a `let` before it) could not be computed

# Why a run of a plan/run wrapper is not routed, by the rule it is counted under.
_UNPLANNED = {
    "plan:unseen": "fibgen saw no plan() of this wrapper since apply was enabled",
    "plan:changed": (
        "the wrapper's plan state changed after the plan() fibgen saw (a plan() through a "
        "method bound before apply was enabled, or forward())"
    ),
}

_UNSET: Any = object()
# Ticked by routes taken while apply is off: nothing is counted then.
_DISCARD = itertools.count().__next__


class _State:
    """Everything enable_apply and disable_apply change, guarded by ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.on = False
        self.strict = False
        self.patching = False  # whether this enable patches APIs
        self.entries: dict[str, solutions.Entry] = {}
        self.loaded: dict[tuple[str, tuple[str, ...], tuple[str, ...]], solutions.Loaded] = {}
        self.matched: set[str] = set()
        self.apis: list[Api] = []
        self.packages: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self.patches: list[patching.Patch] = []
        # API path → the callable that was there before patching, kept after restoring, so
        # that every dispatcher of a path (a dispatch group's families too) falls back to it.
        self.originals: dict[str, Callable[..., Any]] = {}
        self.references: dict[str, Callable[..., Any]] = {}
        # Paths left unpatched, and (definition, solution) pairs whose failure was reported:
        # each is warned about once per process.
        self.warned: set[Any] = set()
        # While tracing is on: wraps each route as it is resolved (Note [tracing hooks] in
        # fibgen/runtime/tracing.py); every call then takes the routed path.
        self.tracer: Callable[[Api, str | None, Any], Any] | None = None
        self.trace_patching = False  # whether tracing patches APIs (apply off or not)


_state = _State()

# Note [a refusal handed down the chain]
# Families of one API form a chain: a call one family refuses goes to the next. When the
# last family simply has no solution for it, the reason the call is not routed is the rule
# an earlier family refused it by, not "no candidate". The refusing family hands the call
# on with its rule's counter here, for the duration of that call only; a family that then
# finds no candidate counts that rule instead of its own miss.
_handed = threading.local()


def is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    # CPU-only torch raises inside is_current_stream_capturing, so ask about CUDA first.
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _compile_reference(text: str, name: str) -> Callable[..., Any]:
    run = _state.references.get(text)
    if run is None:
        namespace: dict[str, Any] = {"__name__": f"fibgen_reference_{name}"}
        exec(compile(text, f"<reference of {name}>", "exec"), namespace)
        run = _state.references[text] = namespace["run"]
    return run


def _no_fallback(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise LookupError(f"{label}: no solution for {name or 'this call'} and {why}")

    return fail


def _unservable(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise FallbackError(f"{label}: {name or 'this call'} cannot be served: {why}")

    return fail


def _strict_failure(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise FallbackError(f"{label}: {name or 'this call'} is not routed: {why} (strict)")

    return fail


def _warn_once(key: Any, message: str) -> None:
    with _state.lock:
        if key in _state.warned:
            return
        _state.warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


class Api:
    """What one dispatcher routes through: its routes, counters, rules and fallback."""

    __slots__ = (
        "direct",
        "routes",
        "plans",
        "then",
        "label",
        "function",
        "path",
        "plan_path",
        "capture",
        "patch",
        "known",
        "known_names",
        "foreign",
        "name_rule",
        "by_name",
        "inputs",
        "outputs",
        "references",
        "family_reference",
        "rules",
        "tensors",
        "values",
        "defaults",
        "params",
        "param_defaults",
        "key_fields",
        "const_check",
        "op_type",
        "trace_inputs",
        "trace_axes",
        "_original",
        "_fixed_original",
        "_outside",
        "_tallies",
        "_resolved",
        "inplace",
    )

    def __init__(
        self,
        label: str,
        function: Callable[..., Any],
        *,
        path: str | None = None,
        plan_path: str | None = None,
        capture: Callable[..., Any] | None = None,
        patch: bool = True,
        known: Mapping[Any, str] | None = None,
        foreign: frozenset[str] = frozenset(),
        name_rule: Callable[[Any], str | None] | None = None,
        by_name: bool = False,
        inputs: tuple[str, ...] = (),
        outputs: tuple[str, ...] = (),
        references: Mapping[str, str] | None = None,
        family_reference: str | None = None,
        rules: tuple[str, ...] = (),
        tensors: Mapping[str, tuple[str | None, tuple[str, ...]]] | None = None,
        values: Mapping[str, tuple[Any, ...]] | None = None,
        defaults: tuple[Any, ...] | None = (),
        params: tuple[str, ...] = (),
        param_defaults: Mapping[str, Any] | None = None,
        key_fields: tuple[str, ...] = (),
        const_check: Callable[[Any, Any], int] | None = None,
        original: Callable[..., Any] | None = None,
        then: Callable[..., Any] | None = None,
        op_type: str | None = None,
        trace_inputs: Callable[..., tuple[Any, ...]] | None = None,
        trace_axes: Callable[..., dict[str, Any]] | None = None,
        inplace: bool = False,
    ) -> None:
        self.direct: Callable[..., Any] | None = None
        # Plan-time arguments per wrapper instance (weak keys: a dropped wrapper is freed),
        # each valid while the wrapper's state is the one it was captured with.
        self.plans: patching.PlanStore | None = (
            None if plan_path is None else patching.PlanStore(plan_path)
        )
        # The next dispatcher standing for the same API: it gets the calls this one misses.
        self.then = then
        self.routes: dict[Any, tuple[int, Callable[..., Any], Callable[[], int], Any]] = {}
        self.label = label
        self.function = function
        self.path = path
        self.plan_path = plan_path
        self.capture = capture
        self.patch = patch
        self.known = dict(known or {})
        self.known_names = frozenset(self.known.values())
        self.foreign = foreign
        self.name_rule = name_rule
        self.by_name = by_name
        self.inputs = inputs
        self.outputs = outputs
        self.references = dict(references or {})
        self.family_reference = family_reference
        self.rules = rules
        self.tensors = dict(tensors or {})
        self.values = None if values is None else dict(values)
        self.defaults = defaults
        self.params = params
        self.param_defaults = dict(param_defaults or {})
        self.key_fields = key_fields
        self.const_check = const_check
        self.op_type = op_type
        self.trace_inputs = trace_inputs
        self.trace_axes = trace_axes
        # Whether the dispatcher calls INPLACE routes (Note [in-place solutions]).
        self.inplace = inplace
        self._original = _UNSET if original is None else original
        self._fixed_original = original is not None
        self._outside: Callable[..., Any] | None = None
        self._tallies: dict[tuple[str, str | None], itertools.count] = {}
        # key → (definition, solution label, the solution's callable)
        self._resolved: dict[Any, tuple[str, str, Callable[..., Any]]] = {}

    # ------------------------------------------------------- torch.compile and ops
    def outside(self) -> Callable[..., Any]:
        """The dispatcher run eagerly, out of a graph torch.compile traces (Note [custom ops]).

        Called from traced code only, when torch._dynamo is imported already.
        """
        fn = self._outside
        if fn is None:
            import torch._dynamo  # imported already: this runs while Dynamo traces

            fn = self._outside = torch._dynamo.disable(self.function)
        return fn

    def define_ops(
        self,
        namespace: str,
        schema: str,
        impl: Callable[..., Any],
        fake: Callable[..., Any],
        names: Mapping[Any, str],
        family: str,
    ) -> tuple[dict[Any, Any], Any]:
        """Register the dispatcher's custom ops (Note [custom ops] in fibgen/runtime/ops.py)."""
        from fibgen.runtime import ops

        return ops.define(namespace, names, family, schema, impl, fake)

    # ----------------------------------------------------------------- fallbacks
    def original(self) -> Callable[..., Any] | None:
        """The API this dispatcher stands for, as it was before patching; None without one."""
        if self._original is _UNSET:
            if self.path is None:
                self._original = None
            elif self.path in _state.originals:
                self._original = _state.originals[self.path]
            else:
                self._original = patching.original(self.path)
            if self._original is not None:
                patching.adopt_defaults(self.function, self._original)
        return self._original

    def _first_direct(self, *args: Any, **kwargs: Any) -> Any:
        original = self.original()
        with _state.lock:
            if not _state.on and _state.tracer is None:
                self.direct = original
        if original is None:
            return self.function(*args, **kwargs)
        return original(*args, **kwargs)

    def _reference_text(self, key: Any, name: str | None) -> str | None:
        if name in self.known_names:
            return self.references.get(name) or self.family_reference
        if self.family_reference is None:
            return None
        # A name no instance declares: its parameters come from the key, else the defaults.
        values = dict(self.param_defaults)
        if key is not _UNSET and self.params:
            fields = key if isinstance(key, tuple) else (key,)
            values.update((f, v) for f, v in zip(self.key_fields, fields) if f in self.params)
        if any(p not in values for p in self.params):
            return None
        prelude = "".join(f"{p} = {values[p]!r}\n" for p in self.params)
        return prelude + self.family_reference

    def _reference(self, key: Any, name: str | None) -> Callable[..., Any] | None:
        text = self._reference_text(key, name)
        return None if text is None else _compile_reference(text, name or self.label)

    def _fallback_route(
        self,
        key: Any,
        name: str | None,
        tick: Callable[[], int],
        why: str,
        *,
        next_family: bool = True,
        refused: bool = False,
    ) -> tuple[int, Callable[..., Any], Callable[[], int], Any]:
        if self.then is not None and next_family:
            # The next family counts the call, as a hit or as its own fallback; a rule that
            # refused a registered solution goes with it (Note [a refusal handed down the chain]).
            then = self._hand_on(tick) if refused else self.then
            return (ORIGINAL, then, _DISCARD, None)
        if _state.on and _state.strict:
            return (ORIGINAL, _strict_failure(self.label, name, why), tick, None)
        original = self.original()
        if original is not None:
            return (ORIGINAL, original, tick, None)
        reference = self._reference(key, name)
        if reference is not None:
            # With the name's values, so that the call's rules are checked against them.
            values = () if self.values is None else self.values.get(name, self.defaults)
            return (RETURNS, reference, tick, values)
        why = "no original API or reference to fall back to"
        return (ORIGINAL, _no_fallback(self.label, name, why), tick, None)

    # ------------------------------------------------------------------- routing
    def name_of(self, key: Any) -> str | None:
        """The definition name of a key: the known table first, then the name rule."""
        if self.by_name:
            return key if isinstance(key, str) else None
        name = self.known.get(key)
        if name is not None or self.name_rule is None:
            return name
        try:
            name = self.name_rule(key)
        except Exception:
            # Values the rule cannot spell (a dtype with no name part, a None) name nothing.
            return None
        # A known name reached with other values is not that definition, and a name another
        # family of the same API declares is that family's.
        if name in self.known_names or name in self.foreign:
            return None
        return name

    def _tick(self, outcome: str, name: str | None) -> Callable[[], int]:
        counter = self._tallies.get((outcome, name))
        if counter is None:
            counter = self._tallies[(outcome, name)] = itertools.count()
        return counter.__next__

    def _hand_on(self, tick: Callable[[], Any]) -> Callable[..., Any]:
        """The next family, called with ``tick`` as the reason should it find no candidate."""
        then = self.then
        assert then is not None

        def handed(*args: Any, **kwargs: Any) -> Any:
            outer = getattr(_handed, "tick", None)
            _handed.tick = tick
            try:
                return then(*args, **kwargs)
            finally:
                _handed.tick = outer

        return handed

    def _miss_tick(self, name: str | None) -> Callable[[], Any]:
        """Count a call with no candidate, or the refusal it was handed with."""
        own = self._tick("fallback_no_candidate", name)
        if not any(a.then is self.function for a in _state.apis):
            # No family hands calls on to this one: a miss here is its own, and counting it
            # needs no look at what a handing family left (a thread-local read per call).
            return own

        def tick() -> None:
            handed = getattr(_handed, "tick", None)
            (handed or own)()

        return tick

    def _guard_tick(self, rule: str) -> Callable[[], int]:
        count_guard = self._tick("fallback_guard", None)
        count_rule = self._tick("rule", rule)

        def tick() -> None:
            count_guard()
            count_rule()

        return tick

    def resolve(self, key: Any) -> tuple[int, Callable[..., Any], Callable[[], int], Any]:
        """Decide the route of a key seen for the first time (the slow path)."""
        with _state.lock:
            route = self.routes.get(key)
            if route is not None:
                return route
            name = self.name_of(key)
            entry = _state.entries.get(name) if _state.on and name is not None else None
            if not _state.on:
                route = self._fallback_route(key, name, _DISCARD, "apply is off")
            elif entry is None:
                why = "no solution is registered for it"
                route = self._fallback_route(key, name, self._miss_tick(name), why)
            elif is_capturing():
                # Loading may allocate or synchronize, which capture forbids. The route is
                # not kept, so the name resolves normally on its first call after capture.
                tick = self._tick("fallback_unwarmed_in_capture", name)
                return self._fallback_route(key, name, tick, "it was first called during capture")
            else:
                route = self._solution_route(key, name, entry)
            if _state.tracer is not None:
                route = _state.tracer(self, name, route)
            self.routes[key] = route
            return route

    def _solution_route(
        self, key: Any, name: str, entry: solutions.Entry
    ) -> tuple[int, Callable[..., Any], Callable[[], int], Any]:
        values: Any = ()
        if self.values is not None:
            values = self.values.get(name, self.defaults)
            if values is None:
                why = f"no values of its parameters for {name}"
                tick = self._guard_tick("params")
                return self._fallback_route(key, name, tick, why, refused=True)
        if self.const_check is not None:
            failed = self.const_check(key, values)
            if failed >= 0:
                rule = self.rules[failed]
                return self._fallback_route(
                    key, name, self._guard_tick(rule), f"it fails the rule on {rule}", refused=True
                )
        try:
            loaded = self._load(name, entry)
        except SolutionError as exc:
            if name not in self.known_names and self.then is not None and exc.signature:
                # A name this family's rule spells but a solution written for another family
                # of the same API (another set of inputs): that family may serve it.
                return (ORIGINAL, self.then, _DISCARD, None)
            self._tick("error", name)()
            if _state.strict:
                raise
            _warn_once(
                ("load", name, entry.label),
                f"fibgen: {exc}; calls of {name} fall back",
            )
            return self._fallback_route(key, name, _DISCARD, "its solution failed to load")
        self._resolved[key] = (name, loaded.label, loaded.fn)
        _state.matched.add(name)
        kind = (INPLACE if self.inplace and loaded.inplace else DPS) if loaded.dps else RETURNS
        return (kind, loaded.fn, self._tick("hit", name), values)

    def _load(self, name: str, entry: solutions.Entry) -> solutions.Loaded:
        cache_key = (name, self.inputs, self.outputs)
        loaded = _state.loaded.get(cache_key)
        if loaded is None:
            try:
                # Inputs without a declared tensor are values; where the API declares no
                # tensors at all nothing is known, and launches are not replayed.
                scalars = None
                if self.tensors:
                    scalars = frozenset(i for i in self.inputs if i not in self.tensors)
                loaded = solutions.load(entry, self.inputs, self.outputs, scalars)
            except SolutionError:
                _state.matched.add(name)
                raise
            _state.loaded[cache_key] = loaded
        return loaded

    def rule_text(self, index: int) -> str:
        """How a failed check is called in stats and messages."""
        if index == _UNEVALUABLE:
            return "unevaluable"
        if index == _NO_KEY:
            return "key"
        return self.rules[index]

    def refuse(
        self, key: Any, index: int, *args: Any, **kwargs: Any
    ) -> tuple[int, Callable[..., Any], Callable[[], int]]:
        """A call fails a check: count it, and give the route to take instead.

        The next family of the API gets the call first (it counts it); strict mode raises.
        """
        rule = self.rule_text(index)
        name = None if key is None else self.name_of(key)
        if self.then is not None:
            if name is None or name not in _state.entries:
                return (ORIGINAL, self.then, _DISCARD)
            # This family had a solution for the call: its rule is the reason, unless a later
            # family routes it (Note [a refusal handed down the chain]).
            with _state.lock:
                tick = self._guard_tick(rule)
            return (ORIGINAL, self._hand_on(tick), _DISCARD)
        if _state.on:
            with _state.lock:
                self._guard_tick(rule)()
            if _state.strict:
                raise FallbackError(
                    f"{self.label}: {name or 'the call'} is not routed: "
                    f"{self._describe_failure(rule, args, kwargs)} (strict)"
                )
        kind, fn, _, _ = self._fallback_route(key, name, _DISCARD, rule)
        if key is None and kind != ORIGINAL:
            # Without a key the reference cannot run in the dispatcher's place.
            why = "its key could not be read and there is no original API to fall back to"
            return (ORIGINAL, _no_fallback(self.label, name, why), _DISCARD)
        if kind != ORIGINAL:
            # The reference computes the definition, which a call that fails its rules is not
            # (another eps, another dtype): running it would be a silent wrong result.
            why = (
                f"{self._describe_failure(rule, args, kwargs)}, and there is no original API "
                "to run it (the definition's reference computes something else)"
            )
            return (ORIGINAL, _unservable(self.label, name, why), _DISCARD)
        return (kind, fn, _DISCARD)

    def _describe_failure(self, rule: str, args: tuple[Any, ...], kwargs: dict) -> str:
        if rule == "unevaluable":
            return "a rule could not be evaluated on its arguments"
        if rule == "key":
            return "its key could not be read from its arguments"
        if rule.startswith("tensor:") and self.trace_inputs is not None:
            try:
                inputs = dict(zip(self.inputs, self.trace_inputs(*args, **kwargs)))
            except Exception:
                inputs = {}
            problem = self._tensor_problem(rule[7:], inputs)
            if problem is not None:
                return problem
        shown = []
        try:
            import inspect

            bound = inspect.signature(self.function).bind(*args, **kwargs)
            bound.apply_defaults()
            for part in rule.split(","):
                if part in bound.arguments:
                    shown.append(f"{part}={_short(bound.arguments[part])}")
        except (TypeError, ValueError):
            pass
        values = f" ({', '.join(shown)})" if shown else ""
        return f"it fails the rule on {rule}{values}"

    def _tensor_problem(self, name: str, inputs: Mapping[str, Any]) -> str | None:
        """What makes input ``name`` of a call not the definition's, as the launchers say it."""
        if name not in inputs or name not in self.tensors:
            return None
        value = inputs[name]
        dtype, shape = self.tensors[name]
        if not isinstance(value, torch.Tensor):
            return f"input {name} is a {type(value).__name__}, not a tensor"
        got = str(value.dtype).removeprefix("torch.")
        if dtype is not None and got != dtype:
            return f"input {name} is {got}, the definition's is {dtype}"
        if value.ndim != len(shape):
            return (
                f"input {name} has {value.ndim} dims, the definition's has {len(shape)} "
                f"[{', '.join(shape)}]"
            )
        first: dict[str, tuple[str, int, int]] = {}
        for other in self.inputs:
            t = inputs.get(other)
            if other in self.tensors and isinstance(t, torch.Tensor):
                for i, axis in enumerate(self.tensors[other][1]):
                    if i < t.ndim:
                        first.setdefault(axis, (other, i, int(t.shape[i])))
        for i, axis in enumerate(shape):
            where = first.get(axis)
            if where is not None and where[0] != name and where[2] != value.shape[i]:
                return (
                    f"input {name} has size {value.shape[i]} along axis {axis} (dim {i}), "
                    f"expected {where[2]} as in {where[0]} (dim {where[1]})"
                )
        return None

    def failed(
        self, key: Any, fn: Callable[..., Any], exc: BaseException, *args: Any, **kwargs: Any
    ) -> tuple[int, Callable[..., Any], Callable[[], int]]:
        """Handle an exception of a route, from the dispatcher's except block.

        A fallback's exception is re-raised unchanged. A solution's is counted, as an error
        or, for a ``Decline``, as declined; the route of the fallback is returned, except in
        strict mode, where a SolutionError (or, for a ``Decline``, a FallbackError) is raised.
        """
        resolved = self._resolved.get(key)
        if resolved is None or resolved[2] is not fn:
            # Called from an except block: a bare raise re-raises the exception it handles.
            raise
        name, label, _ = resolved
        if isinstance(exc, Decline):
            self._count("fallback_declined", "declined_hit", name)
            if _state.strict:
                raise FallbackError(
                    f"{self.label}: {label} declined a call of {name!r}: {exc} (strict)"
                ) from exc
            why = f"{label} declined it"
        else:
            self._count("error", "failed_hit", name)
            error = (
                exc
                if isinstance(exc, SolutionError)
                else SolutionError(
                    f"{label} for definition {name!r} raised {type(exc).__name__}: {exc}",
                    name,
                    label,
                )
            )
            if _state.strict:
                if error is exc:
                    raise
                raise error from exc
            _warn_once(("run", name, label), f"fibgen: {error}; such calls fall back")
            why = f"{label} failed"
        # Not the next family: the key is this family's. The API itself, else the reference.
        kind, fallback, _, _ = self._fallback_route(key, name, _DISCARD, why, next_family=False)
        return (kind, fallback, _DISCARD)

    def bad_result(self, key: Any, output: str | None, got: Any) -> None:
        """Raise the SolutionError of an output that is not what the definition declares."""
        name, label, _ = self._resolved.get(key, (self.name_of(key), "the solution", None))
        if output is None:
            want = f"a tuple of its {len(self.outputs)} outputs ({', '.join(self.outputs)})"
            raise SolutionError(
                f"{label} for definition {name!r} returned {_describe(got)}, not {want}",
                name,
                label,
            )
        raise SolutionError(
            f"{label} for definition {name!r} returned {_describe(got)} as output "
            f"{output!r}, which does not match the definition (dtype, shape or device of the "
            "call)",
            name,
            label,
        )

    def _reference_or_fail(self, key: Any, name: str) -> Callable[..., Any]:
        reference = self._reference(key, name)
        if reference is None:
            return _no_fallback(self.label, name, "no reference to fall back to")
        return reference

    def _count(self, outcome: str, hit_correction: str, name: str) -> None:
        with _state.lock:
            self._tick(outcome, name)()
            self._tick(hit_correction, name)()

    def call_definition(
        self, name: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> Any:
        """Route a call given by definition name and inputs; returns what the reference returns.

        ``outputs`` holds one buffer per output, needed when the route is destination-passing.
        A fallback runs the reference: the original API takes its own arguments, not these.
        Rules over API arguments do not apply: a call by definition has none.
        """
        if self.by_name:
            key = name
        else:
            key = next((k for k, n in self.known.items() if n == name), _UNSET)
            if key is _UNSET:
                raise LookupError(f"{self.label} routes no definition named {name!r}")
        route = self.routes.get(key)
        if route is None:
            route = self.resolve(key)
        kind, fn, tick, _ = route
        if kind == ORIGINAL:
            if tick is _DISCARD and _state.on:
                # Handed to the next family of the API, which would count it; count it here.
                with _state.lock:
                    tick = self._tick("fallback_no_candidate", name)
            fn = self._reference_or_fail(key, name)
            kind = RETURNS
        if kind != RETURNS and outputs is None:  # DPS, or INPLACE called as plain DPS
            raise ValueError(f"{self.label}: the solution for {name!r} needs output buffers")
        tick()
        try:
            if kind == RETURNS:
                return fn(**inputs)
            fn(**inputs, **outputs)
        except Exception as exc:
            self.failed(key, fn, exc)
            # As a fallback here: the reference, on the inputs this call holds.
            return self._reference_or_fail(key, name)(**inputs)
        values = tuple(outputs[o] for o in self.outputs)
        return values[0] if len(values) == 1 else values

    def cannot_allocate(self, output: str) -> Any:
        """Raise for a destination-passing call whose output shape the call does not give."""
        raise ValueError(
            f"{self.label}: cannot allocate output {output!r}: its shape is not readable from "
            "the call; pass its buffer, or register a value-returning solution"
        )

    def miss(self, *args: Any, **kwargs: Any) -> Any:
        """Fall back for a call that cannot be routed at all (unplanned, unknown selector).

        A run of a wrapper whose plan fibgen did not see, or whose state changed since
        (Note [plan state] in ``fibgen/runtime/patching.py``), is counted as a guard
        fallback under ``plan:unseen`` or ``plan:changed``.
        """
        if self.then is not None:
            return self.then(*args, **kwargs)
        if _state.on:
            rule = self._unplanned(args, kwargs)
            with _state.lock:
                (self._miss_tick(None) if rule is None else self._guard_tick(rule))()
            if _state.strict:
                why = _UNPLANNED.get(rule, "it matches no definition")
                raise FallbackError(f"{self.label}: the call is not routed: {why} (strict)")
        original = self.original()
        if original is None:
            why = "no original API to fall back to (for a plan/run API, call plan() first)"
            raise LookupError(f"{self.label}: this call matches no definition and {why}")
        return original(*args, **kwargs)

    def _unplanned(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The rule a run without a usable plan is counted under; None for other misses."""
        if self.plans is None:
            return None
        instance = args[0] if args else kwargs.get("self")
        try:
            return self.plans.state(instance)
        except TypeError:  # an instance that cannot be weakly referenced
            return "plan:unseen"

    # --------------------------------------------------------------- on and off
    def _turn_on(self) -> None:
        self.routes.clear()
        self._resolved.clear()
        self._tallies = {}
        self.direct = None

    def _turn_off(self) -> None:
        self.routes.clear()
        self._resolved.clear()
        if _state.tracer is not None:
            self.direct = None
        else:
            self.direct = self._first_direct if self._original is _UNSET else self._original

    def counts(self) -> dict[str, int]:
        """Calls per outcome since apply was last enabled."""
        totals = dict.fromkeys(OUTCOMES + ("failed_hit", "declined_hit"), 0)
        for (outcome, _), counter in list(self._tallies.items()):
            if outcome in totals:
                totals[outcome] += _read(counter)
        # A hit is a call a solution served: not one it raised on or handed back.
        totals["hit"] -= totals.pop("failed_hit") + totals.pop("declined_hit")
        return totals

    def rule_counts(self) -> dict[str, int]:
        """Refused calls per rule since apply was last enabled."""
        out: dict[str, int] = {}
        for (outcome, rule), counter in list(self._tallies.items()):
            if outcome == "rule" and rule is not None:
                n = _read(counter)
                if n:
                    out[rule] = out.get(rule, 0) + n
        return out


def _read(counter: itertools.count) -> int:
    # repr is "count(N)": reading it does not advance the counter.
    return int(repr(counter)[6:-1])


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{list(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (
            f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)} "
            f"on {value.device}"
        )
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _patch(api: Api, taken: set[str]) -> None:
    # ``taken``: paths already patched in this enable. The latest registered dispatcher of a
    # path wins (a regenerated module), so callers walk the registry newest first.
    if not api.patch or api.path is None or api.path in taken:
        return
    taken.add(api.path)
    problem = patching.mismatch(api.path, api.function)
    if problem is not None:
        _warn_unpatched(api, problem)
        return
    if api.plan_path is not None and api.capture is not None:
        problem = patching.mismatch(api.plan_path, api.capture)
        if problem is not None:
            _warn_unpatched(api, problem)
            return
    found = patching.patch(api.path, api.function, _state.patches)
    if found is None:
        return
    _state.originals[api.path] = api._original = found
    patching.adopt_defaults(api.function, found)
    if api.plan_path is not None:
        hooks = [
            (a.plans, a.capture)
            for a in _state.apis
            if a.plan_path == api.plan_path and a.capture is not None and a.plans is not None
        ]
        found = patching.patch_plan(api.plan_path, hooks, _state.patches)
        if found is not None:
            _state.originals[api.plan_path] = found


def _warn_unpatched(api: Api, problem: str) -> None:
    # Every family of the path goes unrouted (the variant families of a wrapper, the families
    # of a dispatch group), so every definition of theirs is named: an integrator looks for
    # the one they registered.
    names = sorted({n for a in _state.apis if a.path == api.path for n in a.known_names})
    definitions = f"definitions {', '.join(names)}" if names else f"{api.label}"
    _warn_once(
        ("unpatched", api.path, problem),
        f"fibgen: {problem}; it is left unpatched, so {definitions} are not routed",
    )


def _patching_wanted() -> bool:
    return (_state.on and _state.patching) or (_state.tracer is not None and _state.trace_patching)


def _repatch() -> None:
    """Restore every patched API, then patch again if apply or tracing wants it (under lock).

    Plans seen so far are forgotten: between the two, a ``plan()`` could run unseen, and a
    ``run()`` after a plan fibgen did not see is never routed.
    """
    patching.restore(_state.patches)
    # What stands at each path now is the original: something may have replaced it since.
    _state.originals.clear()
    for api in _state.apis:
        if not api._fixed_original:
            api._original = _UNSET
        if api.plans is not None:
            api.plans.clear()
    if _patching_wanted():
        taken: set[str] = set()
        idle = set() if _state.tracer is not None or _state.strict else _idle_paths()
        for api in reversed(_state.apis):
            if api.path not in idle:
                _patch(api, taken)


def _idle_paths() -> set[str]:
    """API paths none of whose definitions has a solution: left unpatched, so their calls
    reach FlashInfer at no cost (Note [idle paths]).

    Note [idle paths]
    ~~~~~~~~~~~~~~~~~
    A call of a patched API that nothing can serve still goes through its dispatchers: the
    key, the route, the miss counted; for a wrapper with variant families, once per family.
    In a decode step whose attention has no solution that cost about 10 µs per attention
    call on an H100 host, more than the routed norms saved. A path is idle when no registered
    name is a definition of its families, and no registered name is one that no family
    knows (a name rule may spell it for a path: those paths all stay patched). Tracing
    patches every path, and so does strict mode, where a call nothing serves must raise.
    """
    names = set(_state.entries) if _state.on else set()
    known: dict[str, set[str]] = {}
    for api in _state.apis:
        if api.path is not None:
            known.setdefault(api.path, set()).update(api.known_names)
    if names - set().union(*known.values()):
        return set()
    return {path for path, defined in known.items() if not names & defined}


def register_api(label: str, function: Callable[..., Any], **options: Any) -> Api:
    """Register a dispatcher (called by generated modules at import); see ``Api``."""
    api = Api(label, function, **options)
    with _state.lock:
        _state.apis.append(api)
        if _state.on:
            api._turn_on()
        else:
            api._turn_off()
        if _patching_wanted():
            if api.plan_path is not None and api.path in _state.originals:
                # Another family of the same wrapper is patched: its plan hooks this one too.
                _repatch()
            else:
                _patch(api, {p.path for p in _state.apis[:-1] if p.patch and p.path})
    return api


def register_package(
    package: str, apis: Mapping[str, str], definitions: Mapping[str, str] | None = None
) -> None:
    """Record a package of generated dispatchers: API path → module, definition → module."""
    with _state.lock:
        _state.packages[package] = (dict(apis), dict(definitions or {}))


def _import_packages(packages: Iterable[str] | None, names: Iterable[str], patch: bool) -> None:
    # Dispatchers are imported here so that they can be patched in, and so that callables
    # registered for their definitions are checked now rather than on their first call.
    wanted = list(packages) if packages is not None else [*DEFAULT_PACKAGES, *_state.packages]
    for package in dict.fromkeys(wanted):
        if package not in _state.packages:
            try:
                importlib.import_module(package)
            except ImportError:
                continue
        apis, definitions = _state.packages.get(package, ({}, {}))
        modules = {definitions[n] for n in names if n in definitions}
        if patch:
            # Only dispatchers whose API can be reached.
            modules |= {m for path, m in apis.items() if patching.original(path) is not None}
        for module in sorted(modules):
            importlib.import_module(f"{package}.{module}")


def _check_callables(entries: Mapping[str, solutions.Entry]) -> None:
    # A name known to several registered packages with different tensors (two catalogues in
    # one process) cannot be checked here; the check then happens when a call routes to it.
    tensors: dict[str, set[tuple[tuple[str, ...], tuple[str, ...]]]] = {}
    for a in _state.apis:
        for n in a.known_names:
            tensors.setdefault(n, set()).add((a.inputs, a.outputs))
    for name, entry in entries.items():
        if entry.fn is None or len(tensors.get(name, ())) != 1:
            continue
        ((inputs, outputs),) = tensors[name]
        _, problem = solutions.signature_problem(entry.fn, name, entry.label, inputs, outputs, None)
        if problem is not None:
            raise ApplyConfigError(problem)


class Applied:
    """Returned by enable_apply: ``with enable_apply(...):`` disables apply on exit."""

    def __enter__(self) -> Applied:
        return self

    def __exit__(self, *exc: object) -> None:
        disable_apply()


def enable_apply(
    solutions_or_path: Mapping[str, Any] | str | Any,
    config: Any = None,
    *,
    patch: bool = True,
    strict: bool | None = None,
    packages: Iterable[str] | None = None,
) -> Applied:
    """Route calls to solutions: a mapping {definition name: solution} or a dataset folder.

    A dataset folder with ``traces/`` routes each definition to the solution its traces rank
    best, per var-axis key where that differs; ``config`` is the selection policy
    (``fibgen.runtime.select``). Enabling again replaces the mapping and resets the counters.
    With ``patch``, the APIs of imported dispatchers and of the generated packages are
    replaced by their dispatchers. ``strict`` (default: ``FIBGEN_APPLY_STRICT=1``) makes every
    call that is not served by its solution raise with the reason: a miss, a failed rule, a
    decline, a solution error.
    """
    if strict is None:
        strict = strict_from_env()
    if select.is_traced_dataset(solutions_or_path):
        entries = select.entries(solutions_or_path, config)
    elif config is not None:
        raise ApplyConfigError("a selection config needs a dataset folder that holds traces/")
    else:
        entries = solutions.collect(solutions_or_path)
    _import_packages(packages, entries, patch)
    _check_callables(entries)
    with _state.lock:
        _state.entries = entries
        _state.loaded = {}
        _state.matched = set()
        _state.on = True
        _state.strict = bool(strict)
        _state.patching = patch
        for api in _state.apis:
            api._turn_on()
        _repatch()
    return Applied()


def strict_from_env() -> bool:
    """``FIBGEN_APPLY_STRICT=1``: apply raises instead of falling back."""
    import os

    return os.environ.get("FIBGEN_APPLY_STRICT", "").strip() == "1"


def disable_apply() -> None:
    """Stop routing and restore patched APIs; warn about solutions that never matched."""
    with _state.lock:
        was_on = _state.on
        _state.on = False
        _state.strict = False
        # Tracing with patching keeps the APIs patched; they call the originals again.
        _repatch()
        for api in _state.apis:
            api._turn_off()
        unmatched = sorted(set(_state.entries) - _state.matched)
        _state.entries = {}
        _state.loaded = {}
    if was_on and unmatched:
        warnings.warn(
            f"fibgen: {len(unmatched)} registered definition(s) never matched a call: "
            + ", ".join(unmatched),
            RuntimeWarning,
            stacklevel=2,
        )


def set_tracer(
    tracer: Callable[[Api, str | None, Any], Any] | None, *, patch: bool = False
) -> None:
    """Install (or with None remove) the route wrapper of tracing; routes resolve afresh.

    With ``patch``, the APIs of the generated dispatchers are patched while tracing is on,
    also with apply off: calls that do not go through fibgen reach a dispatcher, which
    records them and calls the original API.
    """
    if tracer is not None and patch:
        _import_packages(None, (), True)
    with _state.lock:
        _state.tracer = tracer
        _state.trace_patching = tracer is not None and patch
        _repatch()
        for api in _state.apis:
            if _state.on:
                api.routes.clear()
            else:
                api._turn_off()


def is_enabled() -> bool:
    """Whether apply is on."""
    return _state.on


def stats() -> dict[str, dict[str, Any]]:
    """Calls per API since apply was last enabled: hit, the fallbacks, and error.

    An API with refused calls also has ``rules``: the calls per failed rule.
    """
    out: dict[str, dict[str, Any]] = {}
    with _state.lock:
        for api in _state.apis:
            counts = api.counts()
            if not any(counts.values()):
                continue
            total = out.setdefault(api.label, dict.fromkeys(OUTCOMES, 0))
            for outcome in OUTCOMES:
                total[outcome] += counts[outcome]
            for rule, n in api.rule_counts().items():
                rules = total.setdefault("rules", {})
                rules[rule] = rules.get(rule, 0) + n
    return out


# ------------------------------------------------------------------------------------
# Hand-written code: the decorator and the function form.
# ------------------------------------------------------------------------------------

_handwritten: dict[tuple[Callable[..., Any], Any], Callable[..., Any]] = {}


def _route_handwritten(
    fallback: Callable[..., Any], target: str | Callable[..., str]
) -> Callable[..., Any]:
    label = f"{getattr(fallback, '__module__', '?')}.{getattr(fallback, '__qualname__', '?')}"
    api = register_api(label, fallback, patch=False, by_name=True, original=fallback)
    routes = api.routes
    resolver = target if callable(target) else None

    @functools.wraps(fallback)
    def routed(*args: Any, **kwargs: Any) -> Any:
        key = resolver(*args, **kwargs) if resolver is not None else target
        route = routes.get(key)
        if route is None:
            route = api.resolve(key)
        _, fn, tick, _ = route
        tick()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            _, fallback_fn, _ = api.failed(key, fn, exc, *args, **kwargs)
        return fallback_fn(*args, **kwargs)

    return routed


# Note [apply without a fallback]
# flashinfer-bench's apply(name, args) takes `fallback` as optional and raises on a miss
# without one ("Apply miss for ... and no fallback provided"). Here the definition's
# reference stands in for it: it computes the right result in either calling style, so a
# call that no solution serves (a miss, a failed or declining solution, apply off) still
# returns what the definition says, and is counted like any fallback. The definition is
# looked up in the datasets apply was enabled on, then in fibgen's catalogue; a name found
# in neither raises a LookupError naming it. Strict mode raises as it does with a fallback.

_reference_fallbacks: dict[Any, Callable[..., Any]] = {}


def apply(
    target: str | Callable[..., str],
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    fallback: Callable[..., Any] | None = None,
) -> Any:
    """Route hand-written code: ``@apply(name_or_resolver)``, or ``apply(name, args, kwargs, fallback)``.

    The solution is called with the arguments as given; a resolver maps them to a name.
    Without ``fallback``, a call no solution serves runs the definition's reference
    (Note [apply without a fallback]).
    """
    if fallback is None:
        if args is None and kwargs is None:
            return functools.partial(_route_handwritten, target=target)
        fallback = _reference_fallbacks.get(target)
        if fallback is None:
            references: dict[tuple[str, str], Callable[..., Any]] = {}

            def run_reference(*call_args: Any, **call_kwargs: Any) -> Any:
                name = target if isinstance(target, str) else target(*call_args, **call_kwargs)
                with _state.lock:
                    roots = sorted({e.root for e in _state.entries.values() if e.root}, key=str)
                definition = None
                for root in [*roots, None]:
                    definition = solutions.find_definition(name, root)
                    if definition is not None:
                        break
                if definition is None:
                    where = " or ".join(
                        [f"{r}/definitions" for r in roots] + ["fibgen's catalogue"]
                    )
                    raise LookupError(
                        f"apply({name!r}): no solution serves this call and no fallback was "
                        f"given, and definition {name!r} is not in {where} to run its "
                        "reference; pass fallback=, or enable apply on the dataset that "
                        "defines it"
                    )
                key = (name, definition["reference"])
                run = references.get(key)
                if run is None:
                    reference = _compile_reference(definition["reference"], name)
                    run = references[key] = solutions.either_style(
                        reference, definition, False, f"the reference of {name!r}"
                    )
                _warn_once(
                    ("reference fallback", name),
                    f"fibgen: apply({name!r}) without a fallback: calls no solution serves "
                    "run the definition's reference (slow)",
                )
                return run(*call_args, **call_kwargs)

            # How stats() and messages name this route: no function of the caller's stands
            # behind it.
            run_reference.__module__ = "fibgen.runtime"
            run_reference.__qualname__ = f"apply({getattr(target, '__qualname__', target)!r})"
            fallback = _reference_fallbacks.setdefault(target, run_reference)
    with _state.lock:
        routed = _handwritten.get((fallback, target))
        if routed is None:
            routed = _handwritten[(fallback, target)] = _route_handwritten(fallback, target)
    return routed(*(args or ()), **(kwargs or {}))
