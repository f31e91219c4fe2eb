"""Every API entry point FlashInfer 0.7.2.post1 traces is routed by the catalogue, declared
unroutable with its reason, or named on the list of those still to cover.

The entry points are read from the installed package's source as FlashInfer registers them
(``fibgen.format.fi_apis``); what the catalogue says of each is counted when the test runs
(``fibgen.compiler.coverage``), so that a family added anywhere counts at once. The list of
entry points still to cover (``tests/flashinfer_pending.txt``) only shrinks: a line for an entry
point that is now routed or declared fails, as does an entry point on no list.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _shared import require_module

# Slow as a whole: reads every entry point FlashInfer traces from its source.
pytestmark = pytest.mark.slow

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

from fibgen.compiler import compile_paths  # noqa: E402
from fibgen.compiler.coverage import Coverage, api_coverage  # noqa: E402
from fibgen.compiler.diagnostics import render_all  # noqa: E402
from fibgen.format.fi_apis import TracedApis, traced_apis  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PENDING = ROOT / "tests" / "flashinfer_pending.txt"
VERSION = "0.7.2.post1"


def read_pending(path: Path = PENDING) -> list[tuple[int, str]]:
    """(line number, entry point) of each line of the pending list that is not a comment."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if text:
            found.append((number, text))
    return found


@pytest.fixture(scope="module")
def entry_points() -> TracedApis:
    apis = traced_apis()
    if apis.version != VERSION:
        pytest.skip(f"the pending list is of flashinfer {VERSION}; {apis.version} is installed")
    return apis


@pytest.fixture(scope="module")
def coverage(entry_points: TracedApis) -> Coverage:
    # Compiled with FlashInfer's source at hand, so that every `unroutable` path is checked
    # against the package, as `fibgen check` does.
    result = compile_paths([str(ROOT / "definitions")], lambda: entry_points)
    assert result.module is not None, render_all(result.diagnostics, result.sources)
    # Nor a warning: every `api` and `plan` path names something FlashInfer defines (each
    # wrapper's plan has no trace template, and is not warned about).
    assert result.diagnostics == [], render_all(result.diagnostics, result.sources)
    return api_coverage(result.module, entry_points)


def test_flashinfer_0_7_2_post1_traces_213_entry_points(entry_points):
    assert entry_points.unreadable == ()
    assert len(entry_points) == 213
    assert len({a.path for a in entry_points}) == 213
    # Both registering decorators count, methods as well as functions.
    paths = {a.path for a in entry_points}
    assert "flashinfer.norm.rmsnorm" in paths
    assert "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.plan" in paths
    assert any(a.experimental for a in entry_points)


def test_every_traced_entry_point_is_routed_declared_or_pending(coverage):
    pending = {path for _, path in read_pending()}
    uncovered = [e.api.path for e in coverage.with_status("missing") if e.api.path not in pending]
    assert not uncovered, (
        "traced entry points of flashinfer that are neither routed, declared `unroutable` "
        f"nor named in {PENDING.name}: {uncovered}"
    )


def test_the_pending_list_names_only_entry_points_still_to_cover(coverage, entry_points):
    status = {e.api.path: e.status for e in coverage.entries}
    problems = []
    seen: dict[str, int] = {}
    for number, path in read_pending():
        where = f"{PENDING.name}:{number}: {path}"
        if path in seen:
            problems.append(f"{where}: repeats line {seen[path]}")
        seen.setdefault(path, number)
        if path not in status:
            found = entry_points.lookup(path)
            if found.api is None:
                problems.append(f"{where}: {found.problem}")
            else:  # a re-export: one spelling a line, FlashInfer's, as the listing shows
                problems.append(f"{where}: write FlashInfer's name for it, `{found.api.path}`")
        elif status[path] != "missing":
            problems.append(f"{where}: is {status[path]} now; remove its line")
    assert not problems, "\n".join(problems)


def test_no_entry_point_is_both_routed_and_declared(coverage):
    assert coverage.with_status("both") == ()
    assert coverage.unknown == ()


def test_the_counts_add_up_to_every_traced_entry_point(coverage):
    counts = coverage.counts()
    pending = read_pending()
    assert counts["missing"] == len(pending)
    assert counts["routed"] + counts["unroutable"] + len(pending) == len(coverage.entries)
    # Every declaration gives its reason; every routed one names its definitions.
    assert all(e.unroutable.reason.strip() for e in coverage.with_status("unroutable"))
    assert all(e.definitions for e in coverage.with_status("routed"))


def test_the_pending_list_is_read_as_it_is_written(tmp_path):
    listing = tmp_path / "pending.txt"
    listing.write_text("# heading\n\nflashinfer.a.b  # why\n  flashinfer.c\n", encoding="utf-8")
    assert read_pending(listing) == [(3, "flashinfer.a.b"), (4, "flashinfer.c")]


def test_list_apis_shows_the_same_status_for_each(coverage, capsys):
    from fibgen.cli import main

    assert main(["list", "--apis", str(ROOT / "definitions")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"flashinfer {VERSION} traces 213 API entry points (")
    rows = {line.split()[0]: line for line in out[1:214]}
    assert list(rows) == [e.api.path for e in coverage.entries]
    words = {
        "routed": "routed: ",
        "unroutable": "unroutable: ",
        "missing": "NOT YET COVERED: neither routed nor declared unroutable",
    }
    for e in coverage.entries:
        assert words[e.status] in rows[e.api.path], rows[e.api.path]
    rmsnorm = rows["flashinfer.norm.rmsnorm"].split()
    assert rmsnorm[1] == "rmsnorm"  # the op type of its template
    assert "routed: rmsnorm (" in rows["flashinfer.norm.rmsnorm"]  # the family spells it so
    # Defined in one module, re-exported by another that the family spells: both are said.
    assert "routed: cutlass_fused_moe as flashinfer.fused_moe.cutlass_fused_moe (" in (
        rows["flashinfer.fused_moe.core.cutlass_fused_moe"]
    )
    assert out[-1] == coverage.summary()
