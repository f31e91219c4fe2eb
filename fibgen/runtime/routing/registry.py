"""The registry of dispatchers and their packages, and the APIs patched to reach them.

Each function takes the apply state it works on (Note [apply state] in
fibgen/runtime/routing/state.py), except ``register_api`` and ``register_package``, which
generated modules call at import: they register in the process's, unless given another.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fibgen.runtime.errors import ApplyConfigError
from fibgen.runtime.routing import patching
from fibgen.runtime.routing.api import Api
from fibgen.runtime.routing.state import STATE, ApplyState
from fibgen.runtime.solutions import loading as solutions

# Packages of generated dispatchers that enable_apply looks for even when not imported yet.
DEFAULT_PACKAGES = ("fibgen_kernels",)


def _patch(state: ApplyState, api: Api, taken: set[str]) -> None:
    # ``taken``: paths already patched in this enable. The latest registered dispatcher of a
    # path wins (a regenerated module), so callers walk the registry newest first.
    if not api.patch or api.path is None or api.path in taken:
        return
    taken.add(api.path)
    problem = patching.mismatch(api.path, api.function)
    if problem is not None:
        _warn_unpatched(state, api, problem)
        return
    if api.plan_path is not None and api.capture is not None:
        problem = patching.mismatch(api.plan_path, api.capture)
        if problem is not None:
            _warn_unpatched(state, api, problem)
            return
    found = patching.patch(api.path, api.function, state.patches)
    if found is None:
        return
    state.originals[api.path] = found
    api.adopt_original(found)
    patching.adopt_defaults(api.function, found)
    if api.plan_path is not None:
        hooks = [
            (a.plans, a.capture)
            for a in state.apis
            if a.plan_path == api.plan_path and a.capture is not None and a.plans is not None
        ]
        found = patching.patch_plan(api.plan_path, hooks, state.patches)
        if found is not None:
            state.originals[api.plan_path] = found
            # A plan's defaults that are expressions (`q_data_type=torch.float16`) reach the
            # captures as the plan's own values, as the run's do.
            for _, capture in hooks:
                patching.adopt_defaults(capture, found)


def _warn_unpatched(state: ApplyState, api: Api, problem: str) -> None:
    # Every family of the path goes unrouted (the variant families of a wrapper, the families
    # of a dispatch group), so every definition of theirs is named: an integrator looks for
    # the one they registered.
    names = sorted({n for a in state.apis if a.path == api.path for n in a.known_names})
    definitions = f"definitions {', '.join(names)}" if names else f"{api.label}"
    state.warn_once(
        ("unpatched", api.path, problem),
        f"fibgen: {problem}; it is left unpatched, so {definitions} are not routed",
    )


def _patching_wanted(state: ApplyState) -> bool:
    return (state.on and state.patching) or (state.tracer is not None and state.trace_patching)


def repatch(state: ApplyState) -> None:
    """Restore every patched API, then patch again if apply or tracing wants it (under lock).

    Plans seen so far are forgotten: between the two, a ``plan()`` could run unseen, and a
    ``run()`` after a plan fibgen did not see is never routed.
    """
    patching.restore(state.patches)
    # What stands at each path now is the original: something may have replaced it since.
    state.originals.clear()
    for api in state.apis:
        api.forget_original()
        if api.plans is not None:
            api.plans.clear()
    if _patching_wanted(state):
        taken: set[str] = set()
        idle = set() if state.tracer is not None or state.strict else _idle_paths(state)
        for api in reversed(state.apis):
            if api.path not in idle:
                _patch(state, api, taken)


def _idle_paths(state: ApplyState) -> set[str]:
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
    names = set(state.entries) if state.on else set()
    known: dict[str, set[str]] = {}
    for api in state.apis:
        if api.path is not None:
            known.setdefault(api.path, set()).update(api.known_names)
    if names - set().union(*known.values()):
        return set()
    return {path for path, defined in known.items() if not names & defined}


def _package_of(api: Api) -> str:
    return getattr(api.function, "__module__", "").partition(".")[0]


def _link_packages(state: ApplyState, path: str) -> None:
    """Chain the packages whose dispatchers stand for ``path``, newest first (under lock).

    Note [packages of one API]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~
    Within a package, the families of one API form a chain (``then``): a call the first
    cannot pair goes to the next. Two packages can stand for the same API: the catalogue's
    ``fibgen_kernels`` and a user's package built from definitions of their own. The newest
    registered dispatcher is the one patched in; without a link, a call of a definition only
    the other package knows reached FlashInfer uncounted as that package's miss. So the last
    family of each package's chain hands on to the first family of the next older package's
    chain, and a call is counted by the family that finally pairs it or misses it. A module
    imported again under the same package (a rebuilt one) replaces its older registration
    within that package and is not chained to it.
    """
    mine = [a for a in state.apis if a.path == path]
    by_package: dict[str, list[Api]] = {}
    for api in mine:
        api.then = api.own_then
        by_package.setdefault(_package_of(api), []).append(api)
    chains: list[tuple[Api, Api]] = []  # (first, last) per package, newest package first
    for apis in sorted(by_package.values(), key=lambda group: -mine.index(group[-1])):
        newest = {a.function: a for a in apis}
        named = {a.own_then for a in apis}
        first = next((a for a in reversed(apis) if a.function not in named), None)
        if first is None:
            continue
        last = first  # a package's chain ends: each module imports its `then` first
        while last.own_then in newest:
            last = newest[last.own_then]
        if last.own_then is None:
            chains.append((first, last))
    for (_, last), (first, _) in itertools.pairwise(chains):
        last.then = first.function


def register_api(
    label: str, function: Callable[..., Any], *, state: ApplyState | None = None, **options: Any
) -> Api:
    """Register a dispatcher (called by generated modules at import); see ``Api``."""
    state = STATE if state is None else state
    api = Api(label, function, state=state, **options)
    with state.lock:
        state.apis.append(api)
        if api.path is not None:
            _link_packages(state, api.path)
        if state.on:
            api.turn_on()
        else:
            api.turn_off()
        if _patching_wanted(state):
            if api.path in state.originals and (api.plan_path is not None or api.patch):
                # Another family of the same wrapper is patched: its plan hooks this one too.
                # Or another package's dispatcher of the API is: the newest stands in front
                # of the chain (Note [packages of one API]).
                repatch(state)
            else:
                _patch(state, api, {p.path for p in state.apis[:-1] if p.patch and p.path})
    return api


def register_package(
    package: str,
    apis: Mapping[str, str],
    definitions: Mapping[str, str] | None = None,
    *,
    state: ApplyState | None = None,
) -> None:
    """Record a package of generated dispatchers: API path → module, definition → module."""
    state = STATE if state is None else state
    with state.lock:
        state.packages[package] = (dict(apis), dict(definitions or {}))


def import_packages(
    state: ApplyState, packages: Iterable[str] | None, names: Iterable[str], patch: bool
) -> None:
    # Dispatchers are imported here so that they can be patched in, and so that callables
    # registered for their definitions are checked now rather than on their first call.
    wanted = (
        list(packages)
        if packages is not None
        else [*DEFAULT_PACKAGES, *env_packages(), *state.packages]
    )
    for package in dict.fromkeys(wanted):
        if package not in state.packages:
            try:
                importlib.import_module(package)
            except ImportError:
                continue
        apis, definitions = state.packages.get(package, ({}, {}))
        modules = {definitions[n] for n in names if n in definitions}
        if patch:
            # Only dispatchers whose API can be reached.
            modules |= {m for path, m in apis.items() if patching.original(path) is not None}
        for module in sorted(modules):
            importlib.import_module(f"{package}.{module}")


def env_packages() -> list[str]:
    """``FIBGEN_PACKAGES``: packages of generated dispatchers (``fibgen build --package``) to
    import beside ``fibgen_kernels``, comma-separated; a bench worker inherits it."""
    import os

    return [p.strip() for p in os.environ.get("FIBGEN_PACKAGES", "").split(",") if p.strip()]


def check_callables(state: ApplyState, entries: Mapping[str, solutions.Entry]) -> None:
    # A name known to several registered packages with different tensors (two catalogues in
    # one process) cannot be checked here; the check then happens when a call routes to it.
    tensors: dict[str, set[tuple[tuple[str, ...], tuple[str, ...]]]] = {}
    for a in state.apis:
        for n in a.known_names:
            tensors.setdefault(n, set()).add((a.inputs, a.outputs))
    for name, entry in entries.items():
        if entry.fn is None or len(tensors.get(name, ())) != 1:
            continue
        ((inputs, outputs),) = tensors[name]
        _, problem = solutions.signature_problem(entry.fn, name, entry.label, inputs, outputs, None)
        if problem is not None:
            raise ApplyConfigError(problem)
