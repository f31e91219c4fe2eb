"""`unroutable` declarations and the coverage of FlashInfer's traced entry points: what a
module says of each (``fibgen.compiler.coverage``), the checks of declarations against a
package's source, the canonical form, and `fibgen list --apis`.

A small package laid out as FlashInfer is (``_fi_package``) stands in for the real one, so
that every status can be made; the diagnostics against the installed FlashInfer 0.7.2.post1
are in ``tests/fixtures/diagnostics/unroutable_mistakes.fidef``, its coverage in
``tests/test_flashinfer_coverage.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from _fi_package import make_package

from fibgen.cli import main
from fibgen.compiler import compile_sources
from fibgen.compiler.coverage import Route, api_coverage, route_text
from fibgen.format import fi_apis
from fibgen.format.fi_apis import FlashInferUnavailable, TracedApis
from fibgen.format.fi_source import PackageSource, cache_file

FAMILIES = """
family norm_a {
  op_type rmsnorm
  api flashinfer.rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None)

  rules {
    ignore eps "a test family"
    ignore out "a test family"
    ignore enable_pdl "a test family"
  }

  axes {
    n : var
  }

  inputs {
    input  : float32[n]
    weight : float32[n]
  }

  outputs {
    y : float32[n]
  }
}

family gone {
  op_type gone
  api flashinfer.norm.untraced(x)

  axes {
    n : var
  }

  inputs {
    x : float32[n]
  }

  outputs {
    y : float32[n]
  }
}
"""


@pytest.fixture
def apis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TracedApis:
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))
    root = make_package(tmp_path / "site")
    return TracedApis(PackageSource(root, "flashinfer", cache=cache_file(root)), "9.9")


def compile_text(text: str, apis: TracedApis | None):
    entry_points = None if apis is None else (lambda: apis)
    return compile_sources([("t.fidef", "t.fidef", textwrap.dedent(text))], entry_points)


def messages(result) -> list[str]:
    return [d.message for d in result.diagnostics]


def test_each_entry_point_is_routed_declared_or_missing(apis):
    # Compiled without the package at hand: paths are compared as written, so a declaration
    # that spells a routed entry point another way is not caught here, and shows as both.
    result = compile_text(
        FAMILIES + """
        unroutable flashinfer.comm.allreduce_fusion "a collective over several ranks"
        unroutable flashinfer.norm.rmsnorm "declared and routed at once"
        unroutable flashinfer.norm.nothing "names no entry point"
        """,
        None,
    )
    assert result.module is not None, messages(result)
    coverage = api_coverage(result.module, apis)
    status = {e.api.path: e.status for e in coverage.entries}
    assert status == {
        "flashinfer.attention.Wrapper.run": "missing",
        "flashinfer.comm.allreduce.allreduce_fusion": "unroutable",
        "flashinfer.norm.rmsnorm": "both",
    }
    rmsnorm = coverage.entries[2]
    assert [(r.family, r.keyword, r.path) for r in rmsnorm.routes] == [
        ("norm_a", "api", "flashinfer.rmsnorm")
    ]
    assert rmsnorm.definitions == ("norm_a",)
    assert coverage.entries[1].unroutable.reason == "a collective over several ranks"
    # What names no traced entry point is said, not dropped.
    assert [r.family for r in coverage.untraced] == ["gone"]
    assert [u.path for u in coverage.unknown] == ["flashinfer.norm.nothing"]
    assert coverage.counts() == {"routed": 0, "unroutable": 1, "both": 1, "missing": 1}
    assert coverage.summary() == (
        "routed 1 of 3, declared unroutable 2, not yet covered 1; "
        "1 both routed and declared unroutable"
    )


def test_declarations_are_checked_against_the_package_source(apis):
    result = compile_text(
        FAMILIES + """
        unroutable flashinfer.norm.rmsnorm "routed by norm_a under its re-export"
        unroutable flashinfer.allreduce_fusion "reached through a star import"
        unroutable flashinfer.comm.allreduce.allreduce_fusion "the same entry point again"
        unroutable flashinfer.norm.untraced "no trace template"
        unroutable flashinfer.attention.Graph.run "inherited: Wrapper.run"
        unroutable flashinfer.norm.rmsnrom "misspelt"
        """,
        apis,
    )
    assert result.module is None
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert [d.message for d in errors] == [
        "`flashinfer.norm.rmsnorm` is routed by family `norm_a`",
        "`flashinfer.comm.allreduce.allreduce_fusion` is declared unroutable twice",
        "`flashinfer.norm.untraced` is not a traced entry point of flashinfer 9.9",
        "`flashinfer.norm.rmsnrom` is not a traced entry point of flashinfer 9.9",
    ]
    helps = [d.help for d in errors]
    assert "as `flashinfer.allreduce_fusion`" in helps[1]
    assert "has no `@flashinfer_api(trace=...)`" in helps[2]
    assert helps[3].endswith("did you mean `flashinfer.norm.rmsnorm`?")


def test_declarations_need_a_reason_and_a_flashinfer_path(apis):
    result = compile_text(
        """
        unroutable flashinfer.comm.allreduce_fusion "   "
        unroutable torch.mm "not FlashInfer's"
        """,
        apis,
    )
    assert messages(result) == [
        "`unroutable flashinfer.comm.allreduce_fusion` gives no reason",
        "`torch.mm` is not an entry point of FlashInfer",
    ]
    # The path is pointed at, not the whole line.
    assert (result.diagnostics[1].span.line, result.diagnostics[1].span.column) == (3, 12)


def test_the_package_source_is_read_only_where_something_names_flashinfer(apis):
    asked = []

    def entry_points():
        asked.append(1)
        return apis

    elsewhere = FAMILIES.replace("api flashinfer.", "api mylib.")
    result = compile_sources([("t.fidef", "t.fidef", elsewhere)], entry_points)
    assert result.module is not None and asked == [] and not result.diagnostics
    result = compile_sources([("t.fidef", "t.fidef", FAMILIES)], entry_points)
    assert result.module is not None and asked == [1]


def test_a_family_path_that_names_nothing_flashinfer_defines_is_warned_about(apis):
    # apply leaves such a path unpatched; `check` says so first. A function without a trace
    # template (`gone`'s flashinfer.norm.untraced, every wrapper's plan) is routable: silent.
    result = compile_text(
        FAMILIES.replace("api flashinfer.rmsnorm(", "api flashinfer.rmsnrm("), apis
    )
    assert result.module is not None  # a warning: the rest of the module is sound
    (warning,) = result.diagnostics
    assert warning.severity == "warning"
    assert warning.message == (
        "family `norm_a`'s `api` path `flashinfer.rmsnrm` names nothing flashinfer 9.9 defines"
    )
    assert warning.help == "did you mean `flashinfer.norm.rmsnorm`?"
    assert (warning.span.line, warning.span.column) == (4, 3)
    assert compile_text(FAMILIES, apis).diagnostics == []


def test_declarations_keep_their_paragraphs_in_canonical_form(tmp_path):
    source = tmp_path / "unroutable.fidef"
    source.write_text(
        "# Collectives\n"
        'unroutable flashinfer.comm.allreduce_fusion    "a collective"\n'
        'unroutable flashinfer.comm.x "another"  # the second\n'
        "\n\n"
        "# Plans\n"
        "\n"
        "# only plans\n"
        'unroutable flashinfer.cake_vsa.plan_cake_vsa "plans only"\n',
        encoding="utf-8",
    )
    assert main(["fmt", str(source)]) == 0
    assert source.read_text(encoding="utf-8") == (
        "# Collectives\n"
        'unroutable flashinfer.comm.allreduce_fusion "a collective"\n'
        'unroutable flashinfer.comm.x "another"  # the second\n'
        "\n"
        "# Plans\n"
        "\n"
        "# only plans\n"
        'unroutable flashinfer.cake_vsa.plan_cake_vsa "plans only"\n'
    )
    assert main(["fmt", "--check", str(source)]) == 0


def test_list_apis_shows_every_traced_entry_point_and_its_status(
    apis, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(fi_apis, "traced_apis", lambda *a, **k: apis)
    # The templates of the small package are no TraceTemplates: their op types are unknown.
    monkeypatch.setattr(TracedApis, "op_types", lambda self, api: ("op_" + api.qualname,))
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "t.fidef").write_text(
        FAMILIES + '\nunroutable flashinfer.comm.allreduce_fusion "a collective"\n',
        encoding="utf-8",
    )
    assert main(["list", "--apis", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"flashinfer 9.9 traces 3 API entry points ({apis.source.root})"
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in out[1:4]}
    assert rows == {
        "flashinfer.attention.Wrapper.run": [
            "op_Wrapper.run",
            "NOT YET COVERED: neither routed nor declared unroutable",
        ],
        "flashinfer.comm.allreduce.allreduce_fusion": [
            "op_allreduce_fusion",
            "unroutable: a collective",
        ],
        # The family spells the package's re-export.
        "flashinfer.norm.rmsnorm": [
            "op_rmsnorm",
            "routed: norm_a as flashinfer.rmsnorm (1 definition)",
        ],
    }
    assert out[4] == (
        "note: family `gone` routes `flashinfer.norm.untraced` (api), which flashinfer 9.9 "
        "does not trace"
    )
    assert out[-1] == "routed 1 of 3, declared unroutable 1, not yet covered 1"


@pytest.fixture
def without_flashinfer(tmp_path, monkeypatch) -> Path:
    """A folder of FAMILIES, compiled as where FlashInfer is not installed."""

    def unavailable(*args, **kwargs):
        raise FlashInferUnavailable("flashinfer is not installed (pip install ...)")

    monkeypatch.setattr(fi_apis, "traced_apis", unavailable)
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "t.fidef").write_text(FAMILIES, encoding="utf-8")
    return folder


def test_list_apis_without_flashinfer_says_why(without_flashinfer, capsys):
    folder = without_flashinfer
    assert main(["list", "--apis", str(folder)]) == 2  # an optional package is missing
    err = capsys.readouterr().err
    assert "error: --apis lists FlashInfer's traced entry points" in err
    assert err.count("flashinfer is not installed") == 1  # said once, by the error
    assert "`fibgen list --by-definition`" in err
    # The two views are one or the other.
    with pytest.raises(SystemExit) as exit_:
        main(["list", "--apis", "--by-definition", str(folder)])
    assert exit_.value.code == 2
    assert "not allowed with argument --apis" in capsys.readouterr().err
    # The view by definition needs no FlashInfer.
    assert main(["list", "--by-definition", str(folder)]) == 0
    assert "norm_a" in capsys.readouterr().out


def test_list_apis_says_which_modules_it_could_not_read(apis, tmp_path, monkeypatch, capsys):
    broken = apis.source.root / "broken.py"
    broken.write_text(
        "from .api_logging import flashinfer_api\n@flashinfer_api(trace=t)\ndef f(:\n"
    )
    unreadable = TracedApis(PackageSource(apis.source.root, "flashinfer"), "9.9")
    monkeypatch.setattr(fi_apis, "traced_apis", lambda *a, **k: unreadable)
    monkeypatch.setattr(TracedApis, "op_types", lambda self, api: ("op",))
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "t.fidef").write_text(FAMILIES, encoding="utf-8")
    assert main(["list", "--apis", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    (line,) = [x for x in out if x.startswith("warning:")]
    assert line.startswith("warning: flashinfer.broken cannot be read (SyntaxError: ")
    assert line.endswith("): its traced entry points are not listed")


def test_a_family_that_routes_a_re_export_is_listed_with_the_path_it_spells():
    # --apis names FlashInfer's defining module; --by-definition the family's path. Where
    # they differ the entry point's line says both, so the two listings can be joined.
    routes = [
        Route("batch_attention_run", "api", "flashinfer.attention.BatchAttention.run", ("a",)),
        Route("batch_attention_plan", "plan", "flashinfer.attention._core.BatchAttention.plan", ()),
    ]
    assert route_text(routes, "flashinfer.attention._core.BatchAttention.plan") == (
        "batch_attention_run as flashinfer.attention.BatchAttention.run, "
        "plan of batch_attention_plan"
    )
    assert route_text(routes) == "batch_attention_run, plan of batch_attention_plan"


def test_without_flashinfer_check_notes_only_the_declarations_it_could_not_check(
    without_flashinfer, capsys
):
    folder = without_flashinfer
    # Families that name FlashInfer paths, no declaration: nothing went unchecked to say.
    assert main(["check", str(folder)]) == 0
    assert capsys.readouterr().err == ""
    (folder / "u.fidef").write_text(
        'unroutable flashinfer.comm.allreduce_fusion "a collective"\n', encoding="utf-8"
    )
    assert main(["check", str(folder)]) == 0
    assert capsys.readouterr().err == (
        "note: the paths of `unroutable` declarations were checked only against each other "
        "and the families, not against FlashInfer: flashinfer is not installed (pip install ...)\n"
    )
