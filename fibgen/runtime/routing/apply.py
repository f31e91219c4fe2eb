"""Apply: route live calls to registered solutions by definition name; turn it on and off.

This module holds enable_apply, disable_apply, set_tracer and stats, and the contract below
that generated dispatchers follow (they import its names from ``fibgen.runtime.for_generated``).
The parts: ``api`` (the Api object: the slow path that resolves a key, fallbacks, refused and
failed calls, counters), ``fallbacks`` and ``refusals`` (the callables and messages of calls
not served), ``registry`` (dispatchers, packages and the APIs patched to reach them),
``handwritten`` (the ``apply`` decorator) and ``state`` (route kinds, outcomes, and the state
all of them share: this module's functions act on the process's, Note [apply state] there).

Note [the dispatch contract]
A generated dispatcher module calls ``register_api`` once, at the end of its import, and
keeps the returned ``Api`` as ``_api``, ``_api.routes`` as ``_routes``, what
``_api.checks(globals())`` returns as ``_same``, ``_shape_of`` and ``_dtype_of`` (rebound in
place when the native ones are built: Note [native reads] in
``fibgen/runtime/checking/result_check.py``) and, for a plan/run wrapper, ``_api.plans`` as
``_plans``. Its function does, in straight-line code:

1. ``if _api.direct is not None: return _api.direct(<the API's own arguments>)``. The runtime
   sets ``direct`` to the original API while apply is off (resolved lazily on the first
   call), and to None while apply is on or when there is no original to call.
2. For a wrapper: ``_plan = _plans.get(self)``; a wrapper whose ``plan()`` fibgen did not see,
   or whose plan state changed since (Note [plan state] in ``fibgen/runtime/routing/patching.py``),
   is not routed (``_api.miss``). The runtime calls the module's ``_capture`` after every
   successful ``plan()``; it keeps the plan's arguments and the first plan rule they fail.
3. The `let` rules and the key (const values read from the arguments), in a ``try``: a call
   they cannot be computed for is refused (``_api.refuse(None, ...)``).
4. ``route = _routes[key]`` (None on a KeyError); when None, or while a routed call is in
   progress (Note [re-entry]), ``route = _api.resolve(key)``. The runtime owns
   ``routes`` and empties it in place on enable and disable; ``resolve`` fills it once per
   key (checking the rules over the definition's values, ``_const_check``), except while a
   CUDA graph is being captured (see ``resolve``).
5. ``kind, fn, tick, values = route``. ``kind == ORIGINAL``: ``tick()`` and ``return
   fn(<the API's own arguments>)``. ``tick`` counts the call (fibgen/runtime/counters.py: a bound
   ``itertools.count.__next__`` or a native ``Tally``, atomic under the GIL, so counts are
   exact under threads without a lock).
6. The call's rules (Note [rules] in ``fibgen/compiler/ir.py``): the plan's verdict, then the
   dtype and rank of each input tensor, every call-time rule, then the dtype, shape and
   device of each output buffer the caller gave (Note [output buffers] in
   ``fibgen/codegen/python/dispatch/rules.py``), in a ``try``. The first that
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

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fibgen.runtime.caller import warn
from fibgen.runtime.errors import ApplyConfigError
from fibgen.runtime.routing.api import Api
from fibgen.runtime.routing.registry import check_callables, import_packages, repatch
from fibgen.runtime.routing.state import OUTCOMES, STATE
from fibgen.runtime.selection import best as select
from fibgen.runtime.solutions import loading as solutions


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
    (``fibgen.runtime.selection.best``). Enabling again replaces the mapping and resets the counters.
    With ``patch``, the APIs of imported dispatchers and of the generated packages are
    replaced by their dispatchers. ``strict`` (default: ``FIBGEN_APPLY_STRICT=1``) makes every
    call that is not served by its solution raise with the reason: a miss, a failed rule, a
    decline, a solution error.
    """
    if strict is None:
        strict = strict_from_env()
    solutions.forget_unfound()  # a definition added to a dataset since is seen
    if select.is_traced_dataset(solutions_or_path):
        entries = select.entries(solutions_or_path, config)
    elif config is not None:
        raise ApplyConfigError("a selection config needs a dataset folder that holds traces/")
    else:
        entries = solutions.collect(solutions_or_path)
    import_packages(STATE, packages, entries, patch)
    check_callables(STATE, entries)
    if isinstance(solutions_or_path, Mapping):
        _warn_unknown_names(entries)
        if not entries:
            warn(
                "fibgen: enable_apply({}): no solution given; no call is routed (apply is on, "
                "every call runs the API's own function)"
            )
    with STATE.lock:
        STATE.entries = entries
        STATE.loaded = {}
        STATE.matched = set()
        STATE.on = True
        STATE.strict = bool(strict)
        STATE.patching = patch
        for api in STATE.apis:
            api.turn_on()
        repatch(STATE)
    return Applied()


# Note [unknown names]
# ~~~~~~~~~~~~~~~~~~~~
# A name in enable_apply's mapping is typed by a person, and a typo (``rmsnorm_h4069``) is
# accepted like any name: its solution is simply never called, which disable_apply's "never
# matched" warning says only at the end of the run. So enable_apply warns at once, with the
# closest known names, about a name that no imported dispatcher declares, no hand-written
# ``@apply`` routes, and fibgen's catalogue does not have. A name rule can still spell it (a
# hidden size no instance declares), so it is a warning, not an error. Names of a dataset
# folder come from its Solution JSONs, which `fibgen validate` checks against the dataset's
# definitions; they are not checked here. The known names are sets already in memory; the
# catalogue's names are listed (one glob, cached) only when some name is not among them, and
# nothing is checked while hand-written code routes by a resolver, whose names are unknown.


def _warn_unknown_names(entries: Mapping[str, Any]) -> None:
    from fibgen.runtime.routing import handwritten

    if handwritten.resolvers:
        return
    with STATE.lock:
        known = set(handwritten.routed_names)
        for api in STATE.apis:
            known |= api.known_names
        for _, definitions in STATE.packages.values():
            known.update(definitions)
    unknown = [name for name in entries if name not in known]
    if not unknown:
        return
    catalogue = _catalogue_names()
    unknown = [name for name in unknown if name not in catalogue]
    if not unknown:
        return
    import difflib

    everything = sorted(known | catalogue)
    shown = []
    for name in unknown:
        close = difflib.get_close_matches(name, everything, n=3)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        shown.append(f"{name!r}{hint}")
    warn(
        f"fibgen: enable_apply: no imported dispatcher and no definition of fibgen's catalogue "
        f"is called {', '.join(shown)}; a call reaches its solution only if some dispatcher "
        "routes that name"
    )


def _catalogue_names() -> frozenset[str]:
    """The names of fibgen's built-in definitions."""
    from fibgen.paths import builtin_definition_names

    return builtin_definition_names()


def strict_from_env() -> bool:
    """``FIBGEN_APPLY_STRICT=1``: apply raises instead of falling back."""
    import os

    return os.environ.get("FIBGEN_APPLY_STRICT", "").strip() == "1"


def disable_apply() -> None:
    """Stop routing and restore patched APIs; warn about solutions that never matched."""
    with STATE.lock:
        was_on = STATE.on
        STATE.on = False
        STATE.strict = False
        # Tracing with patching keeps the APIs patched; they call the originals again.
        repatch(STATE)
        for api in STATE.apis:
            api.turn_off()
        unmatched = sorted(set(STATE.entries) - STATE.matched)
        STATE.entries = {}
        STATE.loaded = {}
    if was_on and unmatched:
        warn(
            f"fibgen: {len(unmatched)} registered definition(s) never matched a call: "
            + ", ".join(unmatched)
        )


def set_tracer(
    tracer: Callable[[Api, str | None, Any], Any] | None,
    *,
    patch: bool = False,
    missed: Callable[[Api, str | None, str | None, Any], None] | None = None,
    detour: Callable[[str, Callable[..., Any], Any, Any], Any] | None = None,
) -> None:
    """Install (or with None remove) the route wrapper of tracing; routes resolve afresh.

    With ``patch``, the APIs of the generated dispatchers are patched while tracing is on,
    also with apply off: calls that do not go through fibgen reach a dispatcher, which
    records them and calls the original API. ``missed`` is told of the calls that take no
    route it could wrap (Note [missed calls] in fibgen/runtime/tracing/tracer.py);
    ``detour`` runs the fallback of a hand-written call whose solution failed (Note [recorded
    hand-written calls] there).
    """
    if tracer is not None and patch:
        import_packages(STATE, None, (), True)
    with STATE.lock:
        STATE.tracer = tracer
        STATE.trace_missed = missed if tracer is not None else None
        STATE.trace_detour = detour if tracer is not None else None
        STATE.trace_patching = tracer is not None and patch
        repatch(STATE)
        for api in STATE.apis:
            if STATE.on:
                api.routes.clear()
            else:
                api.turn_off()


def is_enabled() -> bool:
    """Whether apply is on."""
    return STATE.on


def stats() -> dict[str, dict[str, Any]]:
    """Calls per API since apply was last enabled: hit, the fallbacks, and error.

    An API with refused calls also has ``rules``: the calls per failed rule.
    """
    out: dict[str, dict[str, Any]] = {}
    with STATE.lock:
        for api in STATE.apis:
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
