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
import importlib.machinery
import importlib.util
import inspect
import json
import linecache
import os
import shutil
import sys
import tempfile
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeGuard

from fibgen.runtime.caller import warn
from fibgen.runtime.errors import ApplyConfigError, SolutionError

# Languages whose sources are imported as Python, and those compiled by runtime.builders.
IMPORTED_LANGUAGES = ("python", "triton")
BUILT_LANGUAGES = ("cpp", "cuda")


@dataclass(frozen=True)
class Origin:
    """Where a Solution was read from: its JSON file, and whether its sources are the files
    of the solution folder around it (Note [source names])."""

    json: str
    folder: bool = False

    @classmethod
    def of(cls, path: str | os.PathLike[str], solution: Any) -> Origin:
        """The origin of ``solution``, read from the JSON at ``path``."""
        from fibgen.format.dataset import is_solution_folder

        return cls(str(path), is_solution_folder(path, solution))

    def name(self, source: str) -> str:
        """How messages name the solution's source ``source`` (its relative path)."""
        if self.folder:
            return str(Path(self.json).parent / source)
        return f"{self.json}: {source}"


@dataclass(frozen=True)
class Entry:
    """One registered solution, not loaded yet: a callable, or a Solution model."""

    definition: str
    label: str
    fn: Callable[..., Any] | None = None
    solution: Any = None
    # The dataset the Solution came from, whose definitions/ may hold its definition.
    root: Path | None = None
    # Whether ``fn`` is destination-passing, where fibgen made it (a keyed selection's entry):
    # then, like a Solution, it takes either calling style from hand-written code.
    dps: bool | None = None
    # Where the Solution was read from: messages name its files (Note [source names]).
    origin: Origin | None = None


@dataclass(frozen=True)
class Loaded:
    """A solution ready to call: ``dps`` says whether it takes output buffers, ``inplace``
    whether it also takes ``inplace=True`` (Note [in-place solutions] in
    fibgen/runtime/routing/state.py)."""

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
    given = origin == "given object"
    return Entry(
        definition,
        f"solution {solution.name!r} ({origin})",
        solution=solution,
        root=None if given else _dataset_root(Path(origin)),
        origin=None if given else Origin.of(origin, solution),
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


def is_definition_json(data: Any) -> TypeGuard[dict[str, Any]]:
    """Whether JSON has what routing reads of a definition (a name, axes, inputs, outputs
    and a reference)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("name"), str)
        and isinstance(data.get("axes"), dict)
        and all(isinstance(a, dict) for a in data["axes"].values())
        and isinstance(data.get("inputs"), dict)
        and all(isinstance(t, dict) for t in data["inputs"].values())
        and isinstance(data.get("outputs"), dict)
        and isinstance(data.get("reference"), str)
    )


def bad_definition_files(root: Path, paths: Sequence[Path]) -> list[str]:
    """Those of a dataset's definition files that are not Definition JSON (unreadable,
    truncated, or missing what a definition has), as sorted paths under ``root``."""
    bad = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        if not is_definition_json(data):
            try:
                bad.append(str(Path(path).relative_to(root)))
            except ValueError:
                bad.append(str(path))
    return sorted(bad)


def bad_definitions_message(root: Path, bad: Sequence[str]) -> str:
    """What enable_apply says of a dataset's definition files that are not Definition JSON."""
    shown = ", ".join(bad[:3]) + (f", ... ({len(bad) - 3} more)" if len(bad) > 3 else "")
    return (
        f"{len(bad)} file(s) under {root}/definitions are not Definition JSON ({shown}; "
        f"`fibgen validate {root}` says why): solutions of what they define run without "
        "their definition (no input check, no reference to stand in for a missing fallback)"
    )


def _collect_folder(root: Path) -> dict[str, Entry]:
    from fibgen.format.dataset import dataset_files

    folder = root / "solutions"
    if root.is_file():
        # A Solution JSON on its own: it is given under the definition it serves.
        try:
            name = json.loads(root.read_text(encoding="utf-8")).get("definition")
        except (OSError, ValueError, AttributeError):
            name = None
        key = repr(name) if isinstance(name, str) and name else "'<definition>'"
        raise ApplyConfigError(
            f"apply path {root} is a file; a Solution JSON is given under the definition it "
            f"serves, enable_apply({{{key}: {str(root)!r}}}), and a dataset as its folder"
        )
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
    bad = bad_definition_files(root, dataset_files(root, "definitions"))
    if bad:
        warn(f"fibgen: {bad_definitions_message(root, bad)}")
    if not entries:
        warn(f"fibgen: apply path {root} holds no Solution JSON under {folder}; no call is routed")
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
        fn, dps = entry.fn, entry.dps
    else:
        fn = _import_solution(entry)
        dps = entry.solution.spec.destination_passing_style
        if entry.solution.spec.language in BUILT_LANGUAGES and (inputs or outputs):
            from fibgen.runtime.solutions.builders import by_name

            # Like Trace Apply, built solutions are called positionally; the dispatcher
            # passes keywords, so the wrapper takes the definition's names.
            fn = by_name(fn, inputs + outputs if dps else inputs)
    # Without the definition's tensors (hand-written apply) there is nothing to check against;
    # a Solution then takes either calling style (Note [calling styles]).
    if not inputs and not outputs:
        if entry.solution is not None or entry.dps is not None:
            definition = find_definition(entry.definition, entry.root)
            if definition is not None:
                fn = either_style(fn, definition, bool(dps), entry.label)
        return Loaded(fn, bool(dps), entry.label)
    dps, problem = signature_problem(fn, entry.definition, entry.label, inputs, outputs, dps)
    if problem is not None:
        raise SolutionError(problem, entry.definition, entry.label, signature=True)
    inplace = dps and takes_inplace(fn)
    if dps and scalars is not None and _ACCELERATED.get(getattr(fn, "__module__", None)):
        from fibgen.runtime.launch.replay import wrap

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
_ACCELERATED: dict[str | None, int] = {}

TRITON_INSTALL = "pip install 'fibgen[triton]'"


def _import_solution(entry: Entry) -> Callable[..., Any]:
    solution = entry.solution
    spec = solution.spec
    if spec.language == "triton" and not triton_installed():
        # Said before anything else: no interpreter to turn on, nothing to import.
        raise SolutionError(
            f"{entry.label} for definition {entry.definition!r} is a Triton solution, and "
            f"Triton is not installed here: {TRITON_INSTALL}",
            entry.definition,
            entry.label,
        )
    names: set[str] = set()
    try:
        if spec.language in BUILT_LANGUAGES:
            from fibgen.runtime.solutions.builders import build_solution

            origin = entry.origin
            sources_at = str(Path(origin.json).parent) if origin and origin.folder else None
            return build_solution(solution, sources_at=sources_at)[0]
        if spec.language not in IMPORTED_LANGUAGES:
            raise ValueError(
                f"language {spec.language!r} has no builder; this runtime imports "
                f"{' and '.join(IMPORTED_LANGUAGES)} solutions and builds "
                f"{' and '.join(BUILT_LANGUAGES)} ones"
            )
        entry_file, symbol = spec.entry_point.split("::")
        if not entry_file.endswith(".py"):
            raise ValueError(f"entry file {entry_file!r} is not a .py file")
        if spec.language == "triton" or (_imports_triton(solution) and triton_installed()):
            _triton_without_gpu(entry.label)
        folder, digest = materialize(solution)
        names = {_source_name(entry.origin, folder, s.path) for s in solution.sources}
        _SOLUTION_FILES.update(names)
        # Each solution is its own package, so its files may import each other relatively
        # and two solutions with a file of the same name do not collide.
        package = f"_fibgen_solution_{digest}"
        module = sys.modules.get(package)
        if module is None:
            module = sys.modules[package] = types.ModuleType(package)
        # Also for a package imported before (from another cache, as another user's files):
        # a module it could not import is tried anew from here, under this user's names.
        module.__path__ = [str(folder)]
        if entry.origin is not None:
            _SolutionFinder.register(package, folder, entry.origin)
        module = importlib.import_module(f"{package}.{entry_file[:-3].replace('/', '.')}")
        # Triton kernels the solution defines launch without Triton's per-call work.
        from fibgen.runtime.launch.fast import accelerate_modules

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
        where = place(exc, names)
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "triton":
            hint = f"; Triton is not installed here: {TRITON_INSTALL}"
        # A SyntaxError's own text names the file by its last part: `where` names it whole.
        text = exc.msg if isinstance(exc, SyntaxError) and where else exc
        raise SolutionError(
            f"{entry.label} for definition {entry.definition!r} failed to load: "
            f"{type(exc).__name__}: {text}{where}{hint}",
            entry.definition,
            entry.label,
        ) from exc


def triton_installed() -> bool:
    """Whether Triton can be imported, without importing it (Note [Triton without a GPU])."""
    if sys.modules.get("triton") is not None:
        return True
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def _imports_triton(solution: Any) -> bool:
    """Whether a Python solution's sources import Triton (at any level of a file)."""
    import ast

    for source in solution.sources:
        if not source.path.endswith(".py") or "triton" not in source.content:
            continue
        try:
            tree = ast.parse(source.content)
        except SyntaxError:
            continue  # the import reports it
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(n.split(".")[0] == "triton" for n in names):
                return True
    return False


# Note [source names]
# A Solution's sources are written under the cache (`materialize`) and imported from there,
# but the files a user edits are those of the solution folder, or the Solution JSON that
# holds them. So each file is compiled under the name of the user's (`Origin.name`): the
# folder's file, or "<json>: main.py" for a source the JSON holds. Tracebacks,
# warnings, Triton's errors, apply's messages and bench's trace logs then name the file to
# open, with the line in it; the cache's copy is named only where there is no user's file
# (a Solution given as an object). The module's __file__ stays the cache's copy, so a
# solution that reads files beside it finds them. linecache gets the text imported under
# the user's name, so that inspect (through which Triton reads a kernel's source) sees what
# was imported even after the user's file changed.


# How messages name the files of every solution imported so far.
_SOLUTION_FILES: set[str] = set()


def _source_name(origin: Origin | None, folder: Path, source: str) -> str:
    return origin.name(source) if origin is not None else str(folder / source)


def place(exc: BaseException, names: set[str] | None = None) -> str:
    """Where in a solution's own files ``exc`` was raised, as " (in FILE, line N)", or "".

    ``names``: the files of one solution; by default those of every solution imported.
    """
    names = _SOLUTION_FILES if names is None else names
    if isinstance(exc, SyntaxError) and exc.filename in names:
        return f" (in {exc.filename}, line {exc.lineno})"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename in names:
            return f" (in {frame.filename}, line {frame.lineno})"
    return ""


def solution_traceback(exc: BaseException) -> str | None:
    """``exc`` formatted from the first line of a solution's own files on, or None where it
    passed through none: the part of a traceback that is about the solution."""
    if isinstance(exc, SyntaxError) and exc.filename in _SOLUTION_FILES:
        return "".join(traceback.format_exception_only(type(exc), exc))
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename not in _SOLUTION_FILES:
        tb = tb.tb_next
    if tb is None:
        return None
    return "".join(traceback.format_exception(type(exc), exc, tb))


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """Imports a solution's file from the cache under the user's name for it."""

    def __init__(self, fullname: str, path: str, shown: str) -> None:
        super().__init__(fullname, path)
        self.shown = shown

    def get_code(self, fullname: str) -> types.CodeType:
        data = self.get_data(self.path)
        lines = importlib.util.decode_source(data).splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        # mtime None: linecache.checkcache keeps the entry (Note [source names]).
        linecache.cache[self.shown] = (len(data), None, lines, self.shown)
        # No bytecode cache: a .pyc would carry the cache's path back in.
        return compile(data, self.shown, "exec", dont_inherit=True)


class _SolutionFinder:
    """Finds the modules of imported solutions, to be loaded under their users' names."""

    # package -> (the folder its files were written to, where they came from)
    packages: ClassVar[dict[str, tuple[str, Origin]]] = {}

    @classmethod
    def register(cls, package: str, folder: Path, origin: Origin) -> None:
        """Name the files of ``package`` (materialized in ``folder``) as ``origin`` says."""
        cls.packages[package] = (os.path.abspath(folder), origin)
        if cls not in sys.meta_path:
            sys.meta_path.insert(0, cls)

    @classmethod
    def find_spec(cls, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, dot, _ = fullname.partition(".")
        known = cls.packages.get(package) if dot else None
        if known is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if (
            spec is None
            or spec.origin is None
            or type(spec.loader) is not importlib.machinery.SourceFileLoader
        ):
            return spec
        folder, origin = known
        source = os.path.relpath(os.path.abspath(spec.origin), folder)
        if source.startswith(".."):
            return spec
        spec.loader = _SourceLoader(fullname, spec.origin, origin.name(Path(source).as_posix()))
        return spec


# Note [Triton without a GPU]
# Without a GPU, a kernel Triton compiled fails at its first launch with "0 active drivers
# ([]). There should only be one." Its interpreter runs the same kernels on the CPU, slowly,
# but only kernels decorated while TRITON_INTERPRET=1 is set, Triton's own library
# (`tl.sum`, `tl.cdiv`, ...) included, which it decorates when it is first imported. So
# where there is no GPU and Triton is not imported yet, TRITON_INTERPRET=1 is set before a
# Triton solution (or a Python one that imports Triton) is imported, as bench's CPU workers
# do, for the whole process (a compiled Triton kernel could not run in it anyway), and said
# once. fibgen itself never imports Triton before that: loading any solution looks for
# Triton kernels only where Triton was imported already (`_jit_function_type` in launch.py).
# Where Triton was imported already with its interpreter off, or TRITON_INTERPRET=0 is set,
# the solution fails to load, saying what to do; where Triton is not installed, it fails
# saying how to install it, before any of this.


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
    warn(
        f"fibgen: there is no GPU here: {label} (and any Triton kernel imported from now on) "
        "runs under Triton's interpreter, slowly (TRITON_INTERPRET=1; set TRITON_INTERPRET=0 "
        "to refuse instead)"
    )


def allocate_outputs(definition: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """One empty buffer per output of ``definition`` (its JSON), sized from the inputs.

    Const axes come from the definition, var axes from the shapes of the input tensors that
    carry them, or from the integer scalar input of their name (Note [axes bound by a scalar]
    in fibgen/compiler/ir.py); the buffers go on the device of the first input tensor.
    """
    return output_allocator(definition)(inputs)


def output_allocator(
    definition: Mapping[str, Any],
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """``allocate_outputs`` for one definition, its axes and dtypes read once: what a call
    that needs buffers made for it pays is the reads of its inputs' shapes and the allocation."""
    import torch

    from fibgen.format.models import var_axis_scalars
    from fibgen.runtime.inputs.make import torch_dtype

    consts = {n: a["value"] for n, a in definition["axes"].items() if a.get("type") == "const"}
    carriers = [(n, tuple(spec.get("shape") or ())) for n, spec in definition["inputs"].items()]
    scalars = list(var_axis_scalars(definition["axes"], definition["inputs"]).items())
    outputs = []
    for name, spec in definition["outputs"].items():
        try:
            dtype = torch_dtype(spec["dtype"]) if spec.get("shape") is not None else None
        except (KeyError, TypeError, ValueError):
            dtype = None  # said when a call needs this buffer
        outputs.append((name, spec.get("shape"), dtype, spec.get("dtype")))
    tensor = torch.Tensor

    def allocate(inputs: Mapping[str, Any]) -> dict[str, Any]:
        axes = dict(consts)
        device = None
        for name, shape in carriers:
            value = inputs.get(name)
            if isinstance(value, tensor):
                device = device or value.device
                for axis, size in zip(shape, value.shape):
                    axes.setdefault(axis, int(size))
        for axis, name in scalars:
            value = inputs.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                axes.setdefault(axis, value)
        out = {}
        for name, shape, dtype, dtype_name in outputs:
            if shape is None:
                raise ValueError(
                    f"{definition['name']}: output {name!r} is a scalar and has no buffer; "
                    "call the solution in value-returning style"
                )
            missing = [a for a in shape if a not in axes]
            if missing:
                raise ValueError(
                    f"{definition['name']}: cannot size output {name!r}: no input carries "
                    f"axis {', '.join(missing)} (nor gives it as a non-negative int)"
                )
            out[name] = torch.empty(
                [axes[a] for a in shape],
                dtype=dtype if dtype is not None else torch_dtype(dtype_name),
                device=device or "cpu",
            )
        return out

    return allocate


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

# (name, root) -> the definition's JSON and the file it was read from, or (None, None).
_definitions: dict[tuple[str, str], tuple[dict | None, Path | None]] = {}


def _dataset_root(path: Path) -> Path | None:
    for folder in path.parents:
        if folder.name == "solutions":
            return folder.parent
    return None


def find_definition(name: str, root: Path | None = None) -> dict | None:
    """The JSON of definition ``name``: from ``root``'s definitions/, else fibgen's catalogue.
    Each is read once and the same object returned after, until ``forget_unfound`` looks
    again for those a dataset did not have."""
    return _definition_and_file(name, root)[0]


def forget_unfound() -> None:
    """Look again, at the next lookup, for the definitions a dataset did not have (found in
    the catalogue or nowhere): one may have been added since. enable_apply and enable_tracing
    call it. The catalogue's are kept: the same object is returned for a name after."""
    for key, (_, path) in list(_definitions.items()):
        if key[1] != "None" and (path is None or not path.is_relative_to(key[1])):
            del _definitions[key]


def own_definition(name: str, root: Path | None) -> tuple[dict, Path] | None:
    """Definition ``name`` and its file from ``root``'s definitions/ only (the catalogue's for
    ``root`` None), or None."""
    data, path = _definition_and_file(name, root)
    if data is None or path is None or (root is not None and not path.is_relative_to(root)):
        return None
    return data, path


def _definition_and_file(name: str, root: Path | None) -> tuple[dict | None, Path | None]:
    key = (name, str(root))
    if key in _definitions:
        return _definitions[key]
    found: tuple[dict | None, Path | None] = (None, None)
    if root is not None:
        from fibgen.format.dataset import dataset_files

        files = dataset_files(root, "definitions")
        for path in [p for p in files if p.stem == name] + files:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("name") == name:
                found = (data, path)
                break
        if found[0] is None:
            found = _definition_and_file(name, None)  # the catalogue's, one object per name
    else:
        from fibgen.paths import builtin_definition_file

        builtin = builtin_definition_file(name)
        if builtin is not None:
            found = (json.loads(builtin.read_text(encoding="utf-8")), builtin)
    _definitions[key] = found
    return found


def bind_arguments(
    inputs: Sequence[str], outputs: Sequence[str], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any] | str:
    """A call's arguments as a definition's inputs, or its inputs and outputs (the two calling
    styles, Note [calling styles]): by position in that order, then by name. Why they are
    neither, where they are not."""
    given = len(args) + len(kwargs)
    n_in, n_all = len(inputs), len(inputs) + len(outputs)
    if given not in (n_in, n_all):
        return (
            f"called with {given} arguments; the definition takes its {n_in} inputs "
            f"({', '.join(inputs)}), or those and its {n_all - n_in} outputs "
            f"({', '.join(outputs)}) to write into"
        )
    names = inputs if given == n_in else [*inputs, *outputs]
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names or key in values:
            return f"unexpected or repeated argument {key!r}"
        values[key] = value
    return values


def input_values(
    inputs: Sequence[str], outputs: Sequence[str], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[Any] | str:
    """A call's values of a definition's inputs, in their order (by position, then by name;
    in either calling style), or why its arguments are not them."""
    if not kwargs and len(args) in (len(inputs), len(inputs) + len(outputs)):
        return list(args[: len(inputs)])  # by position: the inputs come first
    bound = bind_arguments(inputs, outputs, args, kwargs)
    if isinstance(bound, str):
        return bound
    return [bound[n] for n in inputs]


def either_style(
    fn: Callable[..., Any], definition: Mapping[str, Any], dps: bool, label: str
) -> Callable[..., Any]:
    """``fn`` (of style ``dps``) callable in both styles (Note [calling styles])."""
    inputs = list(definition["inputs"])
    outputs = list(definition["outputs"])
    n_in, n_all = len(inputs), len(inputs) + len(outputs)
    name = definition["name"]
    own = n_all if dps else n_in  # the count of a positional call in fn's own style
    allocators: list[Callable[[Mapping[str, Any]], dict[str, Any]]] = []  # made on first use

    def call(*args: Any, **kwargs: Any) -> Any:
        if not kwargs and len(args) == own:
            return fn(*args)  # its own style, by position: nothing to bind
        values = bind_arguments(inputs, outputs, args, kwargs)
        if isinstance(values, str):
            raise TypeError(f"{label} for {name!r}: {values}")
        given = len(values)
        names = inputs if given == n_in else inputs + outputs
        if (given == n_all) == dps:
            return fn(*(values[n] for n in names))
        if dps:  # called without its outputs: buffers made for it
            if not allocators:
                allocators.append(output_allocator(definition))
            buffers = allocators[0](values)
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
