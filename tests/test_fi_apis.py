"""FlashInfer's traced entry points, found from its source as FlashInfer registers them.

A small package laid out as FlashInfer is (a registry module defining the two decorators,
re-exports, classes, fallbacks) is read by ``fibgen.format.fi_apis``: what counts as a traced
entry point, what a path resolves to, and the cache of parsed modules. The real package's 213
are pinned in ``tests/test_flashinfer_coverage.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _fi_package import make_package

from fibgen.format import fi_source
from fibgen.format.fi_apis import FlashInferUnavailable, TracedApis, traced_apis
from fibgen.format.fi_source import PackageSource, cache_file


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    return make_package(tmp_path / "site")


def apis_of(root: Path) -> TracedApis:
    return TracedApis(PackageSource(root, "flashinfer", cache=cache_file(root)), "9.9")


def test_the_entry_points_are_the_functions_the_registering_decorators_trace(package):
    apis = apis_of(package)
    assert [(a.path, a.decorator, a.trace) for a in apis] == [
        (
            "flashinfer.attention.Wrapper.run",  # FlashInfer's alias of its defining module
            "flashinfer_experimental_api",
            "templates.run_trace",
        ),
        ("flashinfer.comm.allreduce.allreduce_fusion", "flashinfer_api", "allreduce_trace"),
        ("flashinfer.norm.rmsnorm", "flashinfer_api", "rmsnorm_trace"),
    ]
    run = apis.apis[0]
    assert run.defined == "flashinfer.attention._impl.Wrapper.run"
    assert run.experimental and not apis.apis[1].experimental
    assert apis.unreadable == ()


@pytest.mark.parametrize(
    "path, entry",
    [
        ("flashinfer.rmsnorm", "flashinfer.norm.rmsnorm"),  # a re-export
        ("flashinfer.norm.rmsnorm", "flashinfer.norm.rmsnorm"),
        ("flashinfer.allreduce_fusion", "flashinfer.comm.allreduce.allreduce_fusion"),  # via *
        ("flashinfer.comm.allreduce_fusion", "flashinfer.comm.allreduce.allreduce_fusion"),
        ("flashinfer.attention.Wrapper.run", "flashinfer.attention.Wrapper.run"),  # via *
        ("flashinfer.attention._impl.Wrapper.run", "flashinfer.attention.Wrapper.run"),
        ("flashinfer.attention.Graph.run", "flashinfer.attention.Wrapper.run"),  # inherited
    ],
)
def test_a_path_that_reaches_the_function_names_its_entry_point(package, path, entry):
    found = apis_of(package).lookup(path)
    assert found.problem is None
    assert found.api.path == entry


@pytest.mark.parametrize(
    "path, problem",
    [
        ("torch.mm", "is not in the package `flashinfer`"),
        ("flashinfer.norm.rmsnrom", "names nothing that flashinfer 9.9 defines"),
        ("flashinfer.attention.Wrapper", "is a class of flashinfer, not a function"),
        (
            "flashinfer.attention.Wrapper.begin_forward",
            "is a function without a trace template (`flashinfer.attention._impl.Wrapper.plan` "
            "has no `@flashinfer_api(trace=...)`)",
        ),
        ("flashinfer.norm.untraced", "is a function without a trace template"),
        ("flashinfer.norm.foreign", "is a function without a trace template"),
        ("flashinfer.local_decorator.looks_traced", "is a function without a trace template"),
        # `__all__` of comm does not export it, so `*` does not bring it to the top.
        ("flashinfer._private_helper", "names nothing"),
    ],
)
def test_a_path_that_names_no_traced_entry_point_says_why(package, path, problem):
    found = apis_of(package).lookup(path)
    assert found.api is None
    assert found.problem.startswith(problem)


def test_a_misspelt_path_gets_the_closest_entry_points(package):
    apis = apis_of(package)
    assert apis.closest("flashinfer.norm.rmsnrom") == ["flashinfer.norm.rmsnorm"]
    # A re-export spells another module: matched by its last name.
    assert apis.closest("flashinfer.x.allreduce_fusion") == [
        "flashinfer.comm.allreduce.allreduce_fusion"
    ]


def test_a_module_that_cannot_be_parsed_is_said_not_skipped(package):
    (package / "broken.py").write_text(
        "from .api_logging import flashinfer_api\n@flashinfer_api(trace=t)\ndef f(:\n"
    )
    apis = apis_of(package)
    assert [m for m, _ in apis.unreadable] == ["flashinfer.broken"]
    assert "SyntaxError" in apis.unreadable[0][1]


def test_a_package_without_the_registry_is_refused(package):
    (package / "api_logging.py").write_text("def something_else(): pass\n")
    with pytest.raises(FlashInferUnavailable, match="does not know how this FlashInfer"):
        apis_of(package)


def test_traced_apis_refuses_a_folder_that_is_no_package(tmp_path):
    with pytest.raises(FlashInferUnavailable, match="not a Python package"):
        traced_apis(tmp_path, version="1")


def test_parsed_modules_are_cached_until_their_file_changes(package, monkeypatch):
    first = [a.path for a in apis_of(package)]
    assert cache_file(package).is_file()

    def no_parsing(*args, **kwargs):
        raise AssertionError("a module was parsed although its table is cached")

    monkeypatch.setattr(fi_source, "module_table", no_parsing)
    assert [a.path for a in apis_of(package)] == first
    # A changed file is read again, and what it now says counts.
    monkeypatch.undo()
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(cache_file(package).parents[1]))
    norm = package / "norm.py"
    norm.write_text(norm.read_text().replace("def rmsnorm(", "def rms_norm("))
    assert "flashinfer.norm.rms_norm" in [a.path for a in apis_of(package)]


def test_an_unreadable_cache_is_ignored(package):
    cache_file(package).parent.mkdir(parents=True, exist_ok=True)
    cache_file(package).write_text("{not json")
    assert len(apis_of(package)) == 3
