"""Builders: compile cpp/cuda solutions into a module whose entry symbol can be called.

Two bindings, as a Solution's ``spec.binding`` says:

- ``"torch"``: torch's C++ extension API (``torch.utils.cpp_extension.load``); the entry is
  exported with ``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`` and takes ``at::Tensor``.
- ``"tvm-ffi"``, or null (flashinfer-bench's default, how its own CUDA solutions are written):
  apache-tvm-ffi's ``tvm_ffi.cpp.build``; the entry is exported with
  ``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` and takes ``tvm::ffi::TensorView``, and torch tensors
  are passed to it through DLPack. apache-tvm-ffi is a pip package (``fibgen[tvm-ffi]``).

A build is keyed by a content hash of everything that changes its result: the sources, the
language, the binding, the entry point, the destination-passing flag (flashinfer-bench leaves
it out, so two solutions that differ only in it would share a build) and the torch it is
built against. Builds live in ``$FIBGEN_CACHE_DIR/builds/<hash>/`` (default
``~/.cache/fibgen``) and are made under a file lock, so processes that ask at once build once
and the others load the result. This module never imports the compiler, lark or jinja2.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import keyword
import os
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# Bump when the layout of a build folder or the flags change: older builds are then ignored.
_FORMAT = 2
BUILT_LANGUAGES = ("cpp", "cuda")
COMPILED_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".cuh", ".inc")
_DONE = "BUILT"  # written last: a folder without it is an interrupted build
# Lines of compiler output kept in a BuildError; the first errors are the ones that matter.
_MAX_LOG_LINES = 60

# Built modules by digest: Python extension modules (torch binding) or tvm-ffi modules.
_loaded: dict[str, Any] = {}
_loaded_lock = threading.Lock()
# Builds that failed to compile in this process, by digest: the compiler's output. torch's
# loader, asked again for a module of the same name and sources, skips the build and fails
# to open a library that is not there, so the compiler's own error is given again instead.
_failed: dict[str, str] = {}


class BuildError(RuntimeError):
    """Sources that did not compile or load; the message holds the compiler's own."""


def build_root() -> Path:
    """Where builds are kept: ``$FIBGEN_CACHE_DIR/builds`` or ``~/.cache/fibgen/builds``."""
    from fibgen.fsutil import cache_dir

    return cache_dir() / "builds"


def _torch_fingerprint() -> list[str]:
    import torch

    return [torch.__version__, str(torch.version.cuda)]


def _digest(payload: list[Any]) -> str:
    text = json.dumps([_FORMAT, *_torch_fingerprint(), *payload], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _compiler_log(text: str, folder: Path, shown: str = "") -> str:
    """The compiler's messages from a failed torch build, without ninja's command lines."""
    _, sep, output = text.partition(": ")
    return _clean_log(output if sep else text, folder, shown) or text


def _clean_log(text: str, folder: Path, shown: str = "") -> str:
    """Compiler output without ninja's framing; the build folder's files are named by their
    path relative to it, after ``shown`` (the user's folder of them, when there is one)."""
    lines, skip_command = [], False
    for line in text.splitlines():
        if skip_command:  # the line after FAILED: is the full command, long and unhelpful
            skip_command = False
            continue
        if line.startswith("FAILED:"):
            skip_command = True
            continue
        if re.match(r"\[\d+/\d+\] ", line) or line.startswith("ninja: "):
            continue
        if re.match(r"ninja exited with status \d+$", line) or line in ("stdout:", "stderr:"):
            continue  # tvm-ffi's framing of ninja's output
        lines.append(line.replace(f"{folder}{os.sep}", shown))
    if len(lines) > _MAX_LOG_LINES:
        lines = lines[:_MAX_LOG_LINES] + [f"... ({len(lines) - _MAX_LOG_LINES} more lines)"]
    return "\n".join(lines).strip()


def _import_extension(name: str, path: Path) -> ModuleType:
    import torch  # noqa: F401  (loads libtorch, which the extension links against)

    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _build(
    what: str,
    digest: str,
    files: dict[str, str],
    compiled: Sequence[str],
    include_dirs: Sequence[Path],
    cuda: bool,
    shown: str = "",
) -> tuple[ModuleType, bool]:
    """Build (or load) one extension; returns it and whether this call compiled it."""
    with _loaded_lock:
        if digest in _loaded:
            return _loaded[digest], False
        failed = _failed.get(digest)
    if failed is not None:
        folder = build_root() / digest
        raise BuildError(f"{what} failed to compile:\n{_compiler_log(failed, folder, shown)}")
    from filelock import FileLock

    name = f"fibgen_ext_{digest}"
    folder = build_root() / digest
    folder.parent.mkdir(parents=True, exist_ok=True)
    built = False
    with FileLock(str(folder) + ".lock"):
        if not (folder / _DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            for rel, text in files.items():
                path = folder / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            module = _compile(what, digest, folder, compiled, include_dirs, cuda, shown)
            (folder / _DONE).write_text(f"{name}.so\n", encoding="utf-8")
            built = True
        else:
            try:
                module = _import_extension(name, folder / f"{name}.so")
            except ImportError as exc:
                raise BuildError(f"{what} was built but does not load: {exc}") from None
    with _loaded_lock:
        module = _loaded.setdefault(digest, module)
    return module, built


def _compile(
    what: str,
    digest: str,
    folder: Path,
    compiled: Sequence[str],
    include_dirs: Sequence[Path],
    cuda: bool,
    shown: str = "",
) -> ModuleType:
    from torch.utils.cpp_extension import load

    name = f"fibgen_ext_{digest}"

    if not compiled:
        raise BuildError(f"{what} has no source to compile (one of {', '.join(COMPILED_SUFFIXES)})")
    try:
        return load(
            name=name,
            sources=[str(folder / rel) for rel in compiled],
            extra_include_paths=[str(folder)] + [str(p) for p in include_dirs],
            build_directory=str(folder),
            with_cuda=cuda,
            # torch's builder passes no optimization flag: host code would be built at -O0.
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"] if cuda else None,
            verbose=False,
        )
    except Exception as exc:  # torch reports a failed compile as a bare RuntimeError
        with _loaded_lock:
            _failed[digest] = str(exc)
        log = _compiler_log(str(exc), folder, shown)
        raise BuildError(f"{what} failed to compile:\n{log}") from None


def solution_digest(solution: Any) -> str:
    """The cache key of a Solution's build, destination-passing flag included."""
    spec = solution.spec
    return _digest(
        [
            spec.language,
            spec.binding,
            spec.entry_point,
            spec.destination_passing_style,
            sorted((s.path, s.content) for s in solution.sources),
        ]
    )


def build_solution(solution: Any, sources_at: str | None = None) -> tuple[Callable[..., Any], bool]:
    """Build a cpp/cuda Solution; return its entry symbol and whether this call compiled it.

    ``sources_at`` is the solution folder the sources are the files of: compiler messages
    name them there (Note [source names] in solutions.py), else by their paths in the JSON.
    """
    spec = solution.spec
    what = f"solution {solution.name!r}"
    if spec.language not in BUILT_LANGUAGES:
        raise BuildError(f"{what}: language {spec.language!r} is not built (only cpp and cuda)")
    entry_file, symbol = spec.entry_point.split("::")
    if not entry_file.endswith(COMPILED_SUFFIXES):
        raise BuildError(
            f"{what}: entry file {entry_file!r} is not a C++/CUDA source "
            f"({', '.join(COMPILED_SUFFIXES)})"
        )
    files = {s.path: s.content for s in solution.sources}
    compiled = sorted(p for p in files if p.endswith(COMPILED_SUFFIXES))
    digest = solution_digest(solution)
    cuda = spec.language == "cuda"
    if spec.binding != "torch" and os.environ.get("TVM_FFI_CUDA_ARCH_LIST"):
        # The architectures compiled for change the binary: a build of its own.
        digest = _digest([digest, os.environ["TVM_FFI_CUDA_ARCH_LIST"]])
    shown = f"{sources_at}{os.sep}" if sources_at else ""
    if spec.binding == "torch":
        module, built = _build(what, digest, files, compiled, (), cuda, shown)
        fn = getattr(module, symbol, None)
        exported = sorted(n for n in vars(module) if not n.startswith("_"))
        how = f"check m.def in {entry_file}"
    else:
        module, built = _build_tvm_ffi(what, digest, files, compiled, shown)
        fn = _tvm_ffi_function(module, symbol)
        exported = []
        how = f"export it with TVM_FFI_DLL_EXPORT_TYPED_FUNC({symbol}, ...) in {entry_file}"
    if not callable(fn):
        listed = f" (it exports {', '.join(exported) or 'nothing'})" if exported else ""
        raise BuildError(f"{what}: the built module exports no {symbol!r}{listed}; {how}")
    return fn, built


# ---------------------------------------------------------------------------------------
# tvm-ffi

_TVM_FFI_INSTALL = "pip install apache-tvm-ffi (or pip install 'fibgen[tvm-ffi]')"


def _tvm_ffi_function(module: Any, symbol: str) -> Any:
    try:
        return getattr(module, symbol)
    except AttributeError:
        return None


def _build_tvm_ffi(
    what: str, digest: str, files: dict[str, str], compiled: Sequence[str], shown: str = ""
) -> tuple[Any, bool]:
    """Build (or load) a tvm-ffi module; returns it and whether this call compiled it."""
    with _loaded_lock:
        if digest in _loaded:
            return _loaded[digest], False
    try:
        import tvm_ffi
    except ImportError:
        raise BuildError(
            f"{what} uses the tvm-ffi binding (the default when spec.binding is null), which "
            f"needs apache-tvm-ffi: {_TVM_FFI_INSTALL}"
        ) from None
    from filelock import FileLock

    if not compiled:
        raise BuildError(f"{what} has no source to compile (one of {', '.join(COMPILED_SUFFIXES)})")
    if any(p.endswith(".cu") for p in compiled) and shutil.which("nvcc") is None:
        raise BuildError(f"{what} has CUDA sources and no nvcc is on PATH to compile them")
    name = f"fibgen_tvm_{digest}"
    folder = build_root() / digest
    folder.parent.mkdir(parents=True, exist_ok=True)
    built = False
    with FileLock(str(folder) + ".lock"):
        library = folder / f"{name}.so"
        if not (folder / _DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            for rel, text in files.items():
                path = folder / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            try:
                library = Path(
                    tvm_ffi.cpp.build(
                        name=name,
                        cpp_files=[str(folder / p) for p in compiled if not p.endswith(".cu")],
                        cuda_files=[str(folder / p) for p in compiled if p.endswith(".cu")],
                        extra_include_paths=[str(folder)],
                        build_directory=str(folder),
                    )
                )
            except Exception as exc:  # tvm-ffi reports a failed compile as a RuntimeError
                log = _clean_log(str(exc), folder, shown) or str(exc)
                if "cannot find -lcudart" in log:
                    log += (
                        "\n= help: the linker did not find the CUDA runtime; set CUDA_HOME to "
                        "the CUDA toolkit's folder (the one holding bin/nvcc and lib64/)"
                    )
                if "TVM_FFI_CUDA_ARCH_LIST" in log:
                    log += (
                        "\n= help: no GPU is visible to pick the CUDA architecture from; set "
                        'TVM_FFI_CUDA_ARCH_LIST, for example to "9.0" for an H100'
                    )
                raise BuildError(f"{what} failed to compile:\n{log}") from None
            (folder / _DONE).write_text(f"{library.name}\n", encoding="utf-8")
            built = True
        else:
            library = folder / (folder / _DONE).read_text(encoding="utf-8").strip()
        try:
            module = tvm_ffi.load_module(str(library))
        except Exception as exc:
            raise BuildError(f"{what} was built but does not load: {exc}") from None
    with _loaded_lock:
        module = _loaded.setdefault(digest, module)
    return module, built


def build_extension(
    name: str,
    sources: Sequence[Path],
    *,
    include_dirs: Sequence[Path] = (),
    cuda: bool = True,
) -> ModuleType:
    """Build (or load from the cache) an extension from source files on disk."""
    files = {Path(p).name: Path(p).read_text(encoding="utf-8") for p in sources}
    # Headers are hashed by content, not by path, so a moved checkout reuses its builds.
    headers = [
        sorted(
            (h.name, h.read_text(encoding="utf-8"))
            for h in Path(d).iterdir()
            if h.suffix in HEADER_SUFFIXES and h.is_file()
        )
        for d in include_dirs
    ]
    payload = ["extension", name, cuda, sorted(files.items()), headers]
    module, _ = _build(
        f"extension {name!r}", _digest(payload), files, sorted(files), include_dirs, cuda
    )
    return module


def by_name(fn: Callable[..., Any], names: Sequence[str]) -> Callable[..., Any]:
    """Wrap an extension function so it takes ``names`` by keyword, and calls it positionally.

    The runtime calls solutions with the definition's tensors by keyword; an extension
    function exported without ``pybind11::arg`` names accepts them only by position.
    """
    if not all(n.isidentifier() and not keyword.iskeyword(n) for n in names) or len(
        set(names)
    ) != len(names):
        return fn
    params = ", ".join(names)
    namespace: dict[str, Any] = {"_fn": fn}
    exec(f"def run({params}):\n    return _fn({params})\n", namespace)
    run = namespace["run"]
    run.__doc__ = getattr(fn, "__doc__", None)
    return run


def is_built(solution: Any) -> bool:
    """Whether a cpp/cuda Solution's build is in the cache, so that loading it compiles
    nothing (bench says when a first call is about to compile)."""
    digest = solution_digest(solution)
    if solution.spec.binding != "torch" and os.environ.get("TVM_FFI_CUDA_ARCH_LIST"):
        digest = _digest([digest, os.environ["TVM_FFI_CUDA_ARCH_LIST"]])  # as build_solution
    return (build_root() / digest / _DONE).is_file()
