"""Where a call no solution serves goes: the next family, the original API, the reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fibgen.runtime.errors import FallbackError
from fibgen.runtime.routing import patching
from fibgen.runtime.routing.state import DISCARD, ORIGINAL, RETURNS, STATE, UNSET


def compile_reference(text: str, name: str) -> Callable[..., Any]:
    run = STATE.references.get(text)
    if run is None:
        namespace: dict[str, Any] = {"__name__": f"fibgen_reference_{name}"}
        exec(compile(text, f"<reference of {name}>", "exec"), namespace)
        run = STATE.references[text] = namespace["run"]
    return run


def no_fallback(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise LookupError(f"{label}: no solution for {name or 'this call'} and {why}")

    return fail


def unservable(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise FallbackError(f"{label}: {name or 'this call'} cannot be served: {why}")

    return fail


def _strict_failure(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise FallbackError(f"{label}: {name or 'this call'} is not routed: {why} (strict)")

    return fail


class Fallbacks:
    """The fallbacks of an ``Api`` (a base of it): what a call takes when it is not served."""

    __slots__ = ()

    def original(self) -> Callable[..., Any] | None:
        """The API this dispatcher stands for, as it was before patching; None without one."""
        if self._original is UNSET:
            if self.path is None:
                self._original = None
            elif self.path in STATE.originals:
                self._original = STATE.originals[self.path]
            else:
                self._original = patching.original(self.path)
            if self._original is not None:
                patching.adopt_defaults(self.function, self._original)
        return self._original

    def _first_direct(self, *args: Any, **kwargs: Any) -> Any:
        original = self.original()
        with STATE.lock:
            if not STATE.on and STATE.tracer is None:
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
        if key is not UNSET and self.params:
            fields = key if isinstance(key, tuple) else (key,)
            values.update((f, v) for f, v in zip(self.key_fields, fields) if f in self.params)
        if any(p not in values for p in self.params):
            return None
        prelude = "".join(f"{p} = {values[p]!r}\n" for p in self.params)
        return prelude + self.family_reference

    def _reference(self, key: Any, name: str | None) -> Callable[..., Any] | None:
        text = self._reference_text(key, name)
        return None if text is None else compile_reference(text, name or self.label)

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
            return (ORIGINAL, then, DISCARD, None)
        if STATE.on and STATE.strict:
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
        return (ORIGINAL, no_fallback(self.label, name, why), tick, None)

    def _reference_or_fail(self, key: Any, name: str) -> Callable[..., Any]:
        reference = self._reference(key, name)
        if reference is None:
            return no_fallback(self.label, name, "no reference to fall back to")
        return reference
