"""Where the shared reference material (the flashinfer-trace dataset, schemas) lives for tests,
and checks several test files share (``foreign_files``: what a dataset holds that its layout
has no place for; ``without_modules``: a subprocess in which a package seems not installed;
``strided``: a strided view of a tensor's values).

``FIBGEN_SHARED`` overrides the default, which is the ``shared`` directory beside the
repository checkout. Tests that need it call ``require_shared()`` and are skipped without it.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

SHARED_DIR: Path = Path(
    os.environ.get("FIBGEN_SHARED") or Path(__file__).resolve().parents[1].parent / "shared"
)
DATASET_DIR: Path = SHARED_DIR / "flashinfer-trace"
SCHEMAS_DIR: Path = SHARED_DIR / "reference" / "schemas"
ROOT: Path = Path(__file__).resolve().parents[1]


@functools.cache
def catalogue_module():
    """The built-in catalogue (``definitions/``) compiled once per test process: a dozen test
    files read it, several to a worker, at about 5 s a compile."""
    from fibgen.compiler import compile_paths

    result = compile_paths([str(ROOT / "definitions")])
    if not result.ok:
        messages = "\n".join(str(d) for d in result.diagnostics)
        pytest.fail(f"the catalogue does not compile:\n{messages}")
    return result.module


def require_shared(*parts: str) -> Path:
    """Return ``SHARED_DIR/parts``, or skip the calling test when it does not exist."""
    path = SHARED_DIR.joinpath(*parts)
    if not path.exists():
        pytest.skip(
            f"shared reference material not found at {path}; "
            "set FIBGEN_SHARED to the directory holding flashinfer-trace/ and reference/"
        )
    return path


# .ci/run sets this: there, a check that needs an optional package fails instead of skipping.
REQUIRE_OPTIONAL = os.environ.get("FIBGEN_REQUIRE_OPTIONAL") == "1"

FLASHINFER_BENCH_INSTALL = (
    "pip install --no-deps flashinfer-bench==0.1.2 && pip install apache-tvm-ffi docstring-parser"
)


def require_module(name: str, why: str):
    """Import ``name``; the calling test is skipped without it, or fails under CI."""
    if REQUIRE_OPTIONAL:
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=why)


def require_flashinfer_bench():
    """flashinfer-bench 0.1.2's module (see ``require_module``)."""
    return require_module(
        "flashinfer_bench",
        f"flashinfer-bench 0.1.2 is not installed ({FLASHINFER_BENCH_INSTALL})",
    )


# A sitecustomize that hides modules from every Python process started with its folder on
# PYTHONPATH (bench's workers too): they import as if they were not installed.
_HIDE = """\
import sys
from importlib.machinery import PathFinder


class _Hidden(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in {names!r}:
            return None
        return PathFinder.find_spec(name, path, target)


sys.meta_path[:] = [_Hidden if f is PathFinder else f for f in sys.meta_path]
"""


def without_modules(folder: Path, *names: str) -> dict[str, str]:
    """The environment of a subprocess in which ``names`` are not installed, seemingly."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_HIDE.format(names=names), encoding="utf-8")
    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(folder), str(repo), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


# Where FlashInfer-Bench's readers and writers put each file of a dataset (COMPAT.md,
# "Dataset layout"), and fibgen's one addition: the `.fibgen` sidecar beside a definition,
# which flashinfer-bench ignores.
_LAYOUT = (
    r"definitions/[^/]+/[^/]+\.json",
    r"definitions/[^/]+/[^/]+\.fibgen",
    r"solutions/[^/]+/[^/]+/[^/]+/[^/]+\.json",
    r"workloads/[^/]+/[^/]+\.jsonl",
    r"traces/([^/]+/){0,2}[^/]+\.jsonl",
    r"blob/workloads/[^/]+/(?P<d>[^/]+)/(?P=d)_[^/]+\.safetensors",
)


def foreign_files(root: Path) -> list[str]:
    """Every file under ``root`` that the dataset layout has no place for."""
    import re

    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_dir() and not path.is_symlink():
            continue
        if not any(re.fullmatch(pattern, rel) for pattern in _LAYOUT):
            found.append(rel)
    return found


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t``, every other element of the last dimension of a wider tensor:
    a strided view (not contiguous) for the rules that refuse one."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    view = wide[..., ::2]
    assert not view.is_contiguous()
    return view


def python_solution(
    name: str,
    definition: str,
    source: str,
    *,
    dps: bool = False,
    hardware: tuple[str, ...] = ("cpu",),
    author: str = "tester",
) -> dict:
    """A Solution JSON of one Python file, ``main.py``, whose ``run`` is the entry point."""
    return {
        "name": name,
        "definition": definition,
        "author": author,
        "spec": {
            "language": "python",
            "target_hardware": list(hardware),
            "entry_point": "main.py::run",
            "destination_passing_style": dps,
        },
        "sources": [{"path": "main.py", "content": source}],
    }


def run_applied(solutions: Any, run: Callable[[], Any]) -> tuple[Any, dict]:
    """``run()`` with apply on over ``solutions``, and ``stats()`` after it; what enabling and
    disabling say (tables, solutions never matched) is not this helper's caller's concern."""
    import fibgen.runtime as rt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(solutions)
    try:
        result = run()
        counts = rt.stats()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rt.disable_apply()
    return result, counts


def generated_package(root: Path, source: str, package: str, *extra: str) -> list[Any]:
    """Compile one `.fidef` text, write its dispatchers under ``root/python/<package>``, and
    import the modules named in ``extra`` (``"pkg.module"``, or a module written beside them
    first); returns them in order."""
    from fibgen.codegen.python.dispatch.emit import emit_python_dispatch
    from fibgen.compiler import compile_sources

    result = compile_sources([("t.fidef", "t.fidef", source)])
    assert result.module is not None, [str(d) for d in result.diagnostics]
    for f in emit_python_dispatch(result.module, package):
        (root / f.path).parent.mkdir(parents=True, exist_ok=True)
        (root / f.path).write_text(f.text)
    sys.path.insert(0, str(root / "python"))
    try:
        return [importlib.import_module(name) for name in extra]
    finally:
        sys.path.remove(str(root / "python"))
