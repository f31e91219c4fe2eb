"""FlashInfer's traced API entry points, found as FlashInfer registers them.

FlashInfer attaches a trace template to an API with a decorator of
``flashinfer/api_logging.py``: ``@flashinfer_api(trace=T)`` or
``@flashinfer_experimental_api(trace=T)``, where ``T`` is a ``TraceTemplate`` of
``flashinfer/trace/templates/`` or a dispatch function that picks one per call. When the
decorated module is imported, ``_attach_fi_trace`` appends the function to
``api_logging._TRACE_REGISTRY`` (a dispatch function's ``templates`` each) and names it by
``module.qualname`` through its ``_TRACE_FI_API_ALIASES`` (the ``fi_api:`` tag of every
definition it emits). Importing every module is not possible here: a quarter of the modules
that decorate traced APIs import CUDA-only packages (``cuda``, ``cutlass``). So the package's
source is read instead (``fibgen.format.fi_source``): every function and method whose
decorator resolves to one of the two, with a ``trace=`` that is not ``None``, is a traced
entry point (Note [traced entry points]). Its templates are FlashInfer's own objects, imported
from ``flashinfer.trace.templates`` (which needs torch only), and ``trace_definition`` runs
them as the decorator does, so what FlashInfer writes for a call can be made on a CPU.

This module imports neither FlashInfer nor torch until templates are asked for.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fibgen.format.fi_source import PackageSource, Target, cache_file

# Note [traced entry points]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# An entry point is one function object that FlashInfer registers: `flashinfer.norm.rmsnorm`,
# `flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.plan`. It is named as FlashInfer names
# it in the `fi_api:` tag of what it traces (`module.qualname` of the defining module, through
# FlashInfer's alias table): `flashinfer.fused_moe.core.trtllm_fp8_block_scale_moe`, not the
# re-export `flashinfer.fused_moe.trtllm_fp8_block_scale_moe` that a family's `api` line may
# spell. Any path that resolves to the same function (a re-export, a subclass that inherits
# the method) names the same entry point (`TracedApis.lookup`). Two functions that share one
# template (FlashInfer's prims_ts MoE backends reuse the trtllm templates) are two entry
# points, as FlashInfer registers both.

PACKAGE = "flashinfer"
DISTRIBUTION = "flashinfer-python"
# The release whose traced entry points the catalogue is checked against
# (tests/test_flashinfer_coverage.py): what a missing FlashInfer is told to install.
CATALOGUED = "0.7.2.post1"
# Where FlashInfer defines the decorators that register traced APIs.
REGISTRY_MODULE = "flashinfer.api_logging"
DECORATORS = ("flashinfer_api", "flashinfer_experimental_api")
ALIAS_TABLE = "_TRACE_FI_API_ALIASES"
# Read before parsing: a module whose text lacks it decorates no traced API.
_NEEDLE = "trace="


class FlashInferUnavailable(Exception):
    """FlashInfer's source is not installed, or not laid out as this module reads it."""


class TemplateUnavailable(Exception):
    """A traced entry point's template cannot be imported or run here; says why."""


@dataclass(frozen=True)
class TracedApi:
    """One traced entry point (Note [traced entry points])."""

    path: str  # FlashInfer's name for it: the `fi_api:` tag of its definitions
    module: str  # the module that defines it
    qualname: str
    decorator: str  # "flashinfer_api" or "flashinfer_experimental_api"
    trace: str  # the `trace=` argument as written
    line: int

    @property
    def defined(self) -> str:
        """Where it is defined: ``module.qualname``."""
        return f"{self.module}.{self.qualname}"

    @property
    def experimental(self) -> bool:
        """Whether FlashInfer marks it experimental."""
        return self.decorator == "flashinfer_experimental_api"


@dataclass(frozen=True)
class Lookup:
    """What a path names: the traced entry point, or why it names none."""

    api: TracedApi | None
    # Why the path names no traced entry point, said of it: "names nothing that flashinfer
    # 0.7.2.post1 defines". None when ``api`` is found.
    problem: str | None = None
    # Whether the path names something FlashInfer defines (a function without a trace
    # template, a class) when it names no traced entry point.
    defined: bool = False


class TracedApis:
    """Every traced entry point of one FlashInfer package, and the paths that name them."""

    def __init__(self, source: PackageSource, version: str) -> None:
        self.source = source
        self.version = version
        # Modules that may decorate traced APIs but cannot be parsed here (a syntax this
        # Python lacks), with why: their entry points are missing from ``apis``.
        self.unreadable: tuple[tuple[str, str], ...] = ()
        self.apis: tuple[TracedApi, ...] = tuple(sorted(self._scan(), key=lambda a: a.path))
        self._by_defined = {a.defined: a for a in self.apis}
        self._by_path = {a.path: a for a in self.apis}
        self.source.save()

    def __len__(self) -> int:
        return len(self.apis)

    def __iter__(self):
        return iter(self.apis)

    # ------------------------------------------------------------------ discovery
    def _scan(self) -> list[TracedApi]:
        registry = self.source.table(REGISTRY_MODULE)
        if registry is None or not all(d in registry["functions"] for d in DECORATORS):
            raise FlashInferUnavailable(
                f"{self.source.root} has no {REGISTRY_MODULE.replace('.', '/')}.py defining "
                f"{' and '.join(DECORATORS)}: fibgen does not know how this FlashInfer "
                "registers its traced APIs"
            )
        aliases = registry["str_maps"].get(ALIAS_TABLE, {})
        found: list[TracedApi] = []
        unreadable: list[tuple[str, str]] = []
        for module in self.source.files:
            if not self.source.mentions(module, _NEEDLE):
                continue
            if self.source.table(module) is None:
                # Its entry points cannot be known: said, not left out (`unreadable`).
                unreadable.append((module, self.source.problem(module) or "cannot be read"))
                continue
            for fn in self.source.functions(module):
                for decorator in fn.decorators:
                    trace = dict(decorator.keywords).get("trace")
                    if trace is None or trace == "None":
                        continue  # the cheap test first: most decorators take no `trace=`
                    kind = self._registering(module, decorator.name)
                    if kind is None:
                        continue
                    defined = f"{module}.{fn.qualname}"
                    found.append(
                        TracedApi(
                            aliases.get(defined, defined),
                            module,
                            fn.qualname,
                            kind,
                            trace,
                            fn.line,
                        )
                    )
                    break
        self.unreadable = tuple(unreadable)
        return found

    def _registering(self, module: str, name: str) -> str | None:
        """Which of FlashInfer's registering decorators ``name`` is inside ``module``, under
        whatever name the module imports it (``flashinfer_experimental_api as experimental``)."""
        target = self.source.resolve_name(module, name)
        if target is None or target.module != REGISTRY_MODULE or target.kind != "function":
            return None
        return target.qualname if target.qualname in DECORATORS else None

    # ------------------------------------------------------------------ paths
    def lookup(self, path: str) -> Lookup:
        """The traced entry point ``path`` names, through re-exports and inheritance; or
        why it names none."""
        if path in self._by_path:
            return Lookup(self._by_path[path])
        if path.partition(".")[0] != PACKAGE:
            return Lookup(None, f"is not in the package `{PACKAGE}`")
        target = self.source.resolve(path)
        if target is None:
            return Lookup(None, f"names nothing that flashinfer {self.version} defines")
        api = self._by_defined.get(target.path)
        if api is not None:
            return Lookup(api)
        if target.kind != "function":
            return Lookup(None, f"is a {target.kind} of flashinfer, not a function", True)
        return Lookup(
            None,
            f"is a function without a trace template (`{target.path}` has no "
            "`@flashinfer_api(trace=...)`)",
            True,
        )

    def closest(self, path: str, n: int = 3) -> list[str]:
        """The entry points whose names are closest to ``path``, for a did-you-mean."""
        # Every name shares `flashinfer.`, which would make any two look alike: compare the rest.
        prefix = PACKAGE + "."
        names = {a.path.removeprefix(prefix): a.path for a in self.apis}
        close = difflib.get_close_matches(path.removeprefix(prefix), names, n=n, cutoff=0.6)
        if close:
            return [names[c] for c in close]
        # A re-export spells another module: compare the last names alone.
        last = path.rpartition(".")[2]
        return sorted(a.path for a in self.apis if a.path.rpartition(".")[2] == last)[:n]

    # ------------------------------------------------------------------ templates
    def template_object(self, api: TracedApi) -> Any:
        """The object passed as ``trace=``: a ``TraceTemplate`` or a dispatch function."""
        target = self.source.resolve_name(api.module, api.trace)
        if target is None or not target.qualname:
            raise TemplateUnavailable(
                f"`trace={api.trace}` of {api.path} names nothing fibgen can find in "
                f"{api.module}"
            )
        return _import_object(target)

    def templates(self, api: TracedApi) -> tuple[Any, ...]:
        """The ``TraceTemplate`` objects the entry point traces with: its template, or those
        its dispatch function lists in ``templates`` (FlashInfer's registry holds the same),
        or else the templates its code names."""
        from flashinfer.trace.template import TraceTemplate

        obj = self.template_object(api)
        if isinstance(obj, TraceTemplate):
            return (obj,)
        listed = tuple(t for t in getattr(obj, "templates", ()) if isinstance(t, TraceTemplate))
        if listed:
            return listed
        # A dispatch function with no list (MoELayer's returns one adapter): the templates
        # that its code reads from its module.
        code = getattr(obj, "__code__", None)
        names = getattr(code, "co_names", ()) if code is not None else ()
        scope = getattr(obj, "__globals__", {})
        return tuple(scope[n] for n in names if isinstance(scope.get(n), TraceTemplate))

    def op_types(self, api: TracedApi) -> tuple[str, ...]:
        """The op types of the entry point's templates, sorted."""
        return tuple(sorted({t.op_type for t in self.templates(api)}))

    def trace_definition(self, api: TracedApi, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The definition JSON FlashInfer's decorator writes for a call whose bound arguments
        (defaults applied, ``self`` included for a method) are ``arguments``: the template's
        own ``fi_trace``, built and called as ``_attach_fi_trace`` does; ``{}`` where a
        dispatch function traces nothing for the call. Nothing is written: FlashInfer's
        dump folder is a temporary one."""
        import tempfile

        from flashinfer.trace.template import TraceTemplate

        obj = self.template_object(api)
        kwargs = dict(arguments)
        with tempfile.TemporaryDirectory(prefix="fibgen-fi-trace-") as folder:
            if isinstance(obj, TraceTemplate):
                template = obj
            else:
                template = obj(save_dir=None, name=None, **kwargs)
                if template is None:
                    return {}
            fi_trace = template.build_fi_trace_fn(api.path)
            return fi_trace(save_dir=folder, **kwargs)


def _import_object(target: Target) -> Any:
    try:
        obj: Any = importlib.import_module(target.module)
        for attr in target.qualname.split("."):
            obj = getattr(obj, attr)
    except Exception as exc:  # an import error of FlashInfer's, or an attribute it lacks
        raise TemplateUnavailable(
            f"cannot import {target.path}: {type(exc).__name__}: {exc}"
        ) from None
    return obj


def flashinfer_root() -> Path:
    """The folder of the installed FlashInfer package, found without importing it."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FlashInferUnavailable(
            f"{PACKAGE} is not installed (pip install --no-deps {DISTRIBUTION}=={CATALOGUED})"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _version(root: Path) -> str:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        return "(version unknown)"
    # The distribution installed may be another copy than the one at `root` (a checkout on
    # PYTHONPATH): its version is then not this source's.
    located = Path(str(dist.locate_file(PACKAGE)))
    if os.path.realpath(located) != os.path.realpath(root):
        return "(version unknown)"
    return dist.version


_CACHE: dict[tuple[str, str], TracedApis] = {}


def traced_apis(root: Path | None = None, *, version: str | None = None) -> TracedApis:
    """Every traced entry point of the FlashInfer at ``root`` (default: the installed one);
    FlashInferUnavailable says why there are none. Read once per process and package."""
    root = flashinfer_root() if root is None else Path(root)
    if not (root / "__init__.py").is_file():
        raise FlashInferUnavailable(f"{root} is not a Python package (no __init__.py)")
    version = _version(root) if version is None else version
    key = (os.path.realpath(root), version)
    if key not in _CACHE:
        source = PackageSource(root, PACKAGE, cache=cache_file(root))
        _CACHE[key] = TracedApis(source, version)
    return _CACHE[key]
