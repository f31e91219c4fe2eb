"""The Api object: one dispatcher's routes and counters, and the slow path that resolves a key."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from fibgen.runtime import counters
from fibgen.runtime.caller import add_dispatch_code
from fibgen.runtime.checking import input_check, result_check
from fibgen.runtime.errors import Decline, FallbackError, SolutionError
from fibgen.runtime.launch.capture import is_capturing
from fibgen.runtime.routing import patching, refusals
from fibgen.runtime.routing.fallbacks import (
    compile_reference,
    no_fallback,
    strict_failure,
    unservable,
)
from fibgen.runtime.routing.state import (
    DISCARD,
    DPS,
    INPLACE,
    ORIGINAL,
    OUTCOMES,
    RETURNS,
    SERVING,
    UNSET,
    ApplyState,
    nested,
)
from fibgen.runtime.solutions import loading as solutions

# Note [a refusal handed down the chain]
# Families of one API form a chain: a call one family refuses goes to the next. When the
# last family simply has no solution for it, the reason the call is not routed is the rule
# an earlier family refused it by, not "no candidate". The refusing family hands the call
# on with its rule's counter here, for the duration of that call only; a family that then
# finds no candidate counts that rule instead of its own miss.
_handed = threading.local()


# A route: (kind, the callable, the tick that counts its calls, the definition's values).
Route = tuple[int, Callable[..., Any], Callable[[], Any], Any]
# What refuse and failed return: a route without values.
Detour = tuple[int, Callable[..., Any], Callable[[], Any]]


class Api:
    """What one dispatcher routes through: its routes, counters, rules and fallback.

    It keeps the apply state it was registered in (Note [apply state] in
    fibgen/runtime/routing/state.py). The sections below: torch.compile and custom ops; the
    slow path that resolves a key to a route; where a call no solution serves goes; calls
    refused by a rule or failed by their solution; on and off, and the counters.
    """

    __slots__ = (
        "state",
        "direct",
        "routes",
        "plans",
        "then",
        "own_then",
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
        "buffers",
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
        "call",
        "plan_call",
        "call_params",
        "call_problem",
        "same",
        "shape_of",
        "dtype_of",
        "namespace",
    )

    def __init__(
        self,
        label: str,
        function: Callable[..., Any],
        *,
        state: ApplyState,
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
        buffers: Mapping[str, tuple[str, str | None, tuple[str, ...]]] | None = None,
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
        call: tuple[tuple[str, str, Any], ...] | None = None,
        plan_call: tuple[tuple[str, str, Any], ...] | None = None,
        call_params: Mapping[str, Mapping[str, Any]] | None = None,
        call_problem: str | None = None,
    ) -> None:
        self.state = state
        self.direct: Callable[..., Any] | None = None
        code = getattr(function, "__code__", None)
        if code is not None:
            add_dispatch_code(code)  # its frames serve routed calls (Note [re-entry])
        # Plan-time arguments per wrapper instance (weak keys: a dropped wrapper is freed),
        # each valid while the wrapper's state is the one it was captured with.
        self.plans: patching.PlanStore | None = (
            None if plan_path is None else patching.PlanStore(plan_path)
        )
        # The next dispatcher standing for the same API: it gets the calls this one misses.
        # ``own_then`` is the one its package named; the registry may link the last family of
        # a package to another package's families of the API (Note [packages of one API]).
        self.then = self.own_then = then
        self.routes: dict[Any, Route] = {}
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
        # The caller's output buffers a rule checks: output → (parameter, dtype, axis names).
        self.buffers = dict(buffers or {})
        self.values: dict[str, tuple[Any, ...] | None] | None = (
            None if values is None else dict(values)
        )
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
        # How to call the API given a definition's inputs (Note [api calls] in api_calls.py).
        self.call = call
        self.plan_call = plan_call
        self.call_params = dict(call_params or {})
        self.call_problem = call_problem
        # The check of a value-returning solution's output (Note [result check]), and the
        # reads of an input's shape and dtype (Note [native reads]): bound in ``namespace``.
        self.same = result_check.current()
        self.shape_of, self.dtype_of = result_check.reads()
        self.namespace: dict[str, Any] | None = None
        self._original = UNSET if original is None else original
        self._fixed_original = original is not None
        self._outside: Callable[..., Any] | None = None
        self._tallies: dict[tuple[str, str | None], Any] = {}
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
        """Register the dispatcher's custom ops (Note [custom ops] in fibgen/runtime/routing/ops.py)."""
        from fibgen.runtime.routing import ops

        return ops.define(namespace, names, family, schema, impl, fake)

    def checks(self, namespace: dict[str, Any]) -> tuple[Callable[..., Any], ...]:
        """The result check and the shape and dtype readers the dispatcher calls, as
        ``_same``, ``_shape_of`` and ``_dtype_of`` of ``namespace`` (its module's globals),
        where they are rebound when the native ones are built (Note [native reads])."""
        self.namespace = namespace
        return self.same, self.shape_of, self.dtype_of

    def use_checks(self, same: Callable[..., bool]) -> None:
        """Check outputs with ``same`` and read inputs with the readers of now."""
        self.same = same
        self.shape_of, self.dtype_of = result_check.reads()
        if self.namespace is not None:
            self.namespace.update(_same=same, _shape_of=self.shape_of, _dtype_of=self.dtype_of)

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

    def _values_of(self, name: str | None) -> tuple[Any, ...] | None:
        """The values of the family's parameters for definition ``name``: () for a family
        without parameters, None where the name has none."""
        if self.values is None:
            return ()
        return self.defaults if name is None else self.values.get(name, self.defaults)

    def _tick(self, outcome: str, name: str | None) -> Callable[[], Any]:
        counter = self._tallies.get((outcome, name))
        if counter is None:
            counter = self._tallies[(outcome, name)] = counters.new()
        return counters.ticker(counter)

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
        if not any(a.then is self.function for a in self.state.apis):
            # No family hands calls on to this one: a miss here is its own, and counting it
            # needs no look at what a handing family left (a thread-local read per call).
            return own

        def tick() -> None:
            handed = getattr(_handed, "tick", None)
            (handed or own)()

        return tick

    def _guard_tick(self, rule: str) -> Callable[[], Any]:
        count_guard = self._tick("fallback_guard", None)
        count_rule = self._tick("rule", rule)

        def tick() -> None:
            count_guard()
            count_rule()

        return tick

    def resolve(self, key: Any) -> Route:
        """Decide the route of a key seen for the first time (the slow path), or of a call
        made while a routed call is in progress (Note [re-entry])."""
        if SERVING.n:
            if nested():
                return self.nested_route(key)
            route = self.routes.get(key)
            if route is not None:
                return route
        with self.state.lock:
            route = self.routes.get(key)
            if route is not None:
                return route
            name = self.name_of(key)
            entry = self.state.entries.get(name) if self.state.on and name is not None else None
            if not self.state.on:
                route = self._fallback_route(key, name, DISCARD, "apply is off")
            elif entry is None:
                why = "no solution is registered for it"
                route = self._fallback_route(key, name, self._miss_tick(name), why)
            elif is_capturing():
                # Loading may allocate or synchronize, which capture forbids. The route is
                # not kept, so the name resolves normally on its first call after capture.
                tick = self._tick("fallback_unwarmed_in_capture", name)
                missed = self.state.trace_missed
                if missed is not None:  # no route tracing wraps: it is told (Note [missed calls])
                    missed(self, "capturing", name, "first call")
                return self._fallback_route(key, name, tick, "it was first called during capture")
            else:
                assert name is not None  # an entry is looked up by name
                route = self._solution_route(key, name, entry)
            if self.state.tracer is not None:
                route = self.state.tracer(self, name, route)
            self.routes[key] = route
            return route

    def nested_route(self, key: Any) -> Route:
        """The route of a nested call: the original API, else the reference; counted as
        ``nested``, never kept, never traced (Note [re-entry])."""
        name = self.name_of(key) if key is not None else None
        with self.state.lock:
            tick = self._tick("nested", name)
        original = self.original()
        if original is not None:
            return (ORIGINAL, original, tick, None)
        reference = self._reference(key, name) if key is not None else None
        if reference is not None:
            values = self._values_of(name)
            return (RETURNS, reference, tick, values)
        why = "it was called from inside a routed call, and there is no original API to call"
        return (ORIGINAL, no_fallback(self.label, name, why), tick, None)

    def _solution_route(self, key: Any, name: str, entry: solutions.Entry) -> Route:
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
                return (ORIGINAL, self.then, DISCARD, None)
            self._tick("error", name)()
            if self.state.strict:
                raise
            self.state.warn_once(
                ("load", name, entry.label),
                f"fibgen: {exc}; calls of {name} fall back",
            )
            return self._fallback_route(key, name, DISCARD, "its solution failed to load")
        self.state.matched.add(name)
        kind = (INPLACE if self.inplace and loaded.inplace else DPS) if loaded.dps else RETURNS
        # Its outputs are checked, and its inputs read, on every call: natively, once built.
        result_check.start()
        route = (kind, loaded.fn, self._tick("hit", name), values)
        self._resolved[key] = (name, loaded.label, loaded.fn)
        if kind != INPLACE and input_check.enabled():
            route = self._probed(key, name, loaded, route)
        return route

    def _probed(self, key: Any, name: str, loaded: solutions.Loaded, route: tuple) -> tuple:
        """The route whose first call checks the inputs (Note [first-call input check])."""
        kind, fn, tick, values = route

        def passed() -> None:
            with self.state.lock:
                if self.routes.get(key) is probed_route:
                    self.routes[key] = route

        def failed(changes: list[str]) -> SolutionError:
            with self.state.lock:
                if key in self.routes:  # not during capture, where routes are not kept
                    why = f"{loaded.label} changed its inputs"
                    self.routes[key] = self._fallback_route(
                        key, name, self._tick("error", name), why, next_family=False
                    )
            return SolutionError(
                f"{loaded.label} for definition {name!r} changed its input(s) "
                f"{'; '.join(changes)}: a solution may write only its outputs (the inputs were "
                "written back)",
                name,
                loaded.label,
            )

        first = input_check.probe(fn, self.inputs, self.outputs, passed, failed)
        probed_route = (kind, first, tick, values)
        return probed_route

    def _load(self, name: str, entry: solutions.Entry) -> solutions.Loaded:
        cache_key = (name, self.inputs, self.outputs)
        loaded = self.state.loaded.get(cache_key)
        if loaded is None:
            try:
                # Inputs without a declared tensor are values; where the API declares no
                # tensors at all nothing is known, and launches are not replayed.
                scalars = None
                if self.tensors:
                    scalars = frozenset(i for i in self.inputs if i not in self.tensors)
                loaded = solutions.load(entry, self.inputs, self.outputs, scalars)
            except SolutionError:
                self.state.matched.add(name)
                raise
            self.state.loaded[cache_key] = loaded
        return loaded

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
            key = next((k for k, n in self.known.items() if n == name), UNSET)
            if key is UNSET:
                raise LookupError(f"{self.label} routes no definition named {name!r}")
        route = self.routes.get(key)
        if route is None or SERVING.n:
            route = self.resolve(key)
        kind, fn, tick, _ = route
        if kind == ORIGINAL:
            if tick is DISCARD and self.state.on:
                # Handed to the next family of the API, which would count it; count it here.
                with self.state.lock:
                    tick = self._tick("fallback_no_candidate", name)
            fn = self._reference_or_fail(key, name)
            kind = RETURNS
        if kind != RETURNS and outputs is None:  # DPS, or INPLACE called as plain DPS
            raise ValueError(f"{self.label}: the solution for {name!r} needs output buffers")
        tick()
        _serving = SERVING  # bound: a routed call is in progress (Note [re-entry])
        _serving.n += 1
        try:
            if kind == RETURNS:
                return fn(**inputs)
            assert outputs is not None  # checked above
            fn(**inputs, **outputs)
        except Exception as exc:
            self.failed(key, fn, exc)
            # As a fallback here: the reference, on the inputs this call holds.
            return self._reference_or_fail(key, name)(**inputs)
        finally:
            _serving.n -= 1
        assert outputs is not None
        values = tuple(outputs[o] for o in self.outputs)
        return values[0] if len(values) == 1 else values

    def cannot_allocate(self, output: str, laid_out: bool = False) -> Any:
        """Raise for a destination-passing call whose output shape the call does not give
        (``laid_out``: the caller's buffer holds the output as the API lays it out, Note
        [output buffers] in ``fibgen/codegen/python/dispatch/rules.py``)."""
        if laid_out:
            raise ValueError(
                f"{self.label}: cannot allocate output {output!r}: the caller's buffer holds it "
                "as the API lays it out, and the definition's shape is not readable from the "
                "call; register a value-returning solution"
            )
        raise ValueError(
            f"{self.label}: cannot allocate output {output!r}: its shape is not readable from "
            "the call; pass its buffer, or register a value-returning solution"
        )

    # ----------------------------------------------------------------- fallbacks
    def original(self) -> Callable[..., Any] | None:
        """The API this dispatcher stands for, as it was before patching; None without one."""
        if self._original is UNSET:
            if self.path is None:
                self._original = None
            elif self.path in self.state.originals:
                self._original = self.state.originals[self.path]
            else:
                self._original = patching.original(self.path)
            if self._original is not None:
                patching.adopt_defaults(self.function, self._original)
        return self._original

    def _first_direct(self, *args: Any, **kwargs: Any) -> Any:
        original = self.original()
        with self.state.lock:
            if not self.state.on and self.state.tracer is None:
                self.direct = original
        if original is None:
            return self.function(*args, **kwargs)
        return original(*args, **kwargs)

    def _reference_text(self, key: Any, name: str | None) -> str | None:
        if name is not None and name in self.known_names:
            return self.references.get(name) or self.family_reference
        if self.family_reference is None:
            return None
        # A name no instance declares: its parameters come from the key, else the defaults.
        values = dict(self.param_defaults)
        if key is not UNSET and self.params:
            fields = key if isinstance(key, tuple) else (key,)
            values.update((f, v) for f, v in zip(self.key_fields, fields) if f in self.params)
        if any(p not in values for p in self.params):
            return None
        prelude = "".join(f"{p} = {values[p]!r}\n" for p in self.params)
        return prelude + self.family_reference

    def _reference(self, key: Any, name: str | None) -> Callable[..., Any] | None:
        text = self._reference_text(key, name)
        if text is None:
            return None
        return compile_reference(text, name or self.label, self.state.references)

    def _fallback_route(
        self,
        key: Any,
        name: str | None,
        tick: Callable[[], Any],
        why: str,
        *,
        next_family: bool = True,
        refused: bool = False,
    ) -> Route:
        """Where a call no solution serves goes: the next family, the original API, the
        reference; in strict mode, an error saying ``why``."""
        if self.then is not None and next_family:
            # The next family counts the call, as a hit or as its own fallback; a rule that
            # refused a registered solution goes with it (Note [a refusal handed down the chain]).
            then = self._hand_on(tick) if refused else self.then
            return (ORIGINAL, then, DISCARD, None)
        if self.state.on and self.state.strict:
            return (ORIGINAL, strict_failure(self.label, name, why), tick, None)
        original = self.original()
        if original is not None:
            return (ORIGINAL, original, tick, None)
        reference = self._reference(key, name)
        if reference is not None:
            # With the name's values, so that the call's rules are checked against them.
            values = self._values_of(name)
            return (RETURNS, reference, tick, values)
        why = "no original API or reference to fall back to"
        return (ORIGINAL, no_fallback(self.label, name, why), tick, None)

    def _reference_or_fail(self, key: Any, name: str) -> Callable[..., Any]:
        reference = self._reference(key, name)
        if reference is None:
            return no_fallback(self.label, name, "no reference to fall back to")
        return reference

    # ------------------------------------------------------ refused and failed calls
    def rule_text(self, index: int) -> str:
        """How a failed check is called in stats and messages."""
        return refusals.rule_text(self.rules, index)

    def refuse(self, key: Any, index: int, *args: Any, **kwargs: Any) -> Detour:
        """A call fails a check: count it, and give the route to take instead.

        The next family of the API gets the call first (it counts it); strict mode raises.
        """
        if SERVING.n and self.original() is not None and nested():
            # A call from inside a routed call goes to the original API (Note [re-entry]).
            kind, fn, tick, _ = self.nested_route(key)
            tick()
            return (kind, fn, DISCARD)
        state = self.state
        rule = self.rule_text(index)
        name = None if key is None else self.name_of(key)
        if self.then is not None:
            if name is None or name not in state.entries:
                return (ORIGINAL, self.then, DISCARD)
            # This family had a solution for the call: its rule is the reason, unless a later
            # family routes it (Note [a refusal handed down the chain]).
            with state.lock:
                tick = self._guard_tick(rule)
            return (ORIGINAL, self._hand_on(tick), DISCARD)
        missed = state.trace_missed
        if missed is not None:
            # Not a route tracing wraps: it is told, and counts it (Note [missed calls]).
            # What the call fails, worked out only for the first one, which is said.
            def why() -> str:
                return self._describe_failure(rule, args, kwargs)

            # Tensors that are not the definition's are what tracing calls mismatched, with
            # apply on as with it off (Note [missed calls] in fibgen/runtime/tracing/tracer.py).
            reason = (
                "unknown"
                if key is None
                else "mismatched" if rule.startswith("tensor:") else "refused"
            )
            missed(self, reason, name, why)
        if state.on:
            with state.lock:
                self._guard_tick(rule)()
            if state.strict:
                raise FallbackError(
                    f"{self.label}: {name or 'the call'} is not routed: "
                    f"{self._describe_failure(rule, args, kwargs)} (strict)"
                )
        kind, fn, _, _ = self._fallback_route(key, name, DISCARD, rule)
        if key is None and kind != ORIGINAL:
            # Without a key the reference cannot run in the dispatcher's place.
            why_not = "its key could not be read and there is no original API to fall back to"
            return (ORIGINAL, no_fallback(self.label, name, why_not), DISCARD)
        if kind != ORIGINAL:
            # The reference computes the definition, which a call that fails its rules is not
            # (another eps, another dtype): running it would be a silent wrong result. A
            # buffer that is not the output's is only the original's to write.
            reason = (
                "only the original API takes a buffer the definition does not describe"
                if rule.startswith("tensor:") and rule[7:] in self.buffers
                else "the definition's reference computes something else"
            )
            why_not = (
                f"{self._describe_failure(rule, args, kwargs)}, and there is no original API "
                f"to run it ({reason})"
            )
            return (ORIGINAL, unservable(self.label, name, why_not), DISCARD)
        return (kind, fn, DISCARD)

    def _describe_failure(self, rule: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        return refusals.describe_failure(
            rule,
            self.function,
            self.inputs,
            self.tensors,
            self.trace_inputs,
            args,
            kwargs,
            self.buffers,
        )

    def failed(
        self, key: Any, fn: Callable[..., Any], exc: BaseException, *args: Any, **kwargs: Any
    ) -> Detour:
        """Handle an exception of a route, from the dispatcher's except block.

        A fallback's exception is re-raised unchanged. A solution's is counted, as an error
        or, for a ``Decline``, as declined; the route of the fallback is returned, except in
        strict mode, where a SolutionError (or, for a ``Decline``, a FallbackError) is raised.
        """
        resolved = self._resolved.get(key)
        # A route's function may wrap the solution's (the first-call input check, tracing).
        while resolved is not None and fn is not resolved[2] and hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        if resolved is None or resolved[2] is not fn:
            # Called from an except block: a bare raise re-raises the exception it handles.
            raise
        name, label, _ = resolved
        strict = self.state.strict
        if isinstance(exc, Decline):
            self._count("fallback_declined", "declined_hit", name)
            if strict:
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
                    f"{label} for definition {name!r} raised {type(exc).__name__}: {exc}"
                    f"{solutions.place(exc)}",
                    name,
                    label,
                )
            )
            if strict:
                if error is exc:
                    raise
                raise error from exc
            self.state.warn_once(("run", name, label), f"fibgen: {error}; such calls fall back")
            why = f"{label} failed"
        # Not the next family: the key is this family's. The API itself, else the reference.
        kind, fallback, _, _ = self._fallback_route(key, name, DISCARD, why, next_family=False)
        return (kind, fallback, DISCARD)

    def bad_result(self, key: Any, output: str | None, got: Any, want: Any = None) -> None:
        """Raise the SolutionError of an output that is not what the definition declares;
        ``want`` is what the call expects of it: (dtype, shape or None, device or None)."""
        name, label, _ = self._resolved.get(key, (self.name_of(key), "the solution", None))
        message = refusals.bad_result_message(label, name, self.outputs, output, got, want)
        raise SolutionError(message, name, label)

    def _count(self, outcome: str, hit_correction: str, name: str) -> None:
        with self.state.lock:
            self._tick(outcome, name)()
            self._tick(hit_correction, name)()

    def miss(self, *args: Any, **kwargs: Any) -> Any:
        """Fall back for a call that cannot be routed at all (unplanned, unknown selector).

        A run of a wrapper whose plan fibgen did not see, or whose state changed since
        (Note [plan state] in ``fibgen/runtime/routing/patching.py``), is counted as a guard
        fallback under ``plan:unseen`` or ``plan:changed``.
        """
        if SERVING.n and self.original() is not None and nested():
            # A call from inside a routed call goes to the original API (Note [re-entry]).
            kind, fn, tick, _ = self.nested_route(None)
            tick()
            return fn(*args, **kwargs)
        if self.then is not None:
            return self.then(*args, **kwargs)
        state = self.state
        missed = state.trace_missed
        if missed is not None:
            # Not a route tracing wraps: it is told, and counts it (Note [missed calls]).
            missed(self, self._unplanned(args, kwargs) or "unknown", None, None)
        if state.on:
            rule = self._unplanned(args, kwargs)
            with state.lock:
                (self._miss_tick(None) if rule is None else self._guard_tick(rule))()
            if state.strict:
                why = refusals.UNPLANNED.get(rule or "", "it matches no definition")
                raise FallbackError(f"{self.label}: the call is not routed: {why} (strict)")
        original = self.original()
        if original is None:
            why = "no original API to fall back to (for a plan/run API, call plan() first)"
            raise LookupError(f"{self.label}: this call matches no definition and {why}")
        return original(*args, **kwargs)

    def _unplanned(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
        """The rule a run without a usable plan is counted under; None for other misses."""
        if self.plans is None:
            return None
        instance = args[0] if args else kwargs.get("self")
        try:
            return self.plans.state(instance)
        except TypeError:  # an instance that cannot be weakly referenced
            return "plan:unseen"

    # --------------------------------------------------------------- on and off
    def turn_on(self) -> None:
        self.routes.clear()
        self._resolved.clear()
        self._tallies = {}
        self.direct = None

    def turn_off(self) -> None:
        self.routes.clear()
        self._resolved.clear()
        if self.state.tracer is not None:
            self.direct = None
        else:
            self.direct = self._first_direct if self._original is UNSET else self._original

    def adopt_original(self, original: Callable[..., Any]) -> None:
        """The API this dispatcher was patched over: what its fallbacks call."""
        self._original = original

    def forget_original(self) -> None:
        """Look the original API up again on the next fallback (it was restored, and may have
        been replaced since); an original given at registration stays."""
        if not self._fixed_original:
            self._original = UNSET

    def counts(self) -> dict[str, int]:
        """Calls per outcome since apply was last enabled."""
        totals = dict.fromkeys(OUTCOMES + ("failed_hit", "declined_hit"), 0)
        for (outcome, _), counter in list(self._tallies.items()):
            if outcome in totals:
                totals[outcome] += counters.read(counter)
        # A hit is a call a solution served: not one it raised on or handed back.
        totals["hit"] -= totals.pop("failed_hit") + totals.pop("declined_hit")
        return totals

    def rule_counts(self) -> dict[str, int]:
        """Refused calls per rule since apply was last enabled."""
        out: dict[str, int] = {}
        for (outcome, rule), counter in list(self._tallies.items()):
            if outcome == "rule" and rule is not None:
                n = counters.read(counter)
                if n:
                    out[rule] = out.get(rule, 0) + n
        return out


add_dispatch_code(Api.call_definition.__code__)
