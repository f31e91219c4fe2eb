"""Calls a dispatcher does not serve: refused by a rule, unplanned, or failed or declined by
their solution; each counted, explained, and sent where it can be served."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from fibgen.runtime.errors import Decline, FallbackError, SolutionError
from fibgen.runtime.routing.fallbacks import no_fallback, unservable
from fibgen.runtime.routing.state import DISCARD, ORIGINAL, SERVING, STATE, nested, warn_once
from fibgen.runtime.solutions import loading as solutions

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


class Refusals:
    """The refusals of an ``Api`` (a base of it): calls that fail a check or whose route raised."""

    __slots__ = ()

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
        if SERVING.n and self.original() is not None and nested():
            # A call from inside a routed call goes to the original API (Note [re-entry]).
            kind, fn, tick, _ = self.nested_route(key)
            tick()
            return (kind, fn, DISCARD)
        rule = self.rule_text(index)
        name = None if key is None else self.name_of(key)
        if self.then is not None:
            if name is None or name not in STATE.entries:
                return (ORIGINAL, self.then, DISCARD)
            # This family had a solution for the call: its rule is the reason, unless a later
            # family routes it (Note [a refusal handed down the chain]).
            with STATE.lock:
                tick = self._guard_tick(rule)
            return (ORIGINAL, self._hand_on(tick), DISCARD)
        missed = STATE.trace_missed
        if missed is not None:
            # Not a route tracing wraps: it is told, and counts it (Note [missed calls]).
            # What the call fails, worked out only for the first one, which is said.
            def why() -> str:
                return self._describe_failure(rule, args, kwargs)

            missed(self, "unknown" if key is None else "refused", name, why)
        if STATE.on:
            with STATE.lock:
                self._guard_tick(rule)()
            if STATE.strict:
                raise FallbackError(
                    f"{self.label}: {name or 'the call'} is not routed: "
                    f"{self._describe_failure(rule, args, kwargs)} (strict)"
                )
        kind, fn, _, _ = self._fallback_route(key, name, DISCARD, rule)
        if key is None and kind != ORIGINAL:
            # Without a key the reference cannot run in the dispatcher's place.
            why = "its key could not be read and there is no original API to fall back to"
            return (ORIGINAL, no_fallback(self.label, name, why), DISCARD)
        if kind != ORIGINAL:
            # The reference computes the definition, which a call that fails its rules is not
            # (another eps, another dtype): running it would be a silent wrong result.
            why = (
                f"{self._describe_failure(rule, args, kwargs)}, and there is no original API "
                "to run it (the definition's reference computes something else)"
            )
            return (ORIGINAL, unservable(self.label, name, why), DISCARD)
        return (kind, fn, DISCARD)

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
        # A route's function may wrap the solution's (the first-call input check, tracing).
        while resolved is not None and fn is not resolved[2] and hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        if resolved is None or resolved[2] is not fn:
            # Called from an except block: a bare raise re-raises the exception it handles.
            raise
        name, label, _ = resolved
        if isinstance(exc, Decline):
            self._count("fallback_declined", "declined_hit", name)
            if STATE.strict:
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
            if STATE.strict:
                if error is exc:
                    raise
                raise error from exc
            warn_once(("run", name, label), f"fibgen: {error}; such calls fall back")
            why = f"{label} failed"
        # Not the next family: the key is this family's. The API itself, else the reference.
        kind, fallback, _, _ = self._fallback_route(key, name, DISCARD, why, next_family=False)
        return (kind, fallback, DISCARD)

    def bad_result(self, key: Any, output: str | None, got: Any, want: Any = None) -> None:
        """Raise the SolutionError of an output that is not what the definition declares;
        ``want`` is what the call expects of it: (dtype, shape or None, device or None)."""
        name, label, _ = self._resolved.get(key, (self.name_of(key), "the solution", None))
        if output is None:
            want = f"a tuple of its {len(self.outputs)} outputs ({', '.join(self.outputs)})"
            raise SolutionError(
                f"{label} for definition {name!r} returned {_describe(got)}, not {want}",
                name,
                label,
            )
        expected = "what the definition declares for the call"
        if want is not None:
            dtype, shape, device = want
            expected = f"a {str(dtype).removeprefix('torch.')} tensor"
            if shape is not None:
                expected += f" of shape {list(shape)}"
            if device is not None:
                expected += f" on {device}"
        raise SolutionError(
            f"{label} for definition {name!r} returned {_describe(got)} as output "
            f"{output!r}; expected {expected}",
            name,
            label,
        )

    def _count(self, outcome: str, hit_correction: str, name: str) -> None:
        with STATE.lock:
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
        missed = STATE.trace_missed
        if missed is not None:
            # Not a route tracing wraps: it is told, and counts it (Note [missed calls]).
            missed(self, self._unplanned(args, kwargs) or "unknown", None, None)
        if STATE.on:
            rule = self._unplanned(args, kwargs)
            with STATE.lock:
                (self._miss_tick(None) if rule is None else self._guard_tick(rule))()
            if STATE.strict:
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
