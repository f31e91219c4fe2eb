"""An installed Python package read as source: what each module defines, imports and decorates.

FlashInfer registers a traced API when the module that defines it is imported (the decorator
appends to a registry), and many of its modules import CUDA-only packages, so importing them
is not a way to learn what they define. This module reads them instead: each module's source
is parsed with ``ast`` into a small table (its functions and classes by qualname, with their
decorators; its imports; its simple aliases), and dotted paths are followed through those
tables the way Python's imports would resolve them (Note [static resolution]).

Tables are cached on disk per file, keyed by its size and modification time (Note [source
table cache]), so a package of thousands of files is read once, not on every compile.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from fibgen.fsutil import atomic_write, cache_dir

# Note [static resolution]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# A dotted path (`flashinfer.comm.allreduce_fusion`, `flashinfer.mla.BatchMLAPagedAttentionWrapper
# .run`) is resolved as `import` and `getattr` would resolve it, from source alone: the longest
# prefix that is a module of the package (a `.py` file or a package's `__init__.py`), then each
# further name in that module's table: a function or class it defines (a class's methods and
# nested classes by qualname, its base classes searched in order for a name it does not
# define), a name it imports (`from .allreduce import allreduce_fusion as allreduce_fusion`,
# followed into that module, or a submodule of that name), a simple alias (`begin_forward =
# plan`), or a submodule. What only runs at import time is not followed: a module's
# `__getattr__` (FlashInfer's lazy `flashinfer.prims_ts_*` exports), names bound by loops or
# `globals()`; such a path is written as the module that defines or imports the name spells it.
# Following is bounded (`_MAX_HOPS`), so an import cycle ends as "not found".
#
# Note [source table cache]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# Parsing FlashInfer 0.7.2's source takes seconds (its 87 modules that decorate traced APIs,
# one of 7,000 lines), and `fibgen check` needs it for every `unroutable` path. The table of a
# file depends on its text only, so it is kept in `<cache>/pysource/<root hash>.json`, keyed
# by the file's size and mtime_ns; a file whose stat differs is parsed again. Reading the cache
# costs a walk over the package's files (stat only) and one JSON load. A cache that cannot be
# read or written is ignored: the tables are then made in memory, as they would be without it.

_MAX_HOPS = 32
_CACHE_VERSION = 1


@dataclass(frozen=True)
class Decorator:
    """A decorator call on a function: its dotted name as written and its keyword arguments
    as source text (``flashinfer_api(trace=rmsnorm_trace)``)."""

    name: str
    keywords: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class FunctionDef:
    """A function or method a module defines, by qualname."""

    module: str
    qualname: str
    line: int
    decorators: tuple[Decorator, ...]


@dataclass(frozen=True)
class Target:
    """What a dotted path resolves to: a function or a class of a module, or a module."""

    module: str
    qualname: str  # "" for a module
    kind: str  # "function", "class", "value" (any other binding) or "module"

    @property
    def path(self) -> str:
        """The defining module and the qualname, dotted."""
        return f"{self.module}.{self.qualname}" if self.qualname else self.module


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module of ``from <level dots><name> import ...`` inside ``module``."""
    if not level:
        return name or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def module_table(source: str, module: str, is_package: bool) -> dict[str, Any]:
    """The table of one module's source: plain data, JSON-serializable (Note [static
    resolution]); raises SyntaxError for a file Python cannot parse.

    ``names`` holds what each name of the module or of a class body (by qualname) is bound
    to last: ``["function"]``, ``["class", bases]``, ``["import", module, attr or None]``,
    ``["alias", dotted]`` or ``["value"]`` (any other assignment); ``functions`` every
    function with its line and decorators; ``star`` the modules imported with ``*``; ``all``
    the module's ``__all__`` where it is a literal; ``str_maps`` its literal tables of
    strings.
    """
    tree = ast.parse(source)
    table: dict[str, Any] = {"names": {}, "functions": {}, "star": [], "all": None, "str_maps": {}}
    names = table["names"]

    def scope(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                decorators = []
                for d in node.decorator_list:
                    call = d if isinstance(d, ast.Call) else None
                    name = _dotted(call.func if call else d)
                    if name is None:
                        continue
                    keywords = [
                        [k.arg, ast.unparse(k.value)]
                        for k in (call.keywords if call else [])
                        if k.arg is not None
                    ]
                    decorators.append([name, keywords])
                table["functions"][prefix + node.name] = [node.lineno, decorators]
                names[prefix + node.name] = ["function"]
            elif isinstance(node, ast.ClassDef):
                bases = [b for b in (_dotted(x) for x in node.bases) if b is not None]
                names[prefix + node.name] = ["class", bases]
                scope(node.body, prefix + node.name + ".", True)
            elif isinstance(node, ast.ImportFrom) and not in_class:
                base = _absolute(module, is_package, node.level, node.module)
                for alias in node.names:
                    if alias.name == "*":
                        table["star"].append(base)
                    else:
                        names[alias.asname or alias.name] = ["import", base, alias.name]
            elif isinstance(node, ast.Import) and not in_class:
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = ["import", alias.name, None]
                    else:
                        top = alias.name.partition(".")[0]
                        names[top] = ["import", top, None]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = _dotted(node.value)
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    if value is not None and value != target.id:
                        names[prefix + target.id] = ["alias", value]
                        continue
                    names[prefix + target.id] = ["value"]
                    if not in_class and target.id == "__all__":
                        table["all"] = _str_list(node.value)
                    elif not in_class:
                        mapping = _str_map(node.value)
                        if mapping is not None:
                            table["str_maps"][target.id] = mapping
            elif isinstance(node, ast.If):
                scope(node.body, prefix, in_class)
                scope(node.orelse, prefix, in_class)
            elif isinstance(node, ast.Try):
                # What an `except` binds is the fallback of an import that failed: read it
                # first, so that what the `try` binds (what runs where the import works)
                # is what the name means (gdn_decode's stand-in `flashinfer_api`).
                for handler in node.handlers:
                    scope(handler.body, prefix, in_class)
                for block in (node.body, node.orelse, node.finalbody):
                    scope(block, prefix, in_class)

    scope(tree.body, "", False)
    return table


def _str_list(node: ast.expr) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple)):
        found = [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
        if len(found) == len(node.elts):
            return found
    return None


def _str_map(node: ast.expr) -> dict[str, str] | None:
    """A dict literal of string keys and values (a module's table of names), else None."""
    if not isinstance(node, ast.Dict) or not node.keys:
        return None
    found: dict[str, str] = {}
    for key, value in zip(node.keys, node.values):
        if not (
            isinstance(key, ast.Constant)
            and isinstance(key.value, str)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            return None
        found[key.value] = value.value
    return found


class PackageSource:
    """The source of one installed package, read as tables (Note [static resolution])."""

    def __init__(self, root: Path, package: str, *, cache: Path | None = None) -> None:
        self.root = root  # the package's folder (holding its __init__.py)
        self.package = package
        self._cache_file = cache
        self._memory: dict[str, dict[str, Any]] = {}
        self._dirty = False

    # ------------------------------------------------------------------ files
    @cached_property
    def files(self) -> dict[str, tuple[Path, bool, tuple[int, int]]]:
        """Every module of the package: name → (file, is a package, (size, mtime_ns))."""
        found: dict[str, tuple[Path, bool, tuple[int, int]]] = {}
        for folder, dirs, names in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d.isidentifier())
            rel = Path(folder).relative_to(self.root).parts
            for name in sorted(names):
                stem, _, suffix = name.partition(".")
                if suffix != "py" or not stem.isidentifier():
                    continue
                path = Path(folder) / name
                try:
                    st = path.stat()
                except OSError:
                    continue
                is_package = stem == "__init__"
                parts = (self.package, *rel) if is_package else (self.package, *rel, stem)
                found[".".join(parts)] = (path, is_package, (st.st_size, st.st_mtime_ns))
        return found

    def is_module(self, name: str) -> bool:
        """Whether ``name`` is a module or package of this package."""
        return name in self.files

    # ------------------------------------------------------------------ tables
    @cached_property
    def _cached(self) -> dict[str, Any]:
        """The cache file's entries, ``module → {"stat", "table"?, "mentions"?}``."""
        if self._cache_file is None:
            return {}
        try:
            data = json.loads(self._cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != _CACHE_VERSION:
            return {}
        modules = data.get("modules")
        return modules if isinstance(modules, dict) else {}

    def _entry(self, module: str) -> dict[str, Any]:
        """What is known of ``module`` at its current stat (in memory, else from the cache)."""
        if module in self._memory:
            return self._memory[module]
        stat = list(self.files[module][2])
        cached = self._cached.get(module)
        entry = cached if isinstance(cached, dict) and cached.get("stat") == stat else None
        self._memory[module] = entry = dict(entry) if entry is not None else {"stat": stat}
        return entry

    def table(self, module: str) -> dict[str, Any] | None:
        """The table of ``module``; None where it is not a module of the package or does not
        parse."""
        if module not in self.files:
            return None
        entry = self._entry(module)
        if "table" not in entry:
            path, is_package, _ = self.files[module]
            try:
                entry["table"] = module_table(path.read_text(encoding="utf-8"), module, is_package)
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError) as exc:
                entry["table"] = None
                entry["problem"] = f"{type(exc).__name__}: {exc}"
            self._dirty = True
        return entry["table"]

    def problem(self, module: str) -> str | None:
        """Why ``module`` has no table (it cannot be read or parsed), once ``table`` was asked."""
        entry = self._memory.get(module)
        return None if entry is None else entry.get("problem")

    def mentions(self, module: str, needle: str) -> bool:
        """Whether the source of ``module`` holds ``needle`` (a cheap test before parsing)."""
        if module not in self.files:
            return False
        entry = self._entry(module)
        mentions = entry.setdefault("mentions", {})
        if needle not in mentions:
            try:
                mentions[needle] = needle.encode() in self.files[module][0].read_bytes()
            except OSError:
                mentions[needle] = False
            self._dirty = True
        return mentions[needle]

    def save(self) -> None:
        """Write what was learnt of the package's files to the cache (Note [source table
        cache]); a cache that cannot be written is left as it is."""
        if self._cache_file is None or not self._dirty:
            return
        modules = {
            m: e
            for m, e in {**self._cached, **self._memory}.items()
            if m in self.files and isinstance(e, dict) and e.get("stat") == list(self.files[m][2])
        }
        text = json.dumps({"version": _CACHE_VERSION, "modules": modules}, sort_keys=True)
        try:
            self._cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self._cache_file, text)
        except OSError:
            return
        self._dirty = False

    # ------------------------------------------------------------------ functions
    def function(self, module: str, qualname: str) -> FunctionDef | None:
        """The function ``qualname`` that ``module`` defines, with its decorators."""
        table = self.table(module)
        if table is None or qualname not in table["functions"]:
            return None
        line, decorators = table["functions"][qualname]
        return FunctionDef(
            module,
            qualname,
            line,
            tuple(Decorator(n, tuple((k, v) for k, v in kws)) for n, kws in decorators),
        )

    def functions(self, module: str) -> list[FunctionDef]:
        """Every function and method ``module`` defines, in source order."""
        table = self.table(module)
        if table is None:
            return []
        found = [self.function(module, q) for q in table["functions"]]
        return sorted((f for f in found if f is not None), key=lambda f: f.line)

    # ------------------------------------------------------------------ resolution
    def resolve(self, path: str) -> Target | None:
        """What the dotted ``path`` names (Note [static resolution]); None when it names
        nothing this package's source defines."""
        parts = path.split(".")
        for i in range(len(parts), 0, -1):
            module = ".".join(parts[:i])
            if self.is_module(module):
                return self._lookup(module, parts[i:], _MAX_HOPS)
        return None

    def resolve_name(self, module: str, name: str) -> Target | None:
        """What the name ``name`` (dotted) means inside ``module``."""
        return self._lookup(module, name.split("."), _MAX_HOPS)

    def _lookup(self, module: str, names: list[str], hops: int) -> Target | None:
        if hops <= 0:
            return None
        if not names:
            return Target(module, "", "module")
        table = self.table(module)
        if table is None:
            return None
        first, rest = names[0], names[1:]
        binding = table["names"].get(first)
        if binding is not None:
            return self._bound(module, first, binding, rest, hops - 1)
        if self.is_module(f"{module}.{first}"):
            return self._lookup(f"{module}.{first}", rest, hops - 1)
        for star in table["star"]:
            exported = self.table(star) if self.is_module(star) else None
            if exported is None:
                continue
            public = exported["all"]
            if (first in public) if public is not None else not first.startswith("_"):
                found = self._lookup(star, names, hops - 1)
                if found is not None:
                    return found
        return None

    def _bound(
        self, module: str, qualname: str, binding: list, rest: list[str], hops: int
    ) -> Target | None:
        """``rest`` inside what ``qualname`` of ``module`` is bound to."""
        kind = binding[0]
        if kind in ("function", "value"):
            return Target(module, qualname, kind) if not rest else None
        if kind == "class":
            return self._member(module, qualname, binding[1], rest, hops)
        if kind == "alias":
            scope = qualname.rpartition(".")[0]
            if scope:  # a class body's alias (`begin_forward = plan`) names a member first
                table = self.table(module)
                inner = f"{scope}.{binding[1]}"
                if table is not None and inner in table["names"]:
                    return self._bound(module, inner, table["names"][inner], rest, hops - 1)
            return self._lookup(module, binding[1].split(".") + rest, hops - 1)
        source, attr = binding[1], binding[2]
        if attr is None:
            return self._lookup_module(source, rest, hops - 1)
        found = self._lookup(source, [attr] + rest, hops - 1) if self.is_module(source) else None
        if found is None and self.is_module(f"{source}.{attr}"):
            found = self._lookup(f"{source}.{attr}", rest, hops - 1)
        return found

    def _lookup_module(self, module: str, names: list[str], hops: int) -> Target | None:
        parts = module.split(".")
        for i in range(len(parts), 0, -1):
            if self.is_module(".".join(parts[:i])):
                return self._lookup(".".join(parts[:i]), parts[i:] + names, hops)
        return None

    def _member(
        self, module: str, qualname: str, bases: list[str], names: list[str], hops: int
    ) -> Target | None:
        """``names`` inside the class ``qualname`` of ``module``: its own members first,
        then each base class in order."""
        if hops <= 0:
            return None
        if not names:
            return Target(module, qualname, "class")
        table = self.table(module)
        inner = f"{qualname}.{names[0]}"
        if table is not None and inner in table["names"]:
            return self._bound(module, inner, table["names"][inner], names[1:], hops - 1)
        for base in bases:
            found = self._lookup(module, base.split(".") + names, hops - 1)
            if found is not None:
                return found
        return None


def cache_file(root: Path) -> Path:
    """The cache of the tables of the package at ``root`` (Note [source table cache])."""
    key = hashlib.sha256(str(root.resolve()).encode("utf-8", "surrogateescape")).hexdigest()
    return cache_dir() / "pysource" / f"{root.name}.{key[:32]}.json"
