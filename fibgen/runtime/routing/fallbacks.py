"""The callables a call no solution serves may be given: a reference compiled from its
definition's text, or one that raises saying why there is nothing to run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fibgen.runtime.errors import FallbackError


def compile_reference(
    text: str, name: str, cache: dict[str, Callable[..., Any]]
) -> Callable[..., Any]:
    """The ``run`` of a reference's source, compiled once per text into ``cache``."""
    run = cache.get(text)
    if run is None:
        namespace: dict[str, Any] = {"__name__": f"fibgen_reference_{name}"}
        exec(compile(text, f"<reference of {name}>", "exec"), namespace)
        run = cache[text] = namespace["run"]
    return run


def no_fallback(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise LookupError(f"{label}: no solution for {name or 'this call'} and {why}")

    return fail


def unservable(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise FallbackError(f"{label}: {name or 'this call'} cannot be served: {why}")

    return fail


def strict_failure(label: str, name: str | None, why: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise FallbackError(f"{label}: {name or 'this call'} is not routed: {why} (strict)")

    return fail
