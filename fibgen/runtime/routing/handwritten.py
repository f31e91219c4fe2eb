"""Routing of hand-written code: the ``apply`` decorator and function form."""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from fibgen.runtime.caller import add_dispatch_code
from fibgen.runtime.errors import FallbackError
from fibgen.runtime.routing.fallbacks import compile_reference
from fibgen.runtime.routing.registry import register_api
from fibgen.runtime.routing.state import ORIGINAL, SERVING, STATE
from fibgen.runtime.solutions import loading as solutions
from fibgen.runtime.tracing.checks import checker, contract, one_byte_float

# Note [the function form's fallback]
# ``apply(name, args, kwargs, fallback)`` is routed by one dispatcher per name (or resolver),
# counted in ``stats()`` as ``fibgen.runtime.apply('<name>')``, whatever fallback each call
# gives: callers pass a fresh lambda or partial per call as often as not, and a dispatcher per
# fallback registered an API on every such call (300 µs a call, and one more routing table
# kept for the life of the process). The dispatcher's original API is ``_call_fallback``,
# which calls the fallback of the call in progress on this thread, held in a thread-local for
# the length of the call and restored after it: a solution that calls ``apply`` again gets its
# own call's fallback, and the tracer's and the routes' wrappers around the original reach it.
# A resolver given to the function form is called first and the call routed by the name it
# returns, so a fresh resolver per call costs nothing more either. Messages about such calls
# name the call (``apply('<name>')``), not the fallback, and what is said once is said once
# per name, whichever fallback the calls give.
_handwritten: dict[Any, Callable[..., Any]] = {}
_current = threading.local()


def _call_fallback(*args: Any, **kwargs: Any) -> Any:
    """The fallback of the function-form call in progress on this thread."""
    return _current.fallback(*args, **kwargs)


def _label(target: str | Callable[..., str]) -> str:
    """How ``stats()`` and messages name the function form's calls of ``target``."""
    return f"fibgen.runtime.apply({getattr(target, '__qualname__', target)!r})"


# The names hand-written code routes (``@apply("name")``), and whether some code routes
# names its resolver computes, which cannot be known ahead: what enable_apply checks the
# names it is given against (Note [unknown names] in fibgen/runtime/routing/apply.py).
routed_names: set[str] = set()
resolvers: list[Callable[..., str]] = []


# Note [hand-written inputs]
# A generated dispatcher refuses a call whose tensors are not its definition's (dtype, rank,
# const sizes, one size per axis) before any solution sees it. Hand-written code names the
# definition and passes its arguments as given, so the same check is made here, where the
# arguments are the definition's inputs: by position in its order or by name, with or
# without its outputs, as flashinfer-bench's apply passes them. A destination-passing call's
# output buffers are checked as its inputs are (never None; one size per axis with the
# inputs). A call that fails it is not given to the solution: it goes to the fallback,
# counted as ``fallback_guard`` under the rule ``tensor:<input or output>`` and said once
# with the reason; strict mode raises. So is a call whose arguments are not the definition's
# at all (a decorated function of another signature, ``rms(x, w, eps)``; too many or too
# few arguments; a keyword no input or output has), under the rule ``arguments``: given to
# the solution, which takes the definition's arguments, it could only fail, and that is the
# caller's mistake, not the solution's; unless the solution was made to take more (a callable
# given to enable_apply with ``**options``, say), which then gets them as given. The reference
# standing in for a missing fallback
# (Note [apply without a fallback]) refuses such calls too, with a ValueError saying why: on
# another shape it computes nothing the definition means. A call whose definition is in no
# dataset apply was enabled on and not in fibgen's catalogue is passed on unchecked. The
# definition is the one of the dataset the solution came from (else the catalogue's), looked
# up again whenever enable_apply replaces the routing table. A one-byte float input (fp8,
# packed fp4, e8m0 scales) may come as its own dtype or as its bytes (uint8 or int8): such
# tensors are passed as uint8 as often as not.

_Check = Callable[[tuple[Any, ...], Mapping[str, Any]], "tuple[str | None, str] | None"]


def _find_definition(name: str) -> tuple[dict[str, Any] | None, list[Any]]:
    """The definition JSON of ``name`` (the datasets apply is on first, then the catalogue),
    and the datasets looked in."""
    with STATE.lock:
        roots = sorted({e.root for e in STATE.entries.values() if e.root}, key=str)
    for root in [*roots, None]:
        # Each dataset's own (find_definition's catalogue fallback would hide the later ones).
        found = solutions.own_definition(name, root)
        if found is not None:
            return found[0], roots
    return None, roots


class _InputCheck(NamedTuple):
    """The check of a hand-written call's arguments against a definition (Note [hand-written
    inputs]): ``by_count`` holds the check of a call by position per count of its arguments
    (the inputs; the inputs and the outputs), ``any_call`` takes any call; each gives the
    first argument that differs and why (None and why for arguments that are not the
    definition's), or None. ``result`` checks what a value-style call returned (Note
    [hand-written results])."""

    by_count: Mapping[int, Callable[[Sequence[Any]], "tuple[str, str] | None"]]
    any_call: _Check
    result: Callable[[Sequence[Any], Any], "tuple[str | None, Any, Any] | None"]
    inputs: tuple[str, ...]


# Note [hand-written results]
# A value-style call (the definition's inputs, by position, by name or both) returns its
# outputs, or None where the code writes them in place, as FlashInfer's in-place APIs do.
# None is returned as given: hand-written routing cannot tell in-place code from code that
# forgot to return, and running the fallback after in-place code would apply its effect
# twice. Anything else is checked as a generated dispatcher checks it (Note [result check]
# in fibgen/runtime/checking/result_check.py): one tensor per output (a tuple or list of
# them for several), of the declared dtype, of the shape the definition gives it for this
# call (const axes, and var axes read off the inputs that carry them or the integer scalar
# input that binds one), on the device of the first input tensor; an output whose shape no
# input binds is held to its dtype and rank, and a one-byte float output (fp8, packed fp4)
# may also come as its bytes (uint8 or int8), as FlashInfer's own functions return them. A
# result that is not goes to the fallback, counted as the solution's error and said once;
# strict mode raises. (Hand-written routing does not probe whether a solution wrote its
# inputs: one that did so and then returned a wrong result has them written again by the
# fallback.) A destination-passing call's outputs are the caller's buffers: nothing comes
# back to check.


def _result_check(
    definition: Mapping[str, Any],
) -> Callable[[Sequence[Any], Any], tuple[str | None, Any, Any] | None]:
    """What ``_InputCheck.result`` checks for ``definition``: given the call's input values in
    the definition's order and what it returned, None, or (output, what it got, what was
    expected) of the first output that differs (output None: the result is not the tuple of
    outputs it should be). Written out per definition, as the input check is (Note
    [written-out checks] in fibgen/runtime/tracing/checks.py): only integers go into its
    source."""
    import torch

    from fibgen.format.models import var_axis_scalars
    from fibgen.runtime.checking import result_check
    from fibgen.runtime.inputs.make import torch_dtype

    specs = list(definition["inputs"].values())
    names = list(definition["inputs"])
    axes = definition.get("axes") or {}
    consts = {n: int(a["value"]) for n, a in axes.items() if a.get("type") == "const"}
    # The inputs a call always has: an optional one may be None.
    required = [i for i, t in enumerate(specs) if not t.get("optional")]
    carriers: dict[str, tuple[int, int]] = {}  # axis -> (input index, dim)
    for i in required:
        for d, axis in enumerate(specs[i].get("shape") or ()):
            carriers.setdefault(axis, (i, d))
    scalars = {a: names.index(n) for a, n in var_axis_scalars(axes, definition["inputs"]).items()}
    tensors = [i for i in required if specs[i].get("shape") is not None]
    namespace: dict[str, Any] = {"_reads": result_check.LIVE, "_Tensor": torch.Tensor}
    namespace.update(_U8=torch.uint8, _I8=torch.int8)
    outputs = list(definition["outputs"].items())
    lines = ["def check(values, result):"]
    if len(outputs) == 1:
        lines.append("    r0 = result")
    else:
        lines += [
            f"    if not isinstance(result, (tuple, list)) or len(result) != {len(outputs)}:",
            "        return None, result, None",
        ]
        lines += [f"    r{k} = result[{k}]" for k in range(len(outputs))]
    if tensors:
        lines += ["    same = _reads['same']", "    shape_of = _reads['shape_of']"]
        lines.append(f"    like = values[{tensors[0]}]")
        read = sorted(
            {
                carriers[a][0]
                for _, spec in outputs
                for a in spec.get("shape") or ()
                if a in carriers and a not in consts
            }
        )
        lines += [f"    s{i} = shape_of(values[{i}])" for i in read]
    for k, (name, spec) in enumerate(outputs):
        namespace[f"_n{k}"] = name
        shape = spec.get("shape")
        dims = []
        for axis in shape or ():
            if axis in consts:
                dims.append(str(consts[axis]))
            elif axis in carriers:
                i, d = carriers[axis]
                dims.append(f"s{i}[{d}]")
            elif axis in scalars:
                dims.append(f"int(values[{scalars[axis]}])")
        if shape is None:
            continue  # a scalar output
        try:
            namespace[f"_d{k}"] = torch_dtype(spec["dtype"])
        except (KeyError, TypeError, ValueError):
            namespace[f"_d{k}"] = None
        if not tensors or namespace[f"_d{k}"] is None:
            # No input to compare devices with, or a dtype this torch lacks.
            lines += [
                f"    if not isinstance(r{k}, _Tensor):",
                f"        return _n{k}, r{k}, None",
            ]
            continue
        if len(dims) == len(shape):
            size = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
        else:
            size = str(len(shape))  # an axis no input binds: its rank only
        dtypes = [f"_d{k}"]
        if one_byte_float(spec.get("dtype")):
            dtypes += ["_U8", "_I8"]  # or its bytes
        ok = " or ".join(f"same(r{k}, {d}, {size}, like)" for d in dtypes)
        lines += [
            f"    if not ({ok}):",
            f"        return _n{k}, r{k}, (_d{k}, {size if len(dims) == len(shape) else None}, "
            "like.device)",
        ]
    lines.append("    return None")
    exec(compile("\n".join(lines), "<fibgen result check>", "exec"), namespace)
    check: Callable[[Sequence[Any], Any], tuple[str | None, Any, Any] | None] = namespace["check"]
    return check


def _input_check(definition: Mapping[str, Any]) -> _InputCheck:
    """The check of a hand-written call's arguments against ``definition``."""
    inputs = tuple(definition["inputs"])
    outputs = tuple(definition["outputs"])
    every = inputs + outputs
    tensors, consts = contract(definition)
    buffers = contract(definition, "outputs")[0]
    # A one-byte float (fp8, packed fp4, e8m0 scales) is passed as uint8 as often as not
    # (FlashInfer's own calls do; a dispatcher views it before its check).
    check = checker(inputs, tensors, consts, bytes_for_floats=True)
    # A destination-passing call's buffers are checked as its inputs are.
    dps = checker(
        every, tensors + buffers, consts, bytes_for_floats=True, outputs=frozenset(outputs)
    )
    by_count = {len(inputs): check, len(every): dps}

    def any_call(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str | None, str] | None:
        if not kwargs and len(args) in by_count:
            return by_count[len(args)](args)
        values = solutions.bind_arguments(inputs, outputs, args, kwargs)
        if isinstance(values, str):
            return None, values  # not the definition's arguments
        if len(values) == len(every):
            return dps([values[n] for n in every])
        return check([values[n] for n in inputs])

    return _InputCheck(by_count, any_call, _result_check(definition), inputs)


# The signatures of the solutions that calls of other arguments than the definition's reach.
_signatures: weakref.WeakKeyDictionary[Callable[..., Any], inspect.Signature | None] = (
    weakref.WeakKeyDictionary()
)


def _takes(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether the solution behind route function ``fn`` (a callable given to enable_apply,
    or a Solution's entry point, under the wrappers of its calling style and of tracing)
    takes ``args`` and ``kwargs``: one made for more than the definition's arguments (say
    ``**options``) gets them as given (Note [hand-written inputs])."""
    if fn in _signatures:
        signature = _signatures[fn]
    else:
        try:
            signature = inspect.signature(inspect.unwrap(fn))
        except (TypeError, ValueError):
            signature = None  # a builtin, a C++ entry: it says for itself
        _signatures[fn] = signature
    if signature is None:
        return True
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def _route_handwritten(
    fallback: Callable[..., Any], target: str | Callable[..., str], label: str | None = None
) -> Callable[..., Any]:
    if label is None:
        label = f"{getattr(fallback, '__module__', '?')}.{getattr(fallback, '__qualname__', '?')}"
    api = register_api(label, fallback, patch=False, by_name=True, original=fallback)
    if callable(target):
        resolvers.append(target)
    else:
        routed_names.add(target)
    routes = api.routes
    resolver = target if callable(target) else None
    # Per name: the routing table a check was made for (enable_apply replaces the table, and
    # with it the dataset a name's definition comes from), and the check.
    checks: dict[Any, tuple[Any, _InputCheck | None]] = {}
    # The function form's calls name no function of the caller's: the call is named.
    where = "" if label.startswith("fibgen.runtime.") else f" in {label}"

    def refused(key: Any, failed: tuple[str | None, str]) -> None:
        """Count a call whose arguments are not its definition's; strict mode raises."""
        rule = "arguments" if failed[0] is None else f"tensor:{failed[0]}"
        with STATE.lock:
            api._guard_tick(rule)()
        missed = STATE.trace_missed
        if missed is not None:  # tracing counts it
            if failed[0] is None:
                missed(api, "handwritten", str(key), ("arguments", failed[1]))
            else:
                missed(api, "mismatched", str(key), lambda: failed[1])
        if STATE.strict:
            raise FallbackError(f"{label}: {key} is not routed: {failed[1]} (strict)")
        STATE.warn_once(
            ("hand-written inputs", label, key, rule),
            f"fibgen: apply({key!r}){where}: {failed[1]}; such calls are not given to the "
            "solution and go to the fallback",
        )

    def check_of(key: Any) -> tuple[Any, _InputCheck | None]:
        """The routing table now, and the check of ``key``'s calls under it."""
        table = STATE.entries
        entry = table.get(str(key))
        # The definition of the dataset the solution came from, else the catalogue's.
        definition = solutions.find_definition(str(key), getattr(entry, "root", None))
        return table, None if definition is None else _input_check(definition)

    def unknown(key: Any) -> None:
        """Say once a name that nothing apply is on defines: most often a misspelt one."""
        name = str(key)
        if not STATE.on or name in STATE.entries:
            return
        definition, roots = _find_definition(name)
        if definition is None:
            places = " or ".join([f"{r}/definitions" for r in roots] + ["fibgen's catalogue"])
            STATE.warn_once(
                ("unknown hand-written name", name),
                f"fibgen: apply({name!r}){where}: no solution is registered for this name "
                f"and no definition of it is in {places}{_closest(name)}; its calls run the "
                "fallback",
            )

    def routed(*args: Any, **kwargs: Any) -> Any:
        if resolver is None:
            key = target
        else:
            key = resolver(*args, **kwargs)
            if not isinstance(key, str):
                raise TypeError(_resolved_message(resolver, key))
        route = routes.get(key)
        if route is None or SERVING.n:
            if route is None:
                unknown(key)
            route = api.resolve(key)
        kind, fn, tick, _ = route
        if kind != ORIGINAL:  # a solution: the arguments must be its definition's inputs
            cached = checks.get(key)
            if cached is None or cached[0] is not STATE.entries:
                cached = checks[key] = check_of(key)
            check = cached[1]
            if check is not None:
                positional = None if kwargs else check.by_count.get(len(args))
                failed: tuple[str | None, str] | None
                if positional is not None:
                    failed = positional(args)
                else:
                    failed = check.any_call(args, kwargs)
                if failed is not None and (failed[0] is not None or not _takes(fn, args, kwargs)):
                    refused(key, failed)
                    return fallback(*args, **kwargs)
        tick()
        if kind == ORIGINAL:
            # The caller's own code: the calls it makes are routed as any other (Note
            # [re-entry] counts only calls made while a solution serves one).
            return fn(*args, **kwargs)
        _serving = SERVING  # bound: a routed call is in progress (Note [re-entry])
        _serving.n += 1
        try:
            result = fn(*args, **kwargs)
            if check is not None and result is not None:  # Note [hand-written results]
                values: Sequence[Any] | str | None = None  # the inputs of a value-style call
                if not kwargs:
                    values = args if len(args) == len(check.inputs) else None
                else:
                    values = solutions.input_values(check.inputs, (), args, kwargs)
                if values is not None and not isinstance(values, str):
                    bad = check.result(values, result)
                    if bad is not None:
                        api.bad_result(key, *bad)
            return result
        except Exception as exc:
            detour = api.failed(key, fn, exc, *args, **kwargs)
        finally:
            _serving.n -= 1
            # Unbound: the frame no longer says a call is served (``nested`` reads it).
            del _serving
        # The solution failed: its fallback, served no more (through tracing, which recorded
        # the call already, Note [recorded hand-written calls] in tracing/handwritten.py).
        traced = STATE.trace_detour
        if traced is not None and isinstance(key, str):
            return traced(key, detour[1], args, kwargs)
        return detour[1](*args, **kwargs)

    add_dispatch_code(routed.__code__)
    return functools.wraps(fallback)(routed)


# Note [apply without a fallback]
# flashinfer-bench's apply(name, args) takes `fallback` as optional and raises on a miss
# without one ("Apply miss for ... and no fallback provided"). Here the definition's
# reference stands in for it: it computes the right result in either calling style, so a
# call that no solution serves (a miss, a failed or declining solution, apply off) still
# returns what the definition says, and is counted like any fallback. The definition is
# looked up in the datasets apply was enabled on, then in fibgen's catalogue; a name found
# in neither raises a LookupError naming it. Strict mode raises as it does with a fallback.

_reference_fallbacks: dict[Any, Callable[..., Any]] = {}


def _closest(name: str) -> str:
    """`` (did you mean 'a'?)`` for the catalogue's names close to ``name``, else ``""``."""
    import difflib

    from fibgen.paths import builtin_definition_names

    close = difflib.get_close_matches(name, sorted(builtin_definition_names()), n=3)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def _reference_runner(name: str) -> Callable[..., Any]:
    """The definition's reference, standing in for a missing fallback (Note [apply without a
    fallback])."""
    # Per definition found (each dataset's is its own object, held here so that its id is not
    # reused): the reference made callable in either style, and the check of a call against it.
    made: dict[int, tuple[Any, Callable[..., Any], _InputCheck]] = {}

    def run_reference(*call_args: Any, **call_kwargs: Any) -> Any:
        definition, roots = _find_definition(name)
        if definition is None:
            where = " or ".join([f"{r}/definitions" for r in roots] + ["fibgen's catalogue"])
            raise LookupError(
                f"apply({name!r}): no solution serves this call and no fallback was "
                f"given, and definition {name!r} is not in {where} to run its "
                f"reference{_closest(name)}; pass fallback=, or enable apply on the "
                "dataset that defines it"
            )
        found = made.get(id(definition))
        if found is None:
            reference = compile_reference(definition["reference"], name, STATE.references)
            run = solutions.either_style(reference, definition, False, f"the reference of {name!r}")
            found = made[id(definition)] = (definition, run, _input_check(definition))
        _, run, check = found
        failed = check.any_call(call_args, call_kwargs)
        if failed is not None:
            raise ValueError(
                f"apply({name!r}): no fallback was given, and neither a solution nor "
                f"the definition's reference can be given this call: {failed[1]}"
            )
        STATE.warn_once(
            ("reference fallback", name),
            f"fibgen: apply({name!r}) without a fallback: calls no solution serves "
            "run the definition's reference (slow)",
        )
        return run(*call_args, **call_kwargs)

    return run_reference


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
    if args is None and kwargs is None:
        if fallback is not None:
            raise TypeError(
                f"apply({target!r}, fallback=...): no arguments to call with; pass args= or "
                "kwargs= for a call, or decorate a function with @apply(name), whose body is "
                "its fallback"
            )
        if not isinstance(target, str) and not callable(target):
            raise TypeError(_target_message(target))
        return functools.partial(_route_handwritten, target=target)
    if (
        type(args) is not tuple
        or kwargs is not None
        or type(target) is not str
        or (fallback is not None and not callable(fallback))
    ):
        args, kwargs, name = _call_of(target, args, kwargs, fallback)
    else:
        name = target
    if fallback is None:
        fallback = _reference_fallbacks.get(name)
        if fallback is None:
            fallback = _reference_fallbacks.setdefault(name, _reference_runner(name))
    routed = _handwritten.get(name)  # a dict read needs no lock
    if routed is None:
        with STATE.lock:
            routed = _handwritten.get(name)
            if routed is None:
                routed = _handwritten[name] = _route_handwritten(_call_fallback, name, _label(name))
    local = _current
    outer = getattr(local, "fallback", None)
    local.fallback = fallback
    try:
        if kwargs:
            return routed(*args, **kwargs)
        return routed(*args)
    finally:
        local.fallback = outer


def _target_message(target: Any) -> str:
    return (
        f"apply(): the target is a {type(target).__name__} ({target!r}); give a definition "
        "name, or a resolver: a function of the call's arguments that returns one"
    )


def _call_of(
    target: Any, args: Any, kwargs: Any, fallback: Any
) -> tuple[tuple[Any, ...], Mapping[str, Any] | None, str]:
    """A function-form call's arguments, checked, and the name it routes by (a resolver is
    called with them: the call is routed by the name it returns, Note [the function form's
    fallback])."""
    if args is None:
        args = ()
    elif isinstance(args, list):
        args = tuple(args)
    elif not isinstance(args, tuple):
        raise TypeError(
            f"apply({target!r}, args, ...): args is a {type(args).__name__}; pass the call's "
            "positional arguments as a tuple, e.g. args=(x, weight)"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(
            f"apply({target!r}, args, kwargs, fallback): kwargs is a {type(kwargs).__name__}, "
            "not a mapping of keyword arguments; pass the fallback by keyword: "
            "apply(name, args, fallback=f)"
        )
    if fallback is not None and not callable(fallback):
        raise TypeError(f"apply({target!r}): fallback is a {type(fallback).__name__}, not callable")
    if isinstance(target, str):
        return args, kwargs, target
    if not callable(target):
        raise TypeError(_target_message(target))
    name = target(*args, **(kwargs or {}))
    if not isinstance(name, str):
        raise TypeError(_resolved_message(target, name))
    return args, kwargs, name


def _resolved_message(resolver: Callable[..., Any], name: Any) -> str:
    return (
        f"apply(): the resolver {getattr(resolver, '__qualname__', resolver)!r} returned "
        f"{name!r}, not a definition name"
    )
