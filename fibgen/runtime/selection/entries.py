"""Apply entries from the table: the best solution of a definition, or a keyed entry that
calls the solution chosen for each var-axis key."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fibgen.runtime.errors import Decline
from fibgen.runtime.selection.policy import Policy
from fibgen.runtime.selection.table import ORIGINAL
from fibgen.runtime.solutions import loading as solutions


class LazySolution:
    """A Solution JSON read and validated on first use (enabling reads no solution file)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._model: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._model is None:
            # A solution folder's files are read now (Note [solution folders]).
            from fibgen.format.dataset import read_solution

            self._model = read_solution(self._path)
        return getattr(self._model, attr)


def entry_of(root: Path, name: str, solution: str, relpath: str) -> solutions.Entry:
    path = root / relpath
    return solutions.Entry(
        name, f"solution {solution!r} ({path})", solution=LazySolution(path), root=root
    )


_FASTER = "the API's own function is faster there"


def _declining(name: str, key: Any, why: str = "") -> Callable[..., Any]:
    """A solution that hands every call back: the dispatcher falls back (``on_miss="fallback"``,
    no trusted solution for a key its traces do not cover, or the API's own function faster)."""
    if why == _FASTER:
        declined = Decline(f"{name}: at var-axis values {key!r} {why}")
    else:
        declined = Decline(f"{name}: no passing trace covers var-axis values {key!r}{why}")

    def decline(*_: Any, **__: Any) -> Any:
        # One exception for every call, its traceback dropped so that it does not grow.
        raise declined.with_traceback(None)

    return decline


def _log_distance(a: list[int], b: list[int]) -> float:
    return sum(abs(math.log2(max(x, 1) / max(y, 1))) for x, y in zip(a, b))


def keyed_entry(root: Path, name: str, info: dict, policy: Policy) -> solutions.Entry:
    keyed = info["keyed"]
    inputs, outputs = tuple(keyed["inputs"]), tuple(keyed["outputs"])
    loaded: dict[str, solutions.Loaded] = {}

    def load(solution: str) -> solutions.Loaded:
        found = loaded.get(solution)
        if found is None:
            entry = entry_of(root, name, solution, info["solutions"][solution])
            found = loaded[solution] = solutions.load(entry, inputs, outputs)
        return found

    # The definition's best, and the choices of a miss: trusted solutions only (Note
    # [selection beside flashinfer-bench] in select_table.py); None where none is trusted.
    best = info["ranking"][0] if info["ranking"] else None
    if info.get("miss_original"):
        best = None  # a miss goes to the API's own function (Note [the API's own function
        # as a candidate] in select_table.py)
    trusted = [t for t in keyed["trusted"] if t[1] != ORIGINAL]  # [values, solution] per key
    # The keyed entry is destination-passing when any of its choices is: value-returning
    # choices then copy into the buffers, so no choice needs outputs allocated for it.
    named = {s for _, s in keyed["keys"]} | {s for _, s in trusted} | {best}
    chosen = {s for s in named if s is not None and s != ORIGINAL}
    dps = keyed["dps"]

    def adapt(fn: Callable[..., Any], fn_dps: bool) -> Callable[..., Any]:
        if fn_dps == dps:
            return fn

        def returns_into(**kwargs: Any) -> None:
            values = fn(**{k: kwargs[k] for k in inputs})
            values = values if isinstance(values, (tuple, list)) else (values,)
            for o, v in zip(outputs, values):
                kwargs[o].copy_(v)

        return returns_into

    # choices: key -> callable. A solution starts as a stub that loads it on its first call
    # and then puts the loaded callable in place of every occurrence of the stub.
    current: dict[str, Callable[..., Any]] = {}
    choices: dict[Any, Callable[..., Any]] = {}

    def install(solution: str) -> Callable[..., Any]:
        found = load(solution)
        fn = adapt(found.fn, found.dps)
        stub = current.get(solution)
        current[solution] = fn
        for k, v in list(choices.items()):
            if v is stub:
                choices[k] = fn
        return fn

    def stub_for(solution: str) -> Callable[..., Any]:
        if solution not in current:

            def first_call(**kwargs: Any) -> Any:
                return install(solution)(**kwargs)

            current[solution] = first_call
        return current[solution]

    single = len(keyed["bind"]) == 1
    for values, solution in keyed["keys"]:
        key = values[0] if single else tuple(values)
        if solution == ORIGINAL:
            choices[key] = _declining(name, key, why=_FASTER)
        else:
            choices[key] = stub_for(solution)
    for solution in sorted(chosen):
        stub_for(solution)
    for solution in info["ranking"][: policy.prebuild]:
        if solution in chosen:
            install(solution)

    reference_fn: list[Callable[..., Any]] = []

    def miss(key: Any) -> Callable[..., Any]:
        if policy.on_miss == "nearest" and trusted:
            values = [key] if single else list(key)
            _, solution = min(trusted, key=lambda t: (_log_distance(t[0], values), t[1]))
            fn = current[solution]
        elif policy.on_miss == "best" and best is not None:
            fn = current[best]
        elif policy.on_miss == "reference":
            if not reference_fn:
                # The definition's own reference, as the table read it from the dataset.
                namespace: dict[str, Any] = {"__name__": f"fibgen_reference_{name}"}
                exec(compile(keyed["reference"], f"<reference of {name}>", "exec"), namespace)
                reference_fn.append(adapt(namespace["run"], False))
            fn = reference_fn[0]
        elif policy.on_miss == "fallback":
            fn = _declining(name, key)
        elif info.get("miss_original") and policy.on_miss in ("best", "nearest"):
            fn = _declining(name, key, why=_FASTER)
        else:
            fn = _declining(name, key, ", and no solution passed at every key it was run at")
        if len(choices) < 4096:  # remembered, within reason: keys are batch sizes
            choices[key] = fn
        return fn

    # Generated with the exact parameters, so that apply checks and calls it like any
    # solution and the key is read without building a dict or a signature per call.
    params = list(inputs) + (list(outputs) if dps else [])
    # A var axis bound by a scalar is the scalar's value (Note [axes bound by a scalar]).
    reads = [f"int({i})" if d is None else f"{i}.shape[{d}]" for i, d in keyed["bind"]]
    key_expr = reads[0] if single else f"({', '.join(reads)},)"
    call_args = ", ".join(f"{p}={p}" for p in params)
    source = (
        f"def run({', '.join(params)}):\n"
        f"    key = {key_expr}\n"
        f"    fn = choices.get(key)\n"
        f"    if fn is None:\n"
        f"        fn = miss(key)\n"
        f"    return fn({call_args})\n"
    )
    namespace: dict[str, Any] = {"choices": choices, "miss": miss}
    exec(compile(source, f"<keyed selection of {name}>", "exec"), namespace)
    label = f"keyed selection of {len(chosen)} solutions for {name!r} from {root}/traces"
    # ``root`` and ``dps``: hand-written apply finds the definition in the dataset, to call
    # the entry in either style and to run the dataset's reference as its fallback.
    return solutions.Entry(name, label, fn=namespace["run"], root=root, dps=dps)
