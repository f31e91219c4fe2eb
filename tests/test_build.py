"""`fibgen build`, `check`, `fmt`, `import`, `list` through the real CLI, and the writer."""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from _shared import DATASET_DIR
from fibgen.cli import main
from fibgen.codegen.files import GeneratedFile
from fibgen.codegen.writer import MANIFEST, WriteError, write_files

ROOT = Path(__file__).resolve().parents[1]

RMSNORM = """\
family rmsnorm {
  op_type rmsnorm
  axes {
    batch_size  : var
    hidden_size : const h
  }
  inputs {
    x : bfloat16[batch_size, hidden_size]
  }
  outputs {
    y : bfloat16[batch_size, hidden_size]
  }
  reference \"\"\"
    def run(x):
        return x
  \"\"\"
  instances {
    h=2048
    h=4096
  }
}
"""


def cli(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse usage errors
                code = exc.code
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "norm.fidef").write_text(RMSNORM)
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_build_writes_definitions_and_is_byte_identical(project: Path):
    code, out, err = cli("build", "defs", "-o", "gen", cwd=project)
    assert code == 0, err
    first = snapshot(project / "gen")
    assert "definitions/rmsnorm/rmsnorm_h2048.json" in first
    data = json.loads(first["definitions/rmsnorm/rmsnorm_h4096.json"])
    assert data["axes"]["hidden_size"] == {"type": "const", "value": 4096}
    # A second build changes nothing, not even modification times.
    mtimes = {p: (project / "gen" / p).stat().st_mtime_ns for p in first}
    code, out, _ = cli("build", "defs", "-o", "gen", cwd=project)
    assert code == 0 and "is up to date" in out
    assert snapshot(project / "gen") == first
    assert {p: (project / "gen" / p).stat().st_mtime_ns for p in first} == mtimes


def test_hand_edited_output_is_detected_and_restored(project: Path):
    cli("build", "defs", "-o", "gen", cwd=project)
    target = project / "gen" / "definitions" / "rmsnorm" / "rmsnorm_h2048.json"
    original = target.read_text()
    target.write_text(original.replace("2048", "2049"))
    code, out, err = cli("build", "defs", "-o", "gen", "--check", cwd=project)
    assert code == 1 and "rmsnorm_h2048.json" in out
    code, out, _ = cli("build", "defs", "-o", "gen", cwd=project)
    assert code == 0 and "1 written" in out
    assert target.read_text() == original


def test_build_from_another_folder_is_identical(project: Path, tmp_path_factory):
    cli("build", "defs", "-o", "gen", cwd=project)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    cli("build", str(project / "defs"), "-o", str(elsewhere / "gen"), cwd=elsewhere)
    assert snapshot(elsewhere / "gen") == snapshot(project / "gen")


def test_check_reports_stale_output_with_a_diff_and_writes_nothing(project: Path):
    cli("build", "defs", "-o", "gen", cwd=project)
    src = project / "defs" / "norm.fidef"
    src.write_text(RMSNORM.replace("h=4096", "h=8192"))
    before = snapshot(project / "gen")
    code, out, err = cli("build", "defs", "-o", "gen", "--check", cwd=project)
    assert code == 1
    assert "+++ b/definitions/rmsnorm/rmsnorm_h8192.json" in out
    assert "--- a/definitions/rmsnorm/rmsnorm_h4096.json" in out
    assert "is stale" in err
    assert snapshot(project / "gen") == before


def test_removed_definitions_are_deleted_but_foreign_files_kept(project: Path):
    cli("build", "defs", "-o", "gen", cwd=project)
    foreign = project / "gen" / "definitions" / "rmsnorm" / "mine.txt"
    foreign.write_text("not generated")
    (project / "defs" / "norm.fidef").write_text(RMSNORM.replace("    h=4096\n", ""))
    code, out, _ = cli("build", "defs", "-o", "gen", cwd=project)
    assert code == 0 and ", 0 removed" not in out
    assert not (project / "gen/definitions/rmsnorm/rmsnorm_h4096.json").exists()
    assert foreign.read_text() == "not generated"
    manifest = (project / "gen" / MANIFEST).read_text()
    assert "rmsnorm_h4096" not in manifest and "rmsnorm_h2048" in manifest


def test_errors_write_nothing(project: Path):
    (project / "defs" / "bad.fidef").write_text(
        "family x {\n  op_type y\n  axes { n : bogus }\n}\n"
    )
    code, out, err = cli("build", "defs", "-o", "gen", cwd=project)
    assert code == 1
    assert "defs/bad.fidef:3:" in err
    assert not (project / "gen").exists()


@pytest.mark.parametrize(
    "case",
    [
        "variants_indistinguishable",
        "variants_rule_reads_no_argument",
        "variants_rule_holds_for_every_size",
    ],
)
def test_build_reports_families_of_one_api_that_nothing_tells_apart(case: str, tmp_path: Path):
    # The same diagnostics as `fibgen check` (tests/fixtures/diagnostics), and nothing written.
    root = Path(__file__).resolve().parents[1]
    fixture = f"tests/fixtures/diagnostics/{case}.fidef"
    code, _, err = cli("build", fixture, "-o", str(tmp_path / "gen"), cwd=root)
    assert code == 1
    assert err == (root / f"tests/fixtures/diagnostics/{case}.expected").read_text()
    assert not (tmp_path / "gen").exists()


def test_writer_refuses_duplicate_and_escaping_paths(tmp_path: Path):
    with pytest.raises(WriteError, match="share the path"):
        write_files(tmp_path, [GeneratedFile("a.txt", "1", "x"), GeneratedFile("a.txt", "2", "y")])
    with pytest.raises(WriteError, match="outside"):
        write_files(tmp_path, [GeneratedFile("../a.txt", "1", "x")])
    assert list(tmp_path.iterdir()) == []


def test_writer_leaves_no_temporary_files(tmp_path: Path):
    write_files(tmp_path, [GeneratedFile(f"d/f{i}.txt", str(i), "") for i in range(5)])
    names = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert names == [f"f{i}.txt" for i in range(5)]


def test_command_line_mistakes_exit_2_without_traceback():
    code, _, err = cli("build")
    assert code == 2 and "Traceback" not in err
    code, _, err = cli("frobnicate")
    assert code == 2 and "invalid choice" in err


def test_missing_input_path(tmp_path: Path):
    code, _, err = cli("check", str(tmp_path / "nope"))
    assert code == 1 and "no such file or directory" in err


def test_list_shows_name_op_type_and_location(project: Path):
    code, out, _ = cli("list", "defs", cwd=project)
    assert code == 0
    assert out.splitlines()[0].split() == ["rmsnorm_h2048", "rmsnorm", "defs/norm.fidef:18"]


@pytest.mark.slow
def test_list_without_a_folder_lists_the_built_in_catalogue_from_anywhere(tmp_path: Path):
    # Outside a checkout there is no ./definitions: the catalogue installed with fibgen is it.
    code, out, err = cli("list", cwd=tmp_path)
    assert code == 0, err
    names = [line.split()[0] for line in out.splitlines()]
    assert "rmsnorm_h4096" in names and len(names) > 100


def test_fmt_check_and_rewrite(project: Path):
    messy = RMSNORM.replace("    h=2048\n", "    h = 2048   # small\n")
    (project / "defs" / "norm.fidef").write_text(messy)
    code, out, err = cli("fmt", "--check", "defs", cwd=project)
    assert code == 1 and "not formatted" in err
    assert (project / "defs" / "norm.fidef").read_text() == messy
    code, _, _ = cli("fmt", "defs", cwd=project)
    assert code == 0
    formatted = (project / "defs" / "norm.fidef").read_text()
    assert "h=2048  # small" in formatted
    assert cli("fmt", "--check", "defs", cwd=project)[0] == 0


def test_fmt_refuses_files_with_errors(project: Path):
    bad = "family x {\n  op_type y\n  axes { n : }\n}\n"
    (project / "defs" / "norm.fidef").write_text(bad)
    code, _, err = cli("fmt", "defs", cwd=project)
    assert code == 1 and "defs/norm.fidef:3:" in err
    assert (project / "defs" / "norm.fidef").read_text() == bad


@pytest.mark.slow
def test_catalogue_is_formatted_and_generated_is_current():
    code, _, err = cli("fmt", "--check", "definitions", cwd=ROOT)
    assert code == 0, err
    code, out, err = cli("build", "definitions/", "--check", cwd=ROOT)
    assert code == 0, out + err


def test_the_committed_manifest_records_the_current_generator():
    # `build --check` compares the generated files and ignores the `# inputs:` digest of the
    # manifest (it only lets a build with unchanged inputs skip the work). The digest covers
    # the generator's own code, so a change there that leaves every generated file as it is
    # still changes it: unless it is rebuilt, `fibgen build definitions/` in a fresh clone
    # rewrites the manifest and leaves the clone modified.
    from fibgen.codegen.writer import inputs_digest, read_manifest
    from fibgen.compiler import discover, read_source

    found, problems = discover([str(ROOT / "definitions")])
    assert found and not problems
    digest = inputs_digest(
        [(item.stable, read_source(item.path)) for item in found], "package=fibgen_kernels"
    )
    assert read_manifest(ROOT / "generated").inputs == digest, (
        "generated/.fibgen-manifest records another generator: run `fibgen build definitions/` "
        "and commit it"
    )


@pytest.mark.slow
def test_catalogue_builds_without_warnings():
    code, _, err = cli("check", "definitions", cwd=ROOT)
    assert code == 0
    assert "warning" not in err, err


def test_import_refuses_to_overwrite_and_bad_json(tmp_path: Path):
    good = {
        "name": "rmsnorm_h8",
        "op_type": "rmsnorm",
        "axes": {"n": {"type": "var"}, "hidden_size": {"type": "const", "value": 8}},
        "inputs": {"x": {"shape": ["n", "hidden_size"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n", "hidden_size"], "dtype": "float32"}},
        "reference": "def run(x):\n    return x",
    }
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.json").write_text(json.dumps(good))
    code, out, err = cli("import", str(src), "-o", str(tmp_path / "out"))
    assert code == 0, err
    text = (tmp_path / "out" / "rmsnorm.fidef").read_text()
    assert "hidden_size : const h" in text
    code, _, err = cli("import", str(src), "-o", str(tmp_path / "out"))
    assert code == 1 and "--force" in err
    (src / "b.json").write_text('{"name": "x",')
    code, _, err = cli("import", str(src), "-o", str(tmp_path / "out2"))
    assert code == 1 and "b.json:1:" in err
    assert not (tmp_path / "out2").exists()


@pytest.mark.slow
def test_import_rebuilds_the_whole_dataset(tmp_path: Path):
    """Acceptance: import then build reproduces all 156 definitions semantically."""
    if not DATASET_DIR.is_dir():
        pytest.skip(f"the flashinfer-trace dataset is not at {DATASET_DIR} (a user's checkout)")
    from fibgen.format.jsonio import load_definition, semantic_equal

    code, out, err = cli("import", str(DATASET_DIR / "definitions"), "-o", str(tmp_path / "fidef"))
    assert code == 0, err
    n_families = int(out.split(" as ")[1].split()[0])
    assert 12 <= n_families < 156
    code, _, err = cli("build", str(tmp_path / "fidef"), "-o", str(tmp_path / "gen"))
    assert code == 0, err
    sources = sorted((DATASET_DIR / "definitions").rglob("*.json"))
    assert len(sources) == 156
    for src in sources:
        original = load_definition(src)
        built = tmp_path / "gen" / "definitions" / original.op_type / f"{original.name}.json"
        assert semantic_equal(load_definition(built), original), src.name
        assert load_definition(built).reference == original.reference
    assert cli("fmt", "--check", str(tmp_path / "fidef"))[0] == 0
    # Every dispatcher module (one per family, and the package's __init__), and samples of the
    # files that come from one template each.
    assert assert_black_clean(tmp_path / "gen") > n_families


@pytest.mark.parametrize(
    "package, why",
    [
        ("not-a-name", "is not a Python identifier"),
        ("import", "is a Python keyword"),
        ("json", "would hide the module `json`"),
        ("fibgen", "would hide the module `fibgen`"),
    ],
)
def test_bad_package_name_is_a_command_line_error_and_writes_nothing(
    project: Path, package: str, why: str
):
    code, _, err = cli("build", "defs", "-o", "gen", "--package", package, cwd=project)
    assert code == 2
    assert f"argument --package: {package!r} {why}" in err and "Traceback" not in err
    assert not (project / "gen").exists()


def test_the_library_refuses_the_same_package_names(project: Path):
    from fibgen.codegen import generate
    from fibgen.codegen.errors import GenerateError
    from fibgen.compiler import compile_paths

    module = compile_paths([str(project / "defs")]).module
    with pytest.raises(GenerateError, match="'import' is a Python keyword"):
        generate(module, package="import")


def test_a_folder_of_ones_own_builds_a_package_named_after_it(project: Path):
    """`fibgen_kernels` is the catalogue's: another folder's package must not hide it."""
    (project / "my-defs").mkdir()
    (project / "my-defs" / "norm.fidef").write_text(RMSNORM)
    code, out, err = cli("build", "my-defs", "-o", "gen", cwd=project)
    assert code == 0, err
    assert "dispatchers in package my_defs_kernels (gen/python/my_defs_kernels/)" in out
    assert sorted(p.name for p in (project / "gen" / "python").iterdir()) == ["my_defs_kernels"]
    init = (project / "gen" / "python" / "my_defs_kernels" / "__init__.py").read_text()
    # The package index names what it was made from: this folder, not "the catalogue".
    assert init.startswith("# @generated by fibgen from my-defs/ — do not edit\n")
    assert "catalogue" not in init
    # A single file names the package after itself.
    code, out, err = cli("build", "defs/norm.fidef", "-o", "gen2", cwd=project)
    assert code == 0, err
    assert (project / "gen2" / "python" / "norm_kernels" / "__init__.py").is_file()


def test_the_catalogue_keeps_fibgen_kernels_from_anywhere(tmp_path: Path):
    from fibgen.codegen.python.packages import default_package

    assert default_package([str(ROOT / "definitions")]) == "fibgen_kernels"
    # A copy of the catalogue's sources elsewhere is a folder of one's own.
    assert default_package([str(tmp_path / "definitions")]) == "definitions_kernels"
    assert default_package([str(tmp_path / "2024 defs")]) == "fidef_2024_defs_kernels"
    header = (ROOT / "generated" / "python" / "fibgen_kernels" / "__init__.py").read_text()
    assert header.startswith("# @generated by fibgen from definitions/ — do not edit\n")


@pytest.mark.parametrize("command", ["check", "list", "fmt", "build"])
def test_a_folder_without_fidef_files_is_an_error_not_zero_definitions(command, tmp_path):
    (tmp_path / "empty").mkdir()
    code, out, err = cli(command, str(tmp_path / "empty"))
    assert code == 1
    assert err == f"error: no .fidef files in {tmp_path / 'empty'}\n"
    assert out == ""
    # A dataset (JSON definitions) is named as such.
    (tmp_path / "ds" / "definitions").mkdir(parents=True)
    code, _, err = cli(command, str(tmp_path / "ds"))
    assert code == 1 and "`fibgen validate` checks a dataset" in err


def assert_black_clean(out: Path) -> int:
    """Every generated Python file under `out` is as black writes it; returns how many."""
    import black

    mode = black.Mode(line_length=100)
    checked = 0
    seen: dict[tuple[str, ...], int] = {}
    for path in sorted(out.rglob("*.py")):
        kind = path.relative_to(out).parts[:-1]
        if kind[:1] == ("reference",):
            continue  # references are kept as written
        if kind[:1] in (("cuda",), ("tests",)):
            # One per definition (per family for tests), all from one template: every 16th
            # is enough to catch a template that black would rewrite (black takes a minute
            # over all of them).
            seen[kind[:1]] = seen.get(kind[:1], -1) + 1
            if seen[kind[:1]] % 16:
                continue
        body = path.read_text().split("\n", 2)[2]  # after the two header lines
        assert black.format_str(body, mode=mode) == body, path
        checked += 1
    return checked


@pytest.mark.slow
def test_generated_python_is_black_formatted():
    """Emitters write most of black's format themselves; black must find nothing to change."""
    assert assert_black_clean(ROOT / "generated") > 100


@pytest.mark.slow
def test_generated_definitions_are_what_the_format_model_writes():
    """Each generated definition loads with the format's model and re-dumps to the same bytes."""
    from fibgen.format.jsonio import dump_definition, load_definition

    paths = sorted((ROOT / "generated" / "definitions").glob("*/*.json"))
    assert len(paths) > 150
    for path in paths:
        assert dump_definition(load_definition(path)) == path.read_text(), path


def test_check_fails_on_a_manifest_another_build_wrote_and_a_build_mends_it(project: Path):
    # A change to the generator alone leaves every file as it was but not the manifest's
    # digest: `build` would rewrite the manifest, so `--check` must call it stale.
    cli("build", "defs", "-o", "gen", cwd=project)
    manifest = project / "gen" / MANIFEST
    text = manifest.read_text()
    stale = "".join(
        "# inputs: " + "0" * 64 + "\n" if line.startswith("# inputs: ") else line
        for line in text.splitlines(True)
    )
    assert stale != text
    manifest.write_text(stale)
    code, out, err = cli("build", "defs", "-o", "gen", "--check", cwd=project)
    assert code == 1, out + err
    assert f"+++ b/{MANIFEST}" in out and "digest is another build's" in out
    assert "is stale" in err
    assert manifest.read_text() == stale  # --check writes nothing
    assert cli("build", "defs", "-o", "gen", cwd=project)[0] == 0
    assert manifest.read_text() == text
    assert cli("build", "defs", "-o", "gen", "--check", cwd=project)[0] == 0
