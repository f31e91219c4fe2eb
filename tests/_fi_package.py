"""A small package laid out as FlashInfer is, for the tests of what fibgen reads of its source
(``fibgen.format.fi_apis``) and of the `unroutable` declarations checked against it."""

from __future__ import annotations

import textwrap
from pathlib import Path

FILES = {
    "__init__.py": """
        from .norm import rmsnorm as rmsnorm
        from .comm import *
        from . import attention
    """,
    "api_logging.py": """
        _TRACE_FI_API_ALIASES = {
            "flashinfer.attention._impl.Wrapper.run": "flashinfer.attention.Wrapper.run",
        }

        def flashinfer_api(func=None, *, trace=None):
            return func

        def flashinfer_experimental_api(func=None, *, trace=None, feature=None):
            return func
    """,
    "templates.py": """
        rmsnorm_trace = object()
        run_trace = object()
    """,
    "norm.py": """
        from .api_logging import flashinfer_api
        from .templates import rmsnorm_trace
        import something_else as other

        @flashinfer_api(trace=rmsnorm_trace)
        def rmsnorm(x, w, eps=1e-6):
            def inner():
                @flashinfer_api(trace=rmsnorm_trace)  # not reachable by a path
                def nested(): ...
            return x

        @flashinfer_api
        def untraced(x):
            return x

        @flashinfer_api(trace=None)
        def traced_with_none(x):
            return x

        @other.flashinfer_api(trace=rmsnorm_trace)  # another package's decorator
        def foreign(x):
            return x

        def plain(x):
            return x
    """,
    "comm/__init__.py": """
        from .allreduce import allreduce_fusion
        from .allreduce import _private_helper
        __all__ = ["allreduce_fusion"]
    """,
    "comm/allreduce.py": """
        try:
            from ..api_logging import flashinfer_api
            from ..templates import rmsnorm_trace as allreduce_trace
        except ImportError:
            def flashinfer_api(func=None, *, trace=None):  # the stand-in of a failed import
                return func

        @flashinfer_api(trace=allreduce_trace)
        def allreduce_fusion(x):
            return x

        def _private_helper():
            pass
    """,
    "attention/__init__.py": """
        from ._impl import *
    """,
    "attention/_impl.py": """
        from ..api_logging import flashinfer_experimental_api as experimental
        from .. import templates

        class Wrapper:
            @experimental(trace=templates.run_trace)
            def run(self, q):
                return q

            def plan(self, n):
                pass

            begin_forward = plan

        class Graph(Wrapper):
            pass
    """,
    "local_decorator.py": """
        def flashinfer_api(func=None, *, trace=None):  # its own, which registers nothing
            return func

        @flashinfer_api(trace=1)
        def looks_traced(x):
            return x
    """,
}


def make_package(root: Path, files: dict[str, str] = FILES) -> Path:
    """Write a package called flashinfer under ``root``; return its folder."""
    package = root / "flashinfer"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return package
