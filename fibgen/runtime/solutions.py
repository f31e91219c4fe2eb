"""Solutions: what a definition name is mapped to, and how each kind becomes a callable.

A mapping value is a Python callable, a Solution (``fibgen.format.models``), or the path of a
Solution JSON; a folder holds Solution JSON files under ``solutions/``. Collecting checks
everything that can be checked without importing user code, so a bad configuration fails in
``enable_apply`` with the file named. Loading (importing a solution's entry point) happens on
the first call that matches, under the runtime's lock, so it happens once.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fibgen.runtime.errors import ApplyConfigError, SolutionError

# Languages whose sources are imported as Python, and those compiled by runtime.builders.
IMPORTED_LANGUAGES = ("python", "triton")
BUILT_LANGUAGES = ("cpp", "cuda")


@dataclass(frozen=True)
class Entry:
    """One registered solution, not loaded yet: a callable, or a Solution model."""

    definition: str
    label: str
    fn: Callable[..., Any] | None = None
    solution: Any = None
    # The dataset the Solution came from, whose definitions/ may hold its definition.
    root: Path | None = None


@dataclass(frozen=True)
class Loaded:
    """A solution ready to call: ``dps`` says whether it takes output buffers, ``inplace``
    whether it also takes ``inplace=True`` (Note [in-place solutions] in apply_state.py)."""

    fn: Callable[..., Any]
    dps: bool
    label: str
    inplace: bool = False


def describe_callable(fn: Callable[..., Any]) -> str:
    """How messages name a callable solution."""
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"callable {module}.{qualname}"


def _is_solution_model(value: Any) -> bool:
    return hasattr(value, "spec") and hasattr(value, "sources") and hasattr(value, "definition")


def _load_solution_file(path: Path) -> Any:
    # Imported here: pydantic is only needed when JSON solutions are used. A solution
    # folder's sources come from its files (Note [solution folders] in
    # fibgen/format/dataset/solution_folders.py).
    from fibgen.format.dataset import read_solution
    from fibgen.format.errors import FormatError

    try:
        return read_solution(path)
    except FormatError as exc:
        raise ApplyConfigError(f"bad solution file {exc}") from None
    except OSError as exc:
        raise ApplyConfigError(f"cannot read solution file {path}: {exc.strerror}") from None


def _json_entry(definition: str, solution: Any, origin: str) -> Entry:
    if solution.definition != definition:
        raise ApplyConfigError(
            f"{origin}: solution {solution.name!r} is for definition {solution.definition!r}, "
            f"but it was registered for {definition!r}"
        )
    return Entry(
        definition,
        f"solution {solution.name!r} ({origin})",
        solution=solution,
        root=_dataset_root(Path(origin)) if origin != "given object" else None,
    )


def collect(target: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Entry]:
    """Turn ``enable_apply``'s argument into entries by definition name, checking it."""
    if isinstance(target, (str, os.PathLike)):
        return _collect_folder(Path(target))
    if not isinstance(target, Mapping):
        raise ApplyConfigError(
            "enable_apply takes a mapping {definition name: callable | Solution | path} or a "
            f"folder path, not {type(target).__name__}"
        )
    entries: dict[str, Entry] = {}
    for name, value in target.items():
        if not isinstance(name, str) or not name:
            raise ApplyConfigError(f"definition names must be non-empty strings, got {name!r}")
        if isinstance(value, (str, os.PathLike)):
            path = Path(value)
            entries[name] = _json_entry(name, _load_solution_file(path), str(path))
        elif _is_solution_model(value):
            entries[name] = _json_entry(name, value, "given object")
        elif callable(value):
            entries[name] = Entry(name, describe_callable(value), fn=value)
        else:
            raise ApplyConfigError(
                f"the solution for {name!r} must be a callable, a Solution or the path of a "
                f"Solution JSON, not {type(value).__name__}"
            )
    return entries


def _collect_folder(root: Path) -> dict[str, Entry]:
    from fibgen.format.dataset import dataset_files

    folder = root / "solutions"
    if not folder.is_dir():
        what = "does not exist" if not root.exists() else "has no solutions/ folder"
        raise ApplyConfigError(f"apply path {root} {what}; expected {root}/solutions/**/*.json")
    entries: dict[str, Entry] = {}
    origins: dict[str, Path] = {}
    for path in dataset_files(root, "solutions"):
        solution = _load_solution_file(path)
        name = solution.definition
        if name in origins:
            raise ApplyConfigError(
                f"two solutions for definition {name!r}: {origins[name]} and {path}; "
                "keep one solution per definition in the apply folder"
            )
        origins[name] = path
        entries[name] = _json_entry(name, solution, str(path))
    if not entries:
        warnings.warn(
            f"fibgen: apply path {root} holds no Solution JSON under {folder}; "
            "no call is routed",
            RuntimeWarning,
            stacklevel=4,
        )
    return entries


def signature_problem(
    fn: Callable[..., Any],
    definition: str,
    label: str,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    dps: bool | None,
) -> tuple[bool, str | None]:
    """Whether ``fn`` is destination-passing, and why it cannot be called, if it cannot.

    ``dps`` None infers it: a callable that names every output as a parameter takes buffers.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        # Builtins and some extension functions have no signature: trust them.
        return bool(dps), None
    if dps is None:
        dps = bool(outputs) and all(o in sig.parameters for o in outputs)
    names = inputs + outputs if dps else inputs
    try:
        sig.bind(**dict.fromkeys(names))
    except TypeError as exc:
        style = "destination-passing" if dps else "value-returning"
        return dps, (
            f"{label} for definition {definition!r} cannot be called as "
            f"({', '.join(names)}): {exc}; a {style} solution takes the parameters "
            f"{', '.join(names)} by keyword"
        )
    return dps, None


def load(
    entry: Entry,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    scalars: frozenset[str] | None = None,
) -> Loaded:
    """Import and check one solution; failures raise SolutionError naming it.

    ``scalars``, the inputs that are not tensors, lets a destination-passing solution whose
    kernels fibgen accelerated replay its launches (Note [launch replay] in replay.py).
    """
    if entry.fn is not None:
        fn, dps = entry.fn, None
    else:
        fn = _import_solution(entry)
        dps = entry.solution.spec.destination_passing_style
        if entry.solution.spec.language in BUILT_LANGUAGES and (inputs or outputs):
            from fibgen.runtime.builders import by_name

            # Like Trace Apply, built solutions are called positionally; the dispatcher
            # passes keywords, so the wrapper takes the definition's names.
            fn = by_name(fn, inputs + outputs if dps else inputs)
    # Without the definition's tensors (hand-written apply) there is nothing to check against;
    # a Solution then takes either calling style (Note [calling styles]).
    if not inputs and not outputs:
        if entry.solution is not None:
            definition = find_definition(entry.definition, entry.root)
            if definition is not None:
                fn = either_style(fn, definition, bool(dps), entry.label)
        return Loaded(fn, bool(dps), entry.label)
    dps, problem = signature_problem(fn, entry.definition, entry.label, inputs, outputs, dps)
    if problem is not None:
        raise SolutionError(problem, entry.definition, entry.label, signature=True)
    inplace = dps and takes_inplace(fn)
    if dps and scalars is not None and _ACCELERATED.get(getattr(fn, "__module__", None)):
        from fibgen.runtime.replay import wrap

        fn = wrap(fn, inputs + outputs, scalars)
    return Loaded(fn, dps, entry.label, inplace)


def takes_inplace(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has a parameter ``inplace`` with a default (Note [in-place solutions])."""
    try:
        param = inspect.signature(fn).parameters.get("inplace")
    except (TypeError, ValueError):
        return False
    return (
        param is not None
        and param.default is not inspect.Parameter.empty
        and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
    )


def cache_root() -> Path:
    """Where Solution sources are materialized: ``$FIBGEN_CACHE_DIR`` or ``~/.cache/fibgen``."""
    from fibgen.fsutil import cache_dir

    return cache_dir() / "solutions"


def _digest(solution: Any) -> str:
    spec = solution.spec
    payload = [
        spec.language,
        spec.entry_point,
        sorted((s.path, s.content) for s in solution.sources),
    ]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:32]


def materialize(solution: Any) -> tuple[Path, str]:
    """Write a solution's sources under the cache, keyed by content hash; return (dir, hash)."""
    from fibgen.format.models import source_path_problem

    digest = _digest(solution)
    final = cache_root() / digest
    if final.is_dir():
        return final, digest
    for source in solution.sources:
        problem = source_path_problem(source.path)
        if problem is not None:
            raise ValueError(problem)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed into place, so a reader never sees a half-written folder.
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=final.parent))
    try:
        for source in solution.sources:
            path = tmp / source.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source.content, encoding="utf-8")
        os.rename(tmp, final)
    except BaseException as exc:
        # Whatever stopped the writing (a name the OS refuses, content that is not encodable,
        # Ctrl-C), the half-written folder is not left in the cache.
        shutil.rmtree(tmp, ignore_errors=True)
        # Another process won the race: its folder holds the same content.
        if not (isinstance(exc, OSError) and final.is_dir()):
            raise
    return final, digest


# Entry modules of solutions whose Triton kernels fibgen accelerated, with their count.
_ACCELERATED: dict[str, int] = {}


def _import_solution(entry: Entry) -> Callable[..., Any]:
    solution = entry.solution
    spec = solution.spec
    try:
        if spec.language in BUILT_LANGUAGES:
            from fibgen.runtime.builders import build_solution

            return build_solution(solution)[0]
        if spec.language not in IMPORTED_LANGUAGES:
            raise ValueError(
                f"language {spec.language!r} has no builder; this runtime imports "
                f"{' and '.join(IMPORTED_LANGUAGES)} solutions and builds "
                f"{' and '.join(BUILT_LANGUAGES)} ones"
            )
        entry_file, symbol = spec.entry_point.split("::")
        if not entry_file.endswith(".py"):
            raise ValueError(f"entry file {entry_file!r} is not a .py file")
        if spec.language == "triton":
            _triton_without_gpu(entry.label)
        folder, digest = materialize(solution)
        # Each solution is its own package, so its files may import each other relatively
        # and two solutions with a file of the same name do not collide.
        package = f"_fibgen_solution_{digest}"
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [str(folder)]
            sys.modules[package] = module
        module = importlib.import_module(f"{package}.{entry_file[:-3].replace('/', '.')}")
        # Triton kernels the solution defines launch without Triton's per-call work.
        from fibgen.runtime.launch import accelerate_modules

        prefix = package + "."
        accelerated = accelerate_modules(
            [m for n, m in list(sys.modules.items()) if n.startswith(prefix)], package
        )
        fn = getattr(module, symbol, None)
        if not callable(fn):
            raise ValueError(f"{entry_file} defines no function {symbol!r}")
        if accelerated:
            _ACCELERATED[module.__name__] = accelerated
        return fn
    except Exception as exc:
        raise SolutionError(
            f"{entry.label} for definition {entry.definition!r} failed to load: "
            f"{type(exc).__name__}: {exc}",
            entry.definition,
            entry.label,
        ) from exc


# Note [Triton without a GPU]
# Without a GPU, a kernel Triton compiled fails at its first launch with "0 active drivers
# ([]). There should only be one." Its interpreter runs the same kernels on the CPU, slowly,
# but only kernels decorated while TRITON_INTERPRET=1 is set, Triton's own library
# (`tl.sum`, `tl.cdiv`, ...) included, which it decorates when it is first imported. So
# where there is no GPU and Triton is not imported yet, TRITON_INTERPRET=1 is set before the
# solution is imported, as bench's CPU workers do, for the whole process (a compiled Triton
# kernel could not run in it anyway), and said once. Where Triton was imported already with
# its interpreter off, or TRITON_INTERPRET=0 is set, the solution fails to load, saying what
# to do.


def _triton_without_gpu(label: str) -> None:
    """Turn Triton's interpreter on where no GPU can run its kernels (Note above)."""
    import torch

    setting = os.environ.get("TRITON_INTERPRET", "").strip()
    if setting not in ("", "0") or torch.cuda.is_available():
        return  # a GPU, or a setting Triton reads its own way ("1", "true", ...)
    if setting == "0":
        raise ValueError(
            "there is no GPU here and TRITON_INTERPRET=0 keeps Triton's interpreter off: run "
            "on a machine with a GPU, or unset TRITON_INTERPRET to run the kernels under the "
            "interpreter (slow)"
        )
    if "triton" in sys.modules:
        standard = sys.modules.get("triton.language.standard")
        if type(getattr(standard, "cdiv", None)).__name__ != "InterpretedFunction":
            raise ValueError(
                "there is no GPU here, and Triton was imported with its interpreter off, so "
                "its kernels cannot run: start the process with TRITON_INTERPRET=1 to run them "
                "under the interpreter (slow), or run on a machine with a GPU"
            )
    os.environ["TRITON_INTERPRET"] = "1"
    warnings.warn(
        f"fibgen: there is no GPU here: {label} (and any Triton kernel imported from now on) "
        "runs under Triton's interpreter, slowly (TRITON_INTERPRET=1; set TRITON_INTERPRET=0 "
        "to refuse instead)",
        RuntimeWarning,
        stacklevel=2,
    )


def allocate_outputs(definition: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """One empty buffer per output of ``definition`` (its JSON), sized from the inputs.

    Const axes come from the definition, var axes from the shapes of the input tensors that
    carry them; the buffers go on the device of the first input tensor.
    """
    import torch

    from fibgen.runtime.inputs import torch_dtype

    axes = {n: a["value"] for n, a in definition["axes"].items() if a.get("type") == "const"}
    device = None
    for name, spec in definition["inputs"].items():
        value = inputs.get(name)
        if isinstance(value, torch.Tensor):
            device = device or value.device
            for axis, size in zip(spec.get("shape") or (), value.shape):
                axes.setdefault(axis, int(size))
    out = {}
    for name, spec in definition["outputs"].items():
        shape = spec.get("shape")
        if shape is None:
            raise ValueError(
                f"{definition['name']}: output {name!r} is a scalar and has no buffer; "
                "call the solution in value-returning style"
            )
        missing = [a for a in shape if a not in axes]
        if missing:
            raise ValueError(
                f"{definition['name']}: cannot size output {name!r}: no input carries axis "
                f"{', '.join(missing)}"
            )
        out[name] = torch.empty(
            [axes[a] for a in shape], dtype=torch_dtype(spec["dtype"]), device=device or "cpu"
        )
    return out


# ---------------------------------------------------------------------------------------
# Note [calling styles]
# flashinfer-bench's apply(name, args) takes a call in either style and tells them apart by
# the number of arguments: the definition's inputs (value-returning: the outputs are
# returned) or its inputs and then its outputs (destination-passing: written into, None
# returned). Hand-written code calls `apply` without the definition's tensors, so a
# Solution routed there is wrapped by `either_style`: the call's style is read from its
# arguments, and when it is not the solution's, the outputs are allocated from the inputs'
# shapes and returned, or the returned values copied into the caller's buffers. Like
# flashinfer-bench, the solution is called positionally in the definition's order.

_definitions: dict[tuple[str, str], Any] = {}


def _dataset_root(path: Path) -> Path | None:
    for folder in path.parents:
        if folder.name == "solutions":
            return folder.parent
    return None


def find_definition(name: str, root: Path | None = None) -> dict | None:
    """The JSON of definition ``name``: from ``root``'s definitions/, else fibgen's catalogue."""
    key = (name, str(root))
    if key in _definitions:
        return _definitions[key]
    found = None
    if root is not None:
        from fibgen.format.dataset import dataset_files

        files = dataset_files(root, "definitions")
        for path in [p for p in files if p.stem == name] + files:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("name") == name:
                found = data
                break
    if found is None:
        from fibgen.paths import builtin_definition_file

        path = builtin_definition_file(name)
        if path is not None:
            found = json.loads(path.read_text(encoding="utf-8"))
    _definitions[key] = found
    return found


def either_style(
    fn: Callable[..., Any], definition: Mapping[str, Any], dps: bool, label: str
) -> Callable[..., Any]:
    """``fn`` (of style ``dps``) callable in both styles (Note [calling styles])."""
    inputs = list(definition["inputs"])
    outputs = list(definition["outputs"])
    n_in, n_all = len(inputs), len(inputs) + len(outputs)
    name = definition["name"]

    def call(*args: Any, **kwargs: Any) -> Any:
        given = len(args) + len(kwargs)
        if given not in (n_in, n_all):
            raise TypeError(
                f"{label} for {name!r}: called with {given} arguments; the definition takes "
                f"its {n_in} inputs ({', '.join(inputs)}), or those and its "
                f"{n_all - n_in} outputs ({', '.join(outputs)}) to write into"
            )
        names = inputs if given == n_in else inputs + outputs
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names or key in values:
                raise TypeError(f"{label} for {name!r}: unexpected or repeated argument {key!r}")
            values[key] = value
        if (given == n_all) == dps:
            return fn(*(values[n] for n in names))
        if dps:
            buffers = allocate_outputs(definition, values)
            fn(*(values[n] for n in inputs), *buffers.values())
            result = tuple(buffers.values())
            return result[0] if len(result) == 1 else result
        result = fn(*(values[n] for n in inputs))
        result = result if isinstance(result, (tuple, list)) else (result,)
        for output, value in zip(outputs, result):
            values[output].copy_(value)
        return None

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call
