"""Apply: route live calls to registered solutions by definition name.

Note [the dispatch contract]
A generated dispatcher module calls ``register_api`` once, at the end of its import, and
keeps the returned ``Api`` as ``_api`` and ``_api.routes`` as ``_routes``. Its function does,
in straight-line code:

1. ``if _api.direct is not None: return _api.direct(<the API's own arguments>)``. The runtime
   sets ``direct`` to the original API while apply is off (resolved lazily on the first
   call), and to None while apply is on or when there is no original to call.
2. ``key = <const values read from the arguments>`` (one value, or a tuple in key order).
3. ``route = _routes.get(key)``; when None, ``route = _api.resolve(key)``. The runtime owns
   ``routes`` and empties it in place on enable and disable; ``resolve`` fills it once per
   key, except while a CUDA graph is being captured (see ``resolve``).
4. ``kind, fn, tick = route``; ``tick()`` counts the call (a bound ``itertools.count``
   ``__next__``, atomic under the GIL, so counts are exact under threads without a lock).
5. ``kind == ORIGINAL``: ``return fn(<the API's own arguments>)``. ``RETURNS``: call ``fn`` with
   the definition's inputs by keyword; it returns the outputs. ``DPS``: call ``fn`` with the
   inputs and one buffer per output by keyword. An exception from ``fn``: ``return
   _api.failed(key, exc, <the API's own arguments>)``, from the except block. When ``fn``
   was a solution, ``failed`` raises a SolutionError, or for a ``Decline`` returns what the
   fallback returns; otherwise it re-raises the exception unchanged.
6. Outputs are reconciled with the caller's buffers and returned.

The name of a key is computed on the slow path only: the generated table of known
definitions first, then the family's name rule for const values that no instance declares.

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
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from fibgen.runtime import patching, select, solutions

# Generated modules import ApiDefault from here, with the other names of the contract.
from fibgen.runtime.patching import ApiDefault  # noqa: F401
from fibgen.runtime.errors import ApplyConfigError, Decline, SolutionError

# Route kinds: how a dispatcher calls the callable of a route.
ORIGINAL = 0  # with the API's own arguments: the original API, or what stands in for it
RETURNS = 1  # with the definition's inputs by keyword; returns the outputs
DPS = 2  # with the inputs and output buffers by keyword; writes the outputs

OUTCOMES = (
    "hit",
    "fallback_no_candidate",
    "fallback_unwarmed_in_capture",
    "fallback_declined",
    "error",
)

# Packages of generated dispatchers that enable_apply looks for even when not imported yet.
DEFAULT_PACKAGES = ("fibgen_kernels",)

_UNSET: Any = object()
# Ticked by routes taken while apply is off: nothing is counted then.
_DISCARD = itertools.count().__next__


class _State:
    """Everything enable_apply and disable_apply change, guarded by ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.on = False
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
        # Plan path → arguments of plan() per wrapper instance (weak keys: a dropped wrapper
        # is freed), shared by every family that stands for that wrapper.
        self.plans: dict[str, weakref.WeakKeyDictionary[Any, tuple[Any, ...]]] = {}
        # While tracing is on: wraps each route as it is resolved (Note [tracing hooks] in
        # fibgen/runtime/tracing.py); every call then takes the routed path.
        self.tracer: Callable[[Api, str | None, Any], Any] | None = None
        self.trace_patching = False  # whether tracing patches APIs (apply off or not)


_state = _State()


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


class Api:
    """What one dispatcher routes through: its routes, counters and fallback."""

    __slots__ = (
        "direct",
        "routes",
        "plans",
        "then",
        "label",
        "function",
        "path",
        "plan_path",
        "plan_function",
        "patch",
        "known",
        "known_names",
        "name_rule",
        "by_name",
        "inputs",
        "outputs",
        "references",
        "family_reference",
        "op_type",
        "trace_inputs",
        "trace_axes",
        "_original",
        "_plan_original",
        "_tallies",
        "_resolved",
    )

    def __init__(
        self,
        label: str,
        function: Callable[..., Any],
        *,
        path: str | None = None,
        plan_path: str | None = None,
        plan_function: Callable[..., Any] | None = None,
        patch: bool = True,
        known: Mapping[Any, str] | None = None,
        name_rule: Callable[[Any], str | None] | None = None,
        by_name: bool = False,
        inputs: tuple[str, ...] = (),
        outputs: tuple[str, ...] = (),
        references: Mapping[str, str] | None = None,
        family_reference: str | None = None,
        original: Callable[..., Any] | None = None,
        then: Callable[..., Any] | None = None,
        op_type: str | None = None,
        trace_inputs: Callable[..., tuple[Any, ...]] | None = None,
        trace_axes: Callable[..., dict[str, Any]] | None = None,
    ) -> None:
        self.direct: Callable[..., Any] | None = None
        self.plans = (
            None
            if plan_path is None
            else _state.plans.setdefault(plan_path, weakref.WeakKeyDictionary())
        )
        # The next dispatcher standing for the same API: it gets the calls this one misses.
        self.then = then
        self.routes: dict[Any, tuple[int, Callable[..., Any], Callable[[], int]]] = {}
        self.label = label
        self.function = function
        self.path = path
        self.plan_path = plan_path
        self.plan_function = plan_function
        self.patch = patch
        self.known = dict(known or {})
        self.known_names = frozenset(self.known.values())
        self.name_rule = name_rule
        self.by_name = by_name
        self.inputs = inputs
        self.outputs = outputs
        self.references = dict(references or {})
        self.family_reference = family_reference
        self.op_type = op_type
        self.trace_inputs = trace_inputs
        self.trace_axes = trace_axes
        self._original = _UNSET if original is None else original
        self._plan_original = _UNSET
        self._tallies: dict[tuple[str, str | None], itertools.count] = {}
        self._resolved: dict[Any, tuple[str, str]] = {}

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

    def call_plan(self, *args: Any, **kwargs: Any) -> Any:
        """Run the original ``plan`` (after the dispatcher captured its inputs)."""
        if self._plan_original is _UNSET:
            path = self.plan_path
            if path is None:
                self._plan_original = None
            else:
                self._plan_original = _state.originals.get(path) or patching.original(path)
        return None if self._plan_original is None else self._plan_original(*args, **kwargs)

    def _first_direct(self, *args: Any, **kwargs: Any) -> Any:
        original = self.original()
        with _state.lock:
            if not _state.on and _state.tracer is None:
                self.direct = original
        if original is None:
            return self.function(*args, **kwargs)
        return original(*args, **kwargs)

    def _reference(self, name: str | None) -> Callable[..., Any] | None:
        text = self.references.get(name) if name in self.known_names else None
        text = text or self.family_reference
        return None if text is None else _compile_reference(text, name or self.label)

    def _fallback_route(
        self, name: str | None, tick: Callable[[], int]
    ) -> tuple[int, Callable[..., Any], Callable[[], int]]:
        if self.then is not None:
            # The next family counts the call, as a hit or as its own fallback.
            return (ORIGINAL, self.then, _DISCARD)
        original = self.original()
        if original is not None:
            return (ORIGINAL, original, tick)
        reference = self._reference(name)
        if reference is not None:
            return (RETURNS, reference, tick)
        why = "no original API or reference to fall back to"
        return (ORIGINAL, _no_fallback(self.label, name, why), tick)

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
        # A known name reached with other values is not that definition.
        return None if name in self.known_names else name

    def _tick(self, outcome: str, name: str | None) -> Callable[[], int]:
        counter = self._tallies.get((outcome, name))
        if counter is None:
            counter = self._tallies[(outcome, name)] = itertools.count()
        return counter.__next__

    def resolve(self, key: Any) -> tuple[int, Callable[..., Any], Callable[[], int]]:
        """Decide the route of a key seen for the first time (the slow path)."""
        with _state.lock:
            route = self.routes.get(key)
            if route is not None:
                return route
            name = self.name_of(key)
            entry = _state.entries.get(name) if _state.on and name is not None else None
            if not _state.on:
                route = self._fallback_route(name, _DISCARD)
            elif entry is None:
                route = self._fallback_route(name, self._tick("fallback_no_candidate", name))
            elif is_capturing():
                # Loading may allocate or synchronize, which capture forbids. The route is
                # not kept, so the name resolves normally on its first call after capture.
                return self._fallback_route(name, self._tick("fallback_unwarmed_in_capture", name))
            else:
                loaded = self._load(name, entry)
                route = (DPS if loaded.dps else RETURNS, loaded.fn, self._tick("hit", name))
                self._resolved[key] = (name, loaded.label)
                _state.matched.add(name)
            if _state.tracer is not None:
                route = _state.tracer(self, name, route)
            self.routes[key] = route
            return route

    def _load(self, name: str, entry: solutions.Entry) -> solutions.Loaded:
        cache_key = (name, self.inputs, self.outputs)
        loaded = _state.loaded.get(cache_key)
        if loaded is None:
            try:
                loaded = solutions.load(entry, self.inputs, self.outputs)
            except SolutionError:
                self._tick("error", name)()
                _state.matched.add(name)
                raise
            _state.loaded[cache_key] = loaded
        return loaded

    def failed(self, key: Any, exc: BaseException, *args: Any, **kwargs: Any) -> Any:
        """Handle an exception of a route, from the dispatcher's except block.

        A fallback's exception is re-raised unchanged. A solution's is counted and raised as
        a SolutionError naming both, except a ``Decline``: then the call, given by the API's
        own arguments, goes to the fallback, and its result is returned.
        """
        resolved = self._resolved.get(key)
        if resolved is None:
            # Called from an except block: a bare raise re-raises the exception it handles.
            raise
        name, label = resolved
        if isinstance(exc, Decline):
            self._count_declined(name)
            kind, fn, _ = self._fallback_route(name, _DISCARD)
            if kind != ORIGINAL:
                raise SolutionError(
                    f"{label} declined a call of {name!r} and {self.label} has no original "
                    "API to fall back to",
                    name,
                    label,
                ) from exc
            return fn(*args, **kwargs)
        self._count_error(name)
        raise SolutionError(
            f"{label} for definition {name!r} raised {type(exc).__name__}: {exc}", name, label
        ) from exc

    def _reference_or_fail(self, name: str) -> Callable[..., Any]:
        reference = self._reference(name)
        if reference is None:
            return _no_fallback(self.label, name, "no reference to fall back to")
        return reference

    def _count_error(self, name: str) -> None:
        with _state.lock:
            self._tick("error", name)()
            self._tick("failed_hit", name)()

    def _count_declined(self, name: str) -> None:
        with _state.lock:
            self._tick("fallback_declined", name)()
            self._tick("declined_hit", name)()

    def call_definition(
        self, name: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None
    ) -> Any:
        """Route a call given by definition name and inputs; returns what the reference returns.

        ``outputs`` holds one buffer per output, needed when the route is destination-passing.
        A fallback runs the reference: the original API takes its own arguments, not these.
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
        kind, fn, tick = route
        if kind == ORIGINAL:
            if tick is _DISCARD and _state.on:
                # Handed to the next family of the API, which would count it; count it here.
                with _state.lock:
                    tick = self._tick("fallback_no_candidate", name)
            fn = self._reference_or_fail(name)
            kind = RETURNS
        if kind == DPS and outputs is None:
            raise ValueError(f"{self.label}: the solution for {name!r} needs output buffers")
        tick()
        try:
            if kind == RETURNS:
                return fn(**inputs)
            fn(**inputs, **outputs)
        except Decline:
            resolved = self._resolved.get(key)
            if resolved is None:
                raise
            # As a fallback here: the reference, on the inputs this call holds.
            self._count_declined(name)
            return self._reference_or_fail(name)(**inputs)
        except Exception as exc:
            self.failed(key, exc)
        values = tuple(outputs[o] for o in self.outputs)
        return values[0] if len(values) == 1 else values

    def cannot_allocate(self, output: str) -> Any:
        """Raise for a destination-passing call whose output shape the call does not give."""
        raise ValueError(
            f"{self.label}: cannot allocate output {output!r}: its shape is not readable from "
            "the call; pass its buffer, or register a value-returning solution"
        )

    def miss(self, *args: Any, **kwargs: Any) -> Any:
        """Fall back for a call that cannot be routed at all (unplanned, unknown selector)."""
        if self.then is not None:
            return self.then(*args, **kwargs)
        if _state.on:
            with _state.lock:
                self._tick("fallback_no_candidate", None)()
        original = self.original()
        if original is None:
            why = "no original API to fall back to (for a plan/run API, call plan() first)"
            raise LookupError(f"{self.label}: this call matches no definition and {why}")
        return original(*args, **kwargs)

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
            # repr is "count(N)": reading it does not advance the counter.
            totals[outcome] += int(repr(counter)[6:-1])
        # A hit is a call a solution served: not one it raised on or handed back.
        totals["hit"] -= totals.pop("failed_hit") + totals.pop("declined_hit")
        return totals


def _patch(api: Api, taken: set[str]) -> None:
    # ``taken``: paths already patched in this enable. The latest registered dispatcher of a
    # path wins (a regenerated module), so callers walk the registry newest first.
    if not api.patch or api.path is None or api.path in taken:
        return
    taken.add(api.path)
    found = patching.patch(api.path, api.function, _state.patches)
    if found is not None:
        _state.originals[api.path] = api._original = found
        patching.adopt_defaults(api.function, found)
    if api.plan_path is not None and api.plan_function is not None:
        found = patching.patch(api.plan_path, api.plan_function, _state.patches)
        if found is not None:
            _state.originals[api.plan_path] = api._plan_original = found


def _patching_wanted() -> bool:
    return (_state.on and _state.patching) or (_state.tracer is not None and _state.trace_patching)


def _repatch() -> None:
    """Restore every patched API, then patch again if apply or tracing wants it (under lock)."""
    patching.restore(_state.patches)
    if _patching_wanted():
        taken: set[str] = set()
        for api in reversed(_state.apis):
            _patch(api, taken)


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
    packages: Iterable[str] | None = None,
) -> Applied:
    """Route calls to solutions: a mapping {definition name: solution} or a dataset folder.

    A dataset folder with ``traces/`` routes each definition to the solution its traces rank
    best, per var-axis key where that differs; ``config`` is the selection policy
    (``fibgen.runtime.select``). Enabling again replaces the mapping and resets the counters.
    With ``patch``, the APIs of imported dispatchers and of the generated packages are
    replaced by their dispatchers.
    """
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
        _state.patching = patch
        for api in _state.apis:
            api._turn_on()
        _repatch()
    return Applied()


def disable_apply() -> None:
    """Stop routing and restore patched APIs; warn about solutions that never matched."""
    with _state.lock:
        was_on = _state.on
        _state.on = False
        for api in _state.apis:
            api._turn_off()
        # Tracing with patching keeps the APIs patched; they call the originals again.
        _repatch()
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
        for api in _state.apis:
            if _state.on:
                api.routes.clear()
            else:
                api._turn_off()
        _repatch()


def is_enabled() -> bool:
    """Whether apply is on."""
    return _state.on


def stats() -> dict[str, dict[str, int]]:
    """Calls per API since apply was last enabled: hit, the fallbacks, and error."""
    out: dict[str, dict[str, int]] = {}
    with _state.lock:
        for api in _state.apis:
            counts = api.counts()
            if not any(counts.values()):
                continue
            total = out.setdefault(api.label, dict.fromkeys(OUTCOMES, 0))
            for outcome in OUTCOMES:
                total[outcome] += counts[outcome]
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
        _, fn, tick = route
        tick()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            return api.failed(key, exc, *args, **kwargs)

    return routed


def apply(
    target: str | Callable[..., str],
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    fallback: Callable[..., Any] | None = None,
) -> Any:
    """Route hand-written code: ``@apply(name_or_resolver)``, or ``apply(name, args, kwargs, fallback)``.

    The solution is called with the arguments as given; a resolver maps them to a name.
    """
    if fallback is None:
        if args is not None or kwargs is not None:
            raise TypeError("apply(name, args, kwargs, fallback): fallback is required")
        return functools.partial(_route_handwritten, target=target)
    with _state.lock:
        routed = _handwritten.get((fallback, target))
        if routed is None:
            routed = _handwritten[(fallback, target)] = _route_handwritten(fallback, target)
    return routed(*(args or ()), **(kwargs or {}))
