"""How a call a dispatcher does not serve is explained: the rule it failed, what about its
arguments fails it, what a solution returned instead of its outputs."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

# Rule indices of checks that are not rules of the family (Note [the dispatch contract]).
UNEVALUABLE = -2  # a rule raised while it was checked
NO_KEY = -3  # the key (or a `let` before it) could not be computed

# Why a run of a plan/run wrapper is not routed, by the rule it is counted under.
UNPLANNED = {
    "plan:unseen": "fibgen saw no plan() of this wrapper since apply was enabled",
    "plan:changed": (
        "the wrapper's plan state changed after the plan() fibgen saw (a plan() through a "
        "method bound before apply was enabled, or forward())"
    ),
}

# An API's tensors as a dispatcher declares them: input → (dtype or None, axis names).
Tensors = Mapping[str, tuple[str | None, tuple[str, ...]]]
# The caller's output buffers it checks: output → (parameter, dtype or None, axis names).
Buffers = Mapping[str, tuple[str, str | None, tuple[str, ...]]]


def rule_text(rules: tuple[str, ...], index: int) -> str:
    """How a failed check is called in stats and messages."""
    if index == UNEVALUABLE:
        return "unevaluable"
    if index == NO_KEY:
        return "key"
    return rules[index]


def describe_failure(
    rule: str,
    function: Callable[..., Any],
    inputs: tuple[str, ...],
    tensors: Tensors,
    trace_inputs: Callable[..., tuple[Any, ...]] | None,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    buffers: Buffers | None = None,
) -> str:
    """What about a call of ``function`` fails ``rule``, in words."""
    if rule == "unevaluable":
        return "a rule could not be evaluated on its arguments"
    if rule == "key":
        read = None if trace_inputs is None else lambda: trace_inputs(*args, **kwargs)
        return "its key could not be read from its arguments" + _unreadable(inputs, tensors, read)
    if rule.startswith("tensor:") and trace_inputs is not None:
        try:
            values = dict(zip(inputs, trace_inputs(*args, **kwargs)))
        except Exception:
            values = {}
        name = rule[7:]
        if buffers and name in buffers:
            problem = _buffer_problem(
                name, buffers[name], function, values, inputs, tensors, args, kwargs
            )
        else:
            problem = tensor_problem(name, values, inputs, tensors)
        if problem is not None:
            return problem
    shown = []
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
        bound.apply_defaults()
        for part in rule.split(","):
            if part in bound.arguments:
                shown.append(f"{part}={_short(bound.arguments[part])}")
    except (TypeError, ValueError):
        pass
    values_shown = f" ({', '.join(shown)})" if shown else ""
    return f"it fails the rule on {rule}{values_shown}"


def _unreadable(
    inputs: tuple[str, ...], tensors: Tensors, values: Callable[[], tuple[Any, ...]] | None
) -> str:
    """Which argument a key could not be read from, where one shows (``values``: the call's
    inputs, in ``inputs`` order): ``: input x is a list, not a tensor``; else nothing."""
    if values is None:
        return ""
    try:
        given = values()
    except Exception as exc:  # noqa: BLE001 - the arguments do not bind: say how
        return f": {type(exc).__name__}: {exc}"
    for name, value in zip(inputs, given):
        if name in tensors and value is not None and not isinstance(value, torch.Tensor):
            return f": input {name} is a {type(value).__name__}, not a tensor"
    return ""


def _buffer_problem(
    name: str,
    buffer: tuple[str, str | None, tuple[str, ...]],
    function: Callable[..., Any],
    values: Mapping[str, Any],
    inputs: tuple[str, ...],
    tensors: Tensors,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> str | None:
    """What makes the caller's buffer of output ``name`` not the definition's output."""
    param, dtype, shape = buffer
    try:
        value = inspect.signature(function).bind(*args, **kwargs).arguments.get(param)
    except (TypeError, ValueError):
        return None
    what = f"the {param}= buffer"
    problem = tensor_problem(
        name, {**values, name: value}, inputs, {**tensors, name: (dtype, shape)}, what
    )
    if problem is not None:
        return problem
    device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)), None)
    if isinstance(value, torch.Tensor) and device is not None and value.device != device:
        return f"{what} is on {value.device}, the inputs are on {device}"
    if isinstance(value, torch.Tensor):
        # A dtype or a size the definition takes from the call's key (a dtype parameter, an
        # axis no input carries): the buffer as given, beside what it stands for.
        got = str(value.dtype).removeprefix("torch.")
        return (
            f"{what} ({got} {list(value.shape)}) is not the definition's {name} "
            f"[{', '.join(shape)}] for this call"
        )
    return None


def tensor_problem(
    name: str,
    values: Mapping[str, Any],
    inputs: tuple[str, ...],
    tensors: Tensors,
    what: str | None = None,
) -> str | None:
    """What makes input ``name`` of a call (or ``what`` it is) not the definition's, as the
    launchers say it."""
    if name not in values or name not in tensors:
        return None
    value = values[name]
    dtype, shape = tensors[name]
    what = what or f"input {name}"
    if not isinstance(value, torch.Tensor):
        return f"{what} is a {type(value).__name__}, not a tensor"
    got = str(value.dtype).removeprefix("torch.")
    if dtype is not None and got != dtype and value.dtype != _torch_dtype(dtype):
        return f"{what} is {got}, the definition's is {dtype}"
    if value.ndim != len(shape):
        return (
            f"{what} has {value.ndim} dims, the definition's has {len(shape)} "
            f"[{', '.join(shape)}]"
        )
    first: dict[str, tuple[str, int, int]] = {}
    for other in inputs:
        t = values.get(other)
        if other in tensors and isinstance(t, torch.Tensor):
            for i, axis in enumerate(tensors[other][1]):
                if i < t.ndim:
                    first.setdefault(axis, (other, i, int(t.shape[i])))
    for i, axis in enumerate(shape):
        where = first.get(axis)
        if where is not None and where[0] != name and where[2] != value.shape[i]:
            return (
                f"{what} has size {value.shape[i]} along axis {axis} (dim {i}), "
                f"expected {where[2]} as in {where[0]} (dim {where[1]})"
            )
    return None


def _torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a definition's dtype name (``float4_e2m1``: two values a byte)."""
    from fibgen.runtime.inputs.specs import InputGenerationError, torch_dtype

    try:
        return torch_dtype(name)
    except InputGenerationError:  # a name the runtime does not know: compared by name
        return None


def bad_result_message(
    label: str, name: str | None, outputs: tuple[str, ...], output: str | None, got: Any, want: Any
) -> str:
    """Why a value-returning solution's result is not the definition's outputs; ``want`` is
    what the call expects of ``output``: (dtype, shape or None, device or None)."""
    if output is None:
        expected = f"a tuple of its {len(outputs)} outputs ({', '.join(outputs)})"
        return f"{label} for definition {name!r} returned {_describe(got)}, not {expected}"
    expected = "what the definition declares for the call"
    if want is not None:
        dtype, shape, device = want
        expected = f"a {str(dtype).removeprefix('torch.')} tensor"
        if shape is not None:
            expected += f" of shape {list(shape)}"
        if device is not None:
            expected += f" on {device}"
    return (
        f"{label} for definition {name!r} returned {_describe(got)} as output "
        f"{output!r}; expected {expected}"
    )


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
