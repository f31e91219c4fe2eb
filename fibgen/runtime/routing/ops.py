"""The dispatchers as torch.library custom ops: what torch.compile and CUDA graphs see.

Note [custom ops]
Under torch.compile, a generated dispatcher does not trace its routing (locks, counters and
tables that change at run time would break the graph or recompile it on every enable).
Instead its ``_compiled`` branch, which Dynamo traces, reads the call's key from shapes and
dtypes, allocates the buffers the API would fill, and calls one custom op:
``fibgen::<definition>`` for a definition an instance declares, ``fibgen::<family>`` for
others. The op's arguments are the API's tensors (the ones it writes declared mutable), its
numbers (``ints`` and ``floats``: under ``dynamic=True`` Dynamo makes a float or int read
from a module attribute or a global symbolic, a value no constant may hold) and ``args``,
the ``repr`` of the tuple of its other arguments with the numbers taken out, a constant of
the graph. The op's implementation rebuilds the call and runs the dispatcher eagerly, so
the routing
decision (solution, rules, fallback, stats) is made at run time: enabling, disabling or a
new best solution never recompiles a graph. Its fake implementation gives the outputs'
shapes and dtypes from the definition's axes.

A call the definition does not describe (another dtype or rank, an argument that is not a
plain value) is not turned into an op: it runs eagerly, outside the graph.

This module imports neither torch._dynamo (slow to import) nor the compiler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

_LIBRARIES: dict[str, torch.library.Library] = {}
_DECODED: dict[str, tuple[Any, ...]] = {}
_PLAIN = (type(None), bool, int, float, str, torch.dtype)
_NAMES = {"torch": torch, "inf": math.inf, "nan": math.nan}


def plain(values: Any) -> bool:
    """Whether ``repr`` of a value reads back to it: None, numbers, strings, dtypes, tuples."""
    if isinstance(values, (tuple, list)):
        return all(plain(v) for v in values)
    return isinstance(values, _PLAIN)


def pack(values: tuple[Any, ...]) -> tuple[list[Any], list[Any], str] | None:
    """(ints, floats, args) of an op's non-tensor arguments, or None where one is not plain.

    Traced by Dynamo: numbers, symbolic or not, go to ``ints`` and ``floats`` and leave a
    ``None`` in the tuple whose ``repr`` is ``args``; ``kinds`` says which was which.
    """
    ints: list[Any] = []
    floats: list[Any] = []
    kinds = ""
    rest = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if not plain(v):
                return None
            rest.append(v)
            kinds += "-"
        elif isinstance(v, int):
            ints.append(v)
            rest.append(None)
            kinds += "i"
        else:
            floats.append(v)
            rest.append(None)
            kinds += "f"
    return ints, floats, repr((kinds, tuple(rest)))


def decode(text: str, ints: Any = (), floats: Any = ()) -> tuple[Any, ...]:
    """The tuple that ``pack`` made ``(ints, floats, text)`` of (the text parsed once)."""
    decoded = _DECODED.get(text)
    if decoded is None:
        decoded = _DECODED[text] = eval(text, {"__builtins__": {}}, _NAMES)  # our own repr
    kinds, rest = decoded
    if not ints and not floats:
        return rest
    numbers = {"i": iter(ints), "f": iter(floats)}
    return tuple(v if k == "-" else next(numbers[k]) for k, v in zip(kinds, rest))


def fresh(value: Any, *inputs: Any) -> Any:
    """An op's output, copied when it shares storage with an argument (ops may not alias)."""
    if isinstance(value, torch.Tensor) and value.numel():
        ptr = value.untyped_storage().data_ptr()
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr:
                return value.clone()
    return value


def define(
    namespace: str,
    names: Mapping[Any, str],
    family: str,
    schema: str,
    impl: Callable[..., Any],
    fake: Callable[..., Any],
) -> tuple[dict[Any, Any], Any]:
    """Register one op per definition name and one for the family; return their overloads.

    A name taken already (a module generated twice in one process) gets a numbered suffix.
    """
    lib = _LIBRARIES.get(namespace)
    if lib is None:
        lib = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    ops_namespace = getattr(torch.ops, namespace)

    def one(name: str) -> Any:
        unique, n = name, 1
        while hasattr(ops_namespace, unique):
            n += 1
            unique = f"{name}_{n}"
        lib.define(unique + schema)
        lib.impl(unique, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{namespace}::{unique}", fake, lib=lib)
        return getattr(ops_namespace, unique).default

    by_key = {key: one(name) for key, name in names.items()}
    return by_key, one(family)
